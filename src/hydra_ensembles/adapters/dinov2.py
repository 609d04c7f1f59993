"""DINOv2 and DINOv2 with registers: pre-norm image encoders like ViT, with layer scale on both residual branches
and `norm{1,2}`. The registers variant (Darcet et al., 2024) puts `num_register_tokens` learned tokens between
[CLS] and the patches, with the same layers; its classifier leaves them out of the patch mean."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from .base import Adapter, Block, Inputs, ModelSpec
from .vit import VIT_LAYER_NAMES


def _encoder(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return model.layernorm(hidden[:, 0])  # Dinov2Model's pooler_output: the normed [CLS] token, (B, d)


def _classifier(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    normed = model.dinov2.layernorm(hidden)  # (B, T, d)
    features = torch.cat([normed[:, 0], normed[:, 1:].mean(dim=1)], dim=1)  # [CLS] ++ mean patch, (B, 2d)
    return model.classifier(features)  # (B, C)


def _registers_classifier(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    normed = model.dinov2_with_registers.layernorm(hidden)  # (B, T, d): [CLS], the registers, the patches
    patches = normed[:, 1 + model.config.num_register_tokens :]
    features = torch.cat([normed[:, 0], patches.mean(dim=1)], dim=1)  # [CLS] ++ mean patch, (B, 2d)
    return model.classifier(features)  # (B, C)


class Dinov2Adapter(Adapter):
    name = "dinov2"
    norm_position = "pre"
    layer_names = replace(
        VIT_LAYER_NAMES, norm1="norm1", norm2="norm2", scale1="layer_scale1.lambda1", scale2="layer_scale2.lambda1"
    )
    layers_path = "encoder.layer"
    embedding_paths = ("embeddings",)
    input_names = ("pixel_values",)
    required_inputs = ("pixel_values",)
    head_dim_field = "head_dim"
    specs = {
        "Dinov2Model": ModelSpec(backbone="", head=_encoder, classifier=False, head_tokens=1),
        "Dinov2ForImageClassification": ModelSpec(backbone="dinov2", head=_classifier, classifier=True),
        "Dinov2WithRegistersModel": ModelSpec(backbone="", head=_encoder, classifier=False, head_tokens=1),
        "Dinov2WithRegistersForImageClassification": ModelSpec(
            backbone="dinov2_with_registers", head=_registers_classifier, classifier=True
        ),
    }

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        return backbone.embeddings(inputs["pixel_values"])  # (B, T, d)

    def block(self, layer: nn.Module) -> Block:
        if not hasattr(layer.mlp, "fc1"):
            raise ValueError(
                "DINOv2 with use_swiglu_ffn=True is not supported: its MLP has three projections "
                "(gate, up, down). Use a DINOv2 checkpoint with the standard MLP, or add a SwiGLU-aware adapter."
            )
        return super().block(layer)
