"""ELECTRA (the discriminator): BERT's layers after an embedding block that may be narrower than the layers.

ElectraModel keeps BERT's module names (`encoder.layer`, `attention.self.{query,key,value}`, ...). When
`embedding_size` differs from `hidden_size` (electra-small: 128 -> 256) a linear `embeddings_project` maps the
embeddings up before layer 0; when they are equal (electra-base, -large) the model has no such module. ElectraModel
has no pooler (its prediction is the first token's last hidden state); the classifier reads the first token too.
"""

from __future__ import annotations

from torch import Tensor, nn

from .base import Inputs, ModelSpec
from .bert import BertAdapter


def _first_token(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return hidden[:, 0]  # (B, d), what `Adapter.output` reads from a model without a pooler


def _classifier(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return model.classifier(hidden)  # ElectraClassificationHead reads the first token itself -> (B, C)


class ElectraAdapter(BertAdapter):
    name = "electra"
    embedding_paths = ("embeddings", "embeddings_project")
    specs = {
        "ElectraModel": ModelSpec(backbone="", head=_first_token, classifier=False, head_tokens=1),
        "ElectraForSequenceClassification": ModelSpec(
            backbone="electra", head=_classifier, classifier=True, head_tokens=1
        ),
    }

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        hidden = super().embed(backbone, inputs)  # (B, T, embedding_size)
        project = getattr(backbone, "embeddings_project", None)
        return hidden if project is None else project(hidden)  # (B, T, d)
