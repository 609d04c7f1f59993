"""DINOv3 (ViT): a pre-norm image encoder like DINOv2, with layer scale on both residual branches, register tokens
after [CLS], and 2-D rotary positions in place of a position table.

DINOv3ViTModel keeps its layers in `model.layer`; each has `norm1`, `attention.{q,k,v,o}_proj` (the key without a
bias in the released configs), `layer_scale1`, `norm2`, `mlp.{up,down}_proj` and `layer_scale2`. The rotary table
(`rope_embeddings`, computed from the image's size) rotates the patch tokens' queries and keys only; the fused
engine takes it as a table over every token whose [CLS] and register rows are the identity (cos 1, sin 0), which
leaves those tokens exactly as HF's split does. transformers v5 has no DINOv3 classifier class: the encoder is
supported (pooled output: the final-normed [CLS] token), e.g. as the image tower of a two-tower model.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Adapter, Block, Inputs, LayerAttention, LayerNames, ModelSpec


def _encoder(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return model.norm(hidden[:, 0])  # DINOv3ViTModel's pooler_output: the normed [CLS] token, (B, d)


class Dinov3Adapter(Adapter):
    name = "dinov3_vit"
    norm_position = "pre"
    layer_names = LayerNames(
        query="attention.q_proj",
        key="attention.k_proj",
        value="attention.v_proj",
        output="attention.o_proj",
        norm1="norm1",
        norm2="norm2",
        mlp_in="mlp.up_proj",
        mlp_out="mlp.down_proj",
        activation="mlp.act_fn",
        attention="attention",
        head_count_attrs=("num_heads",),
        scale1="layer_scale1.lambda1",
        scale2="layer_scale2.lambda1",
    )
    layers_path = "model.layer"
    embedding_paths = ("embeddings", "rope_embeddings")  # rope_embeddings: a buffer computed from the config
    input_names = ("pixel_values",)
    required_inputs = ("pixel_values",)
    specs = {"DINOv3ViTModel": ModelSpec(backbone="", head=_encoder, classifier=False, head_tokens=1)}

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        return backbone.embeddings(self._pixels(backbone, inputs))  # (B, 1 + R + P, d): [CLS], registers, patches

    def layer_attention(self, backbone: nn.Module, inputs: Inputs, seq_len: int) -> list[LayerAttention]:
        """Every layer: full attention and the rotary table (1, T, dh), the identity on the 1 + R leading tokens."""
        cos, sin = backbone.rope_embeddings(self._pixels(backbone, inputs))  # (P, dh) each, the patches'
        prefix = seq_len - cos.shape[0]  # [CLS] and the registers
        cos = torch.cat([cos.new_ones(prefix, cos.shape[1]), cos])[None]
        sin = torch.cat([sin.new_zeros(prefix, sin.shape[1]), sin])[None]
        return [LayerAttention(None, (cos, sin))] * backbone.config.num_hidden_layers

    def block(self, layer: nn.Module) -> Block:
        if not hasattr(layer.mlp, "up_proj") or hasattr(layer.mlp, "gate_proj"):
            raise ValueError(
                "DINOv3 with use_gated_mlp=True is not supported (the ViT-H+ and 7B checkpoints): its MLP has three "
                "projections (gate, up, down). Use a DINOv3 checkpoint with the standard MLP (ViT-S, B or L)."
            )
        return super().block(layer)

    @staticmethod
    def _pixels(backbone: nn.Module, inputs: Inputs) -> Tensor:
        return inputs["pixel_values"].to(backbone.embeddings.patch_embeddings.weight.dtype)  # as HF's forward
