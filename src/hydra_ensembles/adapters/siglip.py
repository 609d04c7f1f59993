"""SigLIP's two towers: pre-norm encoders whose layers are CLIP's (`self_attn.{q,k,v,out}_proj`, `layer_norm{1,2}`).

Unlike CLIP, each tower projects by itself, so its pooled output is already in the shared space: the text tower is
not causal and pools the *last position* (`final_layer_norm`, then the linear `head`); the vision tower has no
[CLS] token, applies `post_layernorm` to every token and pools them with an attention-pooling head (the "MAP"
head: a learned probe query, `nn.MultiheadAttention`, LayerNorm and MLP). That head is not a transformer layer:
pruning leaves it whole, and fusion runs it per member as it runs any classifier. `SiglipForImageClassification`
ignores it and classifies the mean of the normed tokens. A `SiglipModel` holds both towers: prune and fuse
`model.text_model` and `model.vision_model` (each a PreTrainedModel in transformers v5) separately.
"""

from __future__ import annotations

from torch import Tensor, nn

from .base import Adapter, Inputs, ModelSpec
from .clip import CLIP_LAYER_NAMES


def _text_pooled(tower: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    """SiglipTextModel's pooler_output: head(final LN of the last position), (B, P); LN is per token."""
    return tower.head(tower.final_layer_norm(hidden[:, -1]))


def _vision_pooled(tower: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    """SiglipVisionModel's pooler_output: the attention-pooling head over all normed tokens, (B, d); without
    that head (`vision_use_head=False`) the first normed token, as `Adapter.output` reads such a model."""
    normed = tower.post_layernorm(hidden)  # (B, T, d)
    return tower.head(normed) if tower.use_head else normed[:, 0]


def _vision_classifier(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    return model.classifier(model.vision_model.post_layernorm(hidden).mean(dim=1))  # mean of all tokens, (B, C)


class SiglipTextAdapter(Adapter):
    name = "siglip_text"
    norm_position = "pre"
    layer_names = CLIP_LAYER_NAMES
    layers_path = "encoder.layers"
    embedding_paths = ("embeddings",)
    input_names = ("input_ids", "attention_mask", "position_ids")
    required_inputs = ("input_ids",)
    prompt_padding = "max_length"  # it pools the last position: pad as trained, not to the batch's longest
    specs = {"SiglipTextModel": ModelSpec(backbone="", head=_text_pooled, classifier=False)}

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        return backbone.embeddings(input_ids=inputs["input_ids"], position_ids=inputs.get("position_ids"))


class SiglipVisionAdapter(Adapter):
    name = "siglip_vision"
    norm_position = "pre"
    layer_names = CLIP_LAYER_NAMES
    layers_path = "encoder.layers"
    embedding_paths = ("embeddings",)
    input_names = ("pixel_values", "interpolate_pos_encoding")
    required_inputs = ("pixel_values",)
    specs = {
        "SiglipVisionModel": ModelSpec(backbone="", head=_vision_pooled, classifier=False),
        "SiglipForImageClassification": ModelSpec(backbone="vision_model", head=_vision_classifier, classifier=True),
    }

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        interpolate = bool(inputs.get("interpolate_pos_encoding"))
        return backbone.embeddings(inputs["pixel_values"], interpolate_pos_encoding=interpolate)  # (B, T, d)
