"""MPNet: a post-norm encoder like BERT, plus a relative position bias that all layers share.

MPNetModel keeps its layers in `encoder.layer`; each has `attention.attn.{q,k,v,o}`, `attention.LayerNorm`,
`intermediate.dense` and `output.{dense,LayerNorm}`. The encoder owns one `relative_attention_bias`
(an embedding of 32 relative-distance buckets -> one value per head), turns it into a (B, H, T, T) bias once
per forward and adds that same tensor to every layer's attention scores.

So a layer that lost heads must read only its kept heads' planes of the shared bias: pruning swaps the layer's
self-attention for a `PrunedMPNetSelfAttention`, which holds the original indices of its kept heads. The fused
engine carries the bias the same way (`attention_bias`: one plane per original head, gathered per member and
layer). The all-mpnet-base-v2 checkpoint (see `hydra_ensembles.bench.pretrained`) is an MPNetModel.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import torch
from torch import Tensor, nn

from .base import Adapter, Inputs, LayerNames, ModelSpec


def _pooled(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    """MPNetModel's pooler_output: tanh(W h_<s> + b), or the <s> hidden state when built without a pooler."""
    return model.pooler(hidden) if model.pooler is not None else hidden[:, 0]  # (B, d)


def _classifier(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return model.classifier(hidden)  # MPNetClassificationHead reads the <s> token itself -> (B, C)


class _KeptHeadsBias:
    """MPNet self-attention after head pruning: it adds only its kept heads' planes of the shared position bias.

    `kept_heads` (a plain list: no tensor to place or save) holds the original indices of the heads this layer
    keeps; the pruning structure map sets it again when a pruned model is loaded.
    """

    kept_heads: list[int]

    def forward(self, hidden_states, attention_mask=None, position_bias=None, output_attentions=False, **kwargs):
        if position_bias is not None:
            position_bias = position_bias[:, self.kept_heads]  # (B, H, T, T) -> (B, kept, T, T)
        return super().forward(hidden_states, attention_mask, position_bias, output_attentions, **kwargs)


@cache
def pruned_attention_class(attention_class: type[nn.Module]) -> type[nn.Module]:
    """`attention_class` (HF's MPNetSelfAttention or a subclass) with `_KeptHeadsBias`'s forward, made once per
    class: built on first use, so importing hydra-ensembles does not load HF's MPNet modeling code."""
    if issubclass(attention_class, _KeptHeadsBias):
        return attention_class
    name = f"Pruned{attention_class.__name__}"
    return type(name, (_KeptHeadsBias, attention_class), {"__module__": __name__, "__qualname__": name})


def __getattr__(name: str) -> type[nn.Module]:
    """`PrunedMPNetSelfAttention`, for pickle and for imports by name (made on first access, as above)."""
    if name == "PrunedMPNetSelfAttention":
        from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention

        return pruned_attention_class(MPNetSelfAttention)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class MPNetAdapter(Adapter):
    name = "mpnet"
    norm_position = "post"
    layer_names = LayerNames(
        query="attention.attn.q",
        key="attention.attn.k",
        value="attention.attn.v",
        output="attention.attn.o",
        norm1="attention.LayerNorm",
        norm2="output.LayerNorm",
        mlp_in="intermediate.dense",
        mlp_out="output.dense",
        activation="intermediate.intermediate_act_fn",
        attention="attention.attn",
        head_count_attrs=("num_attention_heads",),
        width_attrs=("all_head_size",),
    )
    layers_path = "encoder.layer"
    # the position bias is computed before the first layer and shared by all: it belongs with the embeddings
    embedding_paths = ("embeddings", "encoder.relative_attention_bias")
    input_names = ("input_ids", "attention_mask", "position_ids")
    required_inputs = ("input_ids",)
    specs = {
        "MPNetModel": ModelSpec(backbone="", head=_pooled, classifier=False, head_tokens=1),
        "MPNetForSequenceClassification": ModelSpec(backbone="mpnet", head=_classifier, classifier=True, head_tokens=1),
    }

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        return backbone.embeddings(input_ids=inputs["input_ids"], position_ids=inputs.get("position_ids"))

    def attention_bias(self, backbone: nn.Module, seq_len: int) -> Tensor:
        """The relative position bias every layer adds to its scores, (H, T, T), as `MPNetEncoder` computes it
        (from token positions 0..T-1; like HF, it ignores `position_ids`)."""
        encoder = backbone.encoder
        positions = torch.arange(seq_len, device=encoder.relative_attention_bias.weight.device)
        relative = positions[None, :] - positions[:, None]  # (T, T): key position - query position
        buckets = encoder.relative_position_bucket(relative, num_buckets=32)  # 32 as in compute_position_bias
        return encoder.relative_attention_bias(buckets).permute(2, 0, 1)  # (T, T, H) -> (H, T, T)

    def set_projections(
        self,
        layer: nn.Module,
        projections: tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear],
        num_heads: int,
        kept: Sequence[int] | None = None,
    ) -> None:
        if kept is None or len(kept) not in (0, num_heads):  # each head reads its own plane of the shared bias
            raise ValueError(
                f"MPNet's set_projections needs `kept`, the original index of each of the {num_heads} heads kept "
                f"(empty for a placeholder head), got {kept!r}."
            )
        super().set_projections(layer, projections, num_heads, kept)
        attention = layer.get_submodule(self.layer_names.attention)
        attention.__class__ = pruned_attention_class(type(attention))
        heads = list(kept) if kept else [0]  # a placeholder head (all-zero weights) reads any plane: it adds 0
        attention.kept_heads = heads
