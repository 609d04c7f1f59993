"""ModernBERT: a pre-norm encoder with a fused qkv projection, rotary positions, alternating global and local
(sliding-window) attention and a gated (GeGLU) MLP.

ModernBertModel keeps its layers in `layers`; each has `attn_norm` (an Identity in layer 0), `attn.Wqkv` (one
Linear d -> 3*H*dh, rows [q | k | v], each grouped per head), `attn.Wo`, `mlp_norm`, `mlp.Wi` (d -> 2F, rows
[input | gate]) and `mlp.Wo`. The attention reads its head count from Wqkv's shape, so pruning only re-sizes the
linears. Rotary embeddings and the per-layer window masks are computed from the config, which pruning leaves as
it is (the head size does not change): by the HF forward, and for the fused engine by `layer_attention`, from the
model's own rotary module (global and local layers may use different rope thetas). The fused engine runs the
gated MLP from Wi's input and gate halves and skips layer 0's Identity norm (see docs/adapters.md, "ModernBERT:
fusion").
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Adapter, Inputs, LayerAttention, LayerNames, ModelSpec


def _first_token(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    """What `Adapter.output` reads of ModernBertModel (it has no pooler): the final-normed first token, (B, d)."""
    return model.final_norm(hidden[:, 0])


def _classifier(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    """ModernBertForSequenceClassification's logits (B, C): final norm, "cls" or masked "mean" pooling, head."""
    hidden = model.model.final_norm(hidden)  # (B, T, d)
    if model.config.classifier_pooling == "cls":
        pooled = hidden[:, 0]
    else:
        mask = inputs.get("attention_mask")
        mask = hidden.new_ones(hidden.shape[:2]) if mask is None else mask.to(hidden.dtype)  # (B, T)
        pooled = (hidden * mask[..., None]).sum(dim=1) / mask.sum(dim=1, keepdim=True)
    return model.classifier(model.drop(model.head(pooled)))


class ModernBertAdapter(Adapter):
    name = "modernbert"
    norm_position = "pre"
    layer_names = LayerNames(
        query="attn.Wqkv",
        key="attn.Wqkv",
        value="attn.Wqkv",
        output="attn.Wo",
        norm1="attn_norm",
        norm2="mlp_norm",
        mlp_in="mlp.Wi",
        mlp_out="mlp.Wo",
        activation="mlp.act",
        attention="attn",
        head_count_attrs=(),  # the attention infers H from Wqkv's output
        fused_qkv=True,
        gated_mlp=True,
    )
    layers_path = "layers"
    embedding_paths = ("embeddings", "rotary_emb")  # rotary_emb: buffers only, computed from the config
    input_names = ("input_ids", "attention_mask", "position_ids")
    required_inputs = ("input_ids",)
    specs = {
        "ModernBertModel": ModelSpec(backbone="", head=_first_token, classifier=False, head_tokens=1),
        "ModernBertForSequenceClassification": ModelSpec(backbone="model", head=_classifier, classifier=True),
    }

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        """Token embeddings, normed (positions enter each layer's attention as rotations), (B, T, d)."""
        return backbone.embeddings(input_ids=inputs["input_ids"])

    def layer_attention(self, backbone: nn.Module, inputs: Inputs, seq_len: int) -> list[LayerAttention]:
        """Per layer (as `config.layer_types` names its kind): the padding mask, narrowed for local layers to keys
        at most `config.sliding_window` tokens away (HF's bidirectional sliding window), and the (cos, sin) table
        of its kind, each (1|B, T, dh) (position_ids, or 0..T-1)."""
        config = backbone.config
        padding = self.attention_mask(inputs, seq_len)  # (B, 1, 1, T) or None
        tokens = torch.arange(seq_len, device=inputs["input_ids"].device)
        window = (tokens[:, None] - tokens[None, :]).abs() <= config.sliding_window  # (T, T)
        masks = {"full_attention": padding, "sliding_attention": window if padding is None else window & padding}
        positions = inputs.get("position_ids")
        positions = tokens[None] if positions is None else positions  # (1|B, T)
        dtype_of = backbone.embeddings.tok_embeddings.weight  # the rotary module takes the dtype of its input
        rotary = {kind: backbone.rotary_emb(dtype_of, positions, kind) for kind in set(config.layer_types)}
        return [LayerAttention(masks[kind], rotary[kind]) for kind in config.layer_types]
