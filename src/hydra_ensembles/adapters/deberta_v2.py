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

The fused engine carries both terms: `layer_attention` hands every layer the normed distance table and
`_disentangled_scores`, and each fused head projects the table through its own rows of W_pq and W_pk (kept in the
fused layer beside its q, k, v rows) or, with `share_att_key`, of W_q and W_k (docs/adapters.md, "DeBERTa:
fusion"). v2-xlarge's `ConvLayer` (`conv_kernel_size` > 0: a convolution over layer 0's input, mixed into its
output) goes with layer 0 (`layer_block`): fused layer 0 carries it, and training counts it as part of layer 0.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from .base import Adapter, Block, InputConv, Inputs, LayerAttention, LayerNames, ModelSpec

CONV_PATH = "encoder.conv"  # v2-xlarge's ConvLayer, relative to the backbone


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
    head_dim_field = "attention_head_size"
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

    def layer_block(self, model: nn.Module, index: int) -> Block:
        """Layer `index`'s block; layer 0's with the encoder's `ConvLayer` (v2-xlarge), which HF runs on layer 0's
        input and mixes into its output."""
        block = super().layer_block(model, index)
        conv = self.backbone(model).encoder.conv
        if index != 0 or conv is None:
            return block
        from transformers.activations import ACT2FN  # here, not at import: it loads HF's modeling stack (~1 s)

        block.input_conv = InputConv(conv.conv, conv.LayerNorm, ACT2FN[conv.conv_act], CONV_PATH)
        return block

    def locate(self, model: nn.Module, parameter: str) -> tuple[str, int | None]:
        """As `Adapter.locate`, the `ConvLayer` in layer 0 (where fusion keeps it)."""
        if parameter.startswith(self.full_path(model, CONV_PATH) + "."):
            return "layer", 0
        return super().locate(model, parameter)

    def scaling(self, model: nn.Module) -> float:
        """1 / sqrt(dh * (1 + number of position terms)), as HF scales content and position scores alike."""
        return (self.head_dim(model) * (1 + len(_position_terms(self.config(model))))) ** -0.5

    def layer_attention(self, backbone: nn.Module, inputs: Inputs, seq_len: int) -> list[LayerAttention]:
        """Every layer: the padding mask and, with relative attention, the normed distance table (2S, d) and the
        scores of `_disentangled_scores` for T = seq_len tokens."""
        config = backbone.config
        mask = self.attention_mask(inputs, seq_len)  # (B, 1, 1, T) or None
        terms = _position_terms(config)
        if not (config.relative_attention and terms):
            return [LayerAttention(mask)] * config.num_hidden_layers
        from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position  # as ACT2FN

        encoder = backbone.encoder
        span = encoder.position_buckets if encoder.position_buckets > 0 else encoder.max_relative_positions  # S
        tokens = encoder.rel_embeddings.weight.new_empty(seq_len, 0)  # build_relative_position reads T only
        relative = build_relative_position(tokens, tokens, encoder.position_buckets, encoder.max_relative_positions)
        scores = partial(
            _disentangled_scores,
            c2p=(relative[0] + span).clamp(0, 2 * span - 1) if "c2p" in terms else None,
            p2c=(span - relative[0]).clamp(0, 2 * span - 1) if "p2c" in terms else None,
            scale=(self.head_dim(backbone) * (1 + len(terms))) ** 0.5,
        )
        table = encoder.get_rel_embedding()[: 2 * span]  # (2S, d)
        attention = LayerAttention(mask, positions=table, score_bias=scores, position_blocks=_position_blocks(config))
        return [attention] * config.num_hidden_layers


def _position_blocks(config) -> tuple[int | None, int | None]:
    """Which per-head projections of a fused layer (0 q, 1 k, 2 v, 3... the `head_rows` a layer has: pos_key_proj,
    pos_query_proj) make pos_q and pos_k: W_q and W_k with `share_att_key`, else the layer's own."""
    if config.share_att_key:
        return 0, 1
    own = [name for name in ("c2p", "p2c") if name in _position_terms(config)]  # pos_key_proj for c2p first
    return (3 + own.index("p2c") if "p2c" in own else None), (3 if "c2p" in own else None)


def _position_terms(config) -> list[str]:
    return [term for term in ("c2p", "p2c") if term in (config.pos_att_type or [])]


def _disentangled_scores(
    q: Tensor, k: Tensor, pos_q: Tensor, pos_k: Tensor, *, c2p: Tensor | None, p2c: Tensor | None, scale: float
) -> Tensor:
    """HF's `disentangled_attention_bias` per head: c2p[i, j] = q_i . pos_k[c2p(i, j)] and p2c[i, j] =
    k_j . pos_q[p2c(j, i)], each divided by `scale`. q, k (..., H, T, dh); pos_q, pos_k (..., H, 2S, dh)
    (broadcastable); c2p, p2c: (T, T) bucket indices into the table, or None where the model lacks the term.
    Returns (..., H, T, T)."""
    scores = 0
    if c2p is not None:
        by_bucket = q @ pos_k.transpose(-1, -2)  # (..., H, T, 2S)
        scores = scores + by_bucket.gather(-1, c2p.expand(*by_bucket.shape[:-1], c2p.shape[-1])) / scale
    if p2c is not None:
        by_bucket = k @ pos_q.transpose(-1, -2)  # (..., H, T, 2S)
        gathered = by_bucket.gather(-1, p2c.expand(*by_bucket.shape[:-1], p2c.shape[-1]))
        scores = scores + gathered.transpose(-1, -2) / scale
    return scores
