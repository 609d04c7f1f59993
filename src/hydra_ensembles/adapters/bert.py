"""BERT and the RoBERTa family: post-norm encoders (attention -> residual -> LN, MLP -> residual -> LN).

BertModel / RobertaModel keep their layers in `encoder.layer`; each layer has `attention.self.{query,key,value}`,
`attention.output.{dense,LayerNorm}`, `intermediate.dense` and `output.{dense,LayerNorm}`. The packaged
all-MiniLM-L6-v2 is a BertModel. XLM-RoBERTa and CamemBERT are RoBERTa with other vocabularies, Data2Vec-Text
RoBERTa trained otherwise: their own classes in transformers v5, the same modules and names.
"""

from __future__ import annotations

from torch import Tensor, nn

from .base import Adapter, Inputs, LayerNames, ModelSpec


def _pooled(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    """BertModel's pooler_output: tanh(W h_CLS + b), or the CLS hidden state when built without a pooler."""
    return model.pooler(hidden) if model.pooler is not None else hidden[:, 0]  # (B, d)


def _bert_classifier(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return model.classifier(model.dropout(model.bert.pooler(hidden)))  # (B, C)


def _roberta_classifier(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return model.classifier(hidden)  # RobertaClassificationHead reads the <s> token itself -> (B, C)


def _roberta_like(prefix: str, backbone: str) -> dict[str, ModelSpec]:
    """The encoder and the sequence classifier of a family with RoBERTa's modules: `<prefix>Model` and
    `<prefix>ForSequenceClassification`, whose encoder sits at `backbone`."""
    return {
        f"{prefix}Model": ModelSpec(backbone="", head=_pooled, classifier=False, head_tokens=1),
        f"{prefix}ForSequenceClassification": ModelSpec(
            backbone=backbone, head=_roberta_classifier, classifier=True, head_tokens=1
        ),
    }


class BertAdapter(Adapter):
    name = "bert"
    norm_position = "post"
    layer_names = LayerNames(
        query="attention.self.query",
        key="attention.self.key",
        value="attention.self.value",
        output="attention.output.dense",
        norm1="attention.output.LayerNorm",
        norm2="output.LayerNorm",
        mlp_in="intermediate.dense",
        mlp_out="output.dense",
        activation="intermediate.intermediate_act_fn",
        attention="attention.self",
        head_count_attrs=("num_attention_heads",),
        width_attrs=("all_head_size",),
    )
    layers_path = "encoder.layer"
    embedding_paths = ("embeddings",)
    input_names = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
    required_inputs = ("input_ids",)
    specs = {
        "BertModel": ModelSpec(backbone="", head=_pooled, classifier=False, head_tokens=1),
        "BertForSequenceClassification": ModelSpec(
            backbone="bert", head=_bert_classifier, classifier=True, head_tokens=1
        ),
        **_roberta_like("Roberta", "roberta"),
        **_roberta_like("XLMRoberta", "roberta"),
        **_roberta_like("Camembert", "roberta"),
        **_roberta_like("Data2VecText", "data2vec_text"),
    }

    def fusion_unsupported(self, model: nn.Module) -> str | None:
        if getattr(self.config(model), "is_decoder", False):  # HF then masks self-attention causally
            return (
                "its config has is_decoder=True, so HF runs its self-attention causally, and the fused engine runs "
                "this family as a bidirectional encoder"
            )
        return None

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        return backbone.embeddings(
            input_ids=inputs["input_ids"],
            token_type_ids=inputs.get("token_type_ids"),
            position_ids=inputs.get("position_ids"),
        )  # (B, T, d)
