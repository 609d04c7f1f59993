"""DeBERTa-v2 and -v3: post-norm encoders (as BERT) with disentangled attention.

DebertaV2Model keeps its layers in `encoder.layer`; each has `attention.self.{query,key,value}_proj`,
`attention.output.{dense,LayerNorm}`, `intermediate.dense` and `output.{dense,LayerNorm}`. Besides the content
scores q_i.k_j, head h adds position scores read from one table of relative-distance embeddings that all layers
share (`encoder.rel_embeddings`, layer-normed by `encoder.LayerNorm` when `norm_rel_ebd` says so):

    c2p: q_i . pk_(i-j)     pk = rel_embeddings @ W_pk   (the layer's `pos_key_proj`, or its `key_proj` when
    p2c: k_j . pq_(j-i)     pq = rel_embeddings @ W_pq    `share_att_key`; `pos_query_proj` or `query_proj`)

`pos_att_type` says which of the two a model has (v3: both, and `share_att_key`). W_pk and W_pq have their rows
grouped per head as W_q and W_k do, so pruning a head removes its rows of every one of them
(`LayerNames.head_rows`; with `share_att_key` they are W_q and W_k themselves). The head's size, and so the
scale sqrt(dh * (1 + number of position terms)), does not change; `num_attention_heads` and `all_head_size` do.
Ablating a head (zeroing its columns of W_o) removes its position terms with it: they only shape its attention.

The fused engine does not carry the position terms yet (docs/adapters.md, "DeBERTa: what fusion needs"), so this
adapter refuses fusion (`fusion_unsupported`). Pruning, MLP-neuron pruning, Taylor head scores and circuit search
with `method="reference"` work, as they run the HF model. `ConvLayer` (`conv_kernel_size` > 0, v2-xlarge), which
runs after layer 0, is left whole.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Adapter, Inputs, LayerNames, ModelSpec


def _first_token(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return hidden[:, 0]  # (B, d): DebertaV2Model has no pooler; `Adapter.output` reads the first token


def _classifier(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return model.classifier(model.dropout(model.pooler(hidden)))  # ContextPooler reads the [CLS] token -> (B, C)


class DebertaV2Adapter(Adapter):
    name = "deberta_v2"
    norm_position = "post"
    layer_names = LayerNames(
        query="attention.self.query_proj",
        key="attention.self.key_proj",
        value="attention.self.value_proj",
        output="attention.output.dense",
        norm1="attention.output.LayerNorm",
        norm2="output.LayerNorm",
        mlp_in="intermediate.dense",
        mlp_out="output.dense",
        activation="intermediate.intermediate_act_fn",
        attention="attention.self",
        head_count_attrs=("num_attention_heads",),
        width_attrs=("all_head_size",),
        head_rows=("attention.self.pos_key_proj", "attention.self.pos_query_proj"),  # absent with share_att_key
    )
    layers_path = "encoder.layer"
    # the relative-distance table is read by every layer: like MPNet's position bias, it goes with the embeddings
    embedding_paths = ("embeddings", "encoder.rel_embeddings", "encoder.LayerNorm")
    input_names = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
    required_inputs = ("input_ids",)
    fusion_unsupported = (
        "DeBERTa's disentangled attention (its c2p and p2c position scores) is not in the fused engine yet; "
        "prune, score and evaluate the members as HF models (circuit search: method='reference')"
    )
    specs = {
        "DebertaV2Model": ModelSpec(backbone="", head=_first_token, classifier=False, head_tokens=1),
        "DebertaV2ForSequenceClassification": ModelSpec(
            backbone="deberta", head=_classifier, classifier=True, head_tokens=1
        ),
    }

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        """As DebertaV2Model: the embeddings are zeroed at padded positions (`mask`)."""
        ids = inputs["input_ids"]
        padding = inputs.get("attention_mask")
        return backbone.embeddings(
            input_ids=ids,
            token_type_ids=inputs.get("token_type_ids"),
            position_ids=inputs.get("position_ids"),
            mask=torch.ones_like(ids) if padding is None else padding,
        )  # (B, T, d)
