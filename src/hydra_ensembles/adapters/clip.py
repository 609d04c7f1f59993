"""CLIP's two towers: pre-norm encoders with `self_attn.{q,k,v,out}_proj` and `layer_norm{1,2}`.

The text tower is causal and reads the end-of-text token; the vision tower applies `pre_layrnorm` (sic, the HF
name) to its embeddings and `post_layernorm` to the [CLS] token. A `CLIPModel` holds both towers: prune and
fuse `model.text_model` and `model.vision_model` (each a PreTrainedModel in transformers v5) separately.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Adapter, Inputs, LayerNames, ModelSpec

CLIP_LAYER_NAMES = LayerNames(
    query="self_attn.q_proj",
    key="self_attn.k_proj",
    value="self_attn.v_proj",
    output="self_attn.out_proj",
    norm1="layer_norm1",
    norm2="layer_norm2",
    mlp_in="mlp.fc1",
    mlp_out="mlp.fc2",
    activation="mlp.activation_fn",
    attention="self_attn",
    head_count_attrs=("num_heads",),
)


def _end_of_text(tower: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    """The final-normed hidden state of each sequence's end-of-text token, (B, d), as CLIPTextModel pools."""
    input_ids = inputs["input_ids"].to(torch.int)
    if tower.eos_token_id == 2:  # legacy configs: the EOT token has the largest id
        positions = input_ids.argmax(dim=-1)
    else:
        positions = (input_ids == tower.eos_token_id).int().argmax(dim=-1)
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return tower.final_layer_norm(hidden[rows, positions.to(hidden.device)])  # LN is per token


def _text_projected(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return model.text_projection(_end_of_text(model.text_model, hidden, inputs))  # (B, P)


def _vision_pooled(tower: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return tower.post_layernorm(hidden[:, 0])  # (B, d)


def _vision_projected(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return model.visual_projection(_vision_pooled(model.vision_model, hidden, inputs))  # (B, P)


def _vision_classifier(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return model.classifier(hidden[:, 1:].mean(dim=1))  # mean of patch tokens, (B, C)


class CLIPTextAdapter(Adapter):
    name = "clip_text"
    norm_position = "pre"
    layer_names = CLIP_LAYER_NAMES
    layers_path = "encoder.layers"
    embedding_paths = ("embeddings",)
    input_names = ("input_ids", "attention_mask", "position_ids")
    required_inputs = ("input_ids",)
    causal = True
    specs = {
        "CLIPTextModel": ModelSpec(backbone="", head=_end_of_text, classifier=False),
        "CLIPTextModelWithProjection": ModelSpec(backbone="text_model", head=_text_projected, classifier=False),
    }

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        return backbone.embeddings(input_ids=inputs["input_ids"], position_ids=inputs.get("position_ids"))


class CLIPVisionAdapter(Adapter):
    name = "clip_vision"
    norm_position = "pre"
    layer_names = CLIP_LAYER_NAMES
    layers_path = "encoder.layers"
    embedding_paths = ("embeddings", "pre_layrnorm")
    input_names = ("pixel_values", "interpolate_pos_encoding")
    required_inputs = ("pixel_values",)
    specs = {
        "CLIPVisionModel": ModelSpec(backbone="", head=_vision_pooled, classifier=False, head_tokens=1),
        "CLIPVisionModelWithProjection": ModelSpec(
            backbone="vision_model", head=_vision_projected, classifier=False, head_tokens=1
        ),
        "CLIPForImageClassification": ModelSpec(backbone="vision_model", head=_vision_classifier, classifier=True),
    }

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        interpolate = bool(inputs.get("interpolate_pos_encoding"))
        hidden = backbone.embeddings(inputs["pixel_values"], interpolate_pos_encoding=interpolate)
        return backbone.pre_layrnorm(hidden)  # (B, T, d)
