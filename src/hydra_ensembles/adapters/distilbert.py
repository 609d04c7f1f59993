"""DistilBERT: a post-norm encoder like BERT with its own names (`attention.{q,k,v,out}_lin`, `ffn.lin{1,2}`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Adapter, Inputs, LayerNames, ModelSpec


def _cls_token(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return hidden[:, 0]  # DistilBertModel has no pooler: the [CLS] hidden state, (B, d)


def _classifier(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    pooled = torch.relu(model.pre_classifier(hidden[:, 0]))  # (B, d)
    return model.classifier(model.dropout(pooled))  # (B, C)


class DistilBertAdapter(Adapter):
    name = "distilbert"
    norm_position = "post"
    layer_names = LayerNames(
        query="attention.q_lin",
        key="attention.k_lin",
        value="attention.v_lin",
        output="attention.out_lin",
        norm1="sa_layer_norm",
        norm2="output_layer_norm",
        mlp_in="ffn.lin1",
        mlp_out="ffn.lin2",
        activation="ffn.activation",
        attention="attention",
        head_count_attrs=("n_heads",),
    )
    layers_path = "transformer.layer"
    embedding_paths = ("embeddings",)
    input_names = ("input_ids", "attention_mask", "position_ids")
    required_inputs = ("input_ids",)
    specs = {
        "DistilBertModel": ModelSpec(backbone="", head=_cls_token, classifier=False, head_tokens=1),
        "DistilBertForSequenceClassification": ModelSpec(
            backbone="distilbert", head=_classifier, classifier=True, head_tokens=1
        ),
    }

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        return backbone.embeddings(inputs["input_ids"], None, inputs.get("position_ids"))  # (B, T, d)
