"""ViT and DeiT: pre-norm image encoders (LN -> attention -> residual, LN -> MLP -> residual).

In transformers v5 the layers sit in `layers` and attention exposes `attention.{q,k,v,o}_proj`; the final
`layernorm` is applied to the whole sequence before the [CLS] token is read.
"""

from __future__ import annotations

from torch import Tensor, nn

from .base import Adapter, Inputs, LayerNames, ModelSpec

VIT_LAYER_NAMES = LayerNames(
    query="attention.q_proj",
    key="attention.k_proj",
    value="attention.v_proj",
    output="attention.o_proj",
    norm1="layernorm_before",
    norm2="layernorm_after",
    mlp_in="mlp.fc1",
    mlp_out="mlp.fc2",
    activation="mlp.activation_fn",
    attention="attention",
    head_count_attrs=("num_attention_heads",),
)


def _encoder(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    normed = model.layernorm(hidden)  # (B, T, d)
    return model.pooler(normed) if model.pooler is not None else normed[:, 0]  # (B, D)


def _classifier(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    backbone = model.vit if hasattr(model, "vit") else model.deit
    return model.classifier(backbone.layernorm(hidden[:, 0]))  # LN is per token: norm [CLS] only -> (B, C)


def _deit_with_teacher(model: nn.Module, hidden: Tensor, inputs: Inputs) -> Tensor:
    normed = model.deit.layernorm(hidden[:, :2])  # [CLS] and distillation tokens, (B, 2, d)
    return (model.cls_classifier(normed[:, 0]) + model.distillation_classifier(normed[:, 1])) / 2  # (B, C)


class ViTAdapter(Adapter):
    name = "vit"
    norm_position = "pre"
    layer_names = VIT_LAYER_NAMES
    layers_path = "layers"
    embedding_paths = ("embeddings",)
    input_names = ("pixel_values", "interpolate_pos_encoding")
    required_inputs = ("pixel_values",)
    head_dim_field = "head_dim"
    specs = {
        "ViTModel": ModelSpec(backbone="", head=_encoder, classifier=False, head_tokens=1),
        "ViTForImageClassification": ModelSpec(backbone="vit", head=_classifier, classifier=True, head_tokens=1),
        "DeiTModel": ModelSpec(backbone="", head=_encoder, classifier=False, head_tokens=1),
        "DeiTForImageClassification": ModelSpec(backbone="deit", head=_classifier, classifier=True, head_tokens=1),
        "DeiTForImageClassificationWithTeacher": ModelSpec(
            backbone="deit", head=_deit_with_teacher, classifier=True, head_tokens=2
        ),
    }

    def embed(self, backbone: nn.Module, inputs: Inputs) -> Tensor:
        embeddings = backbone.embeddings
        pixels = inputs["pixel_values"].to(embeddings.patch_embeddings.projection.weight.dtype)
        return embeddings(pixels, interpolate_pos_encoding=bool(inputs.get("interpolate_pos_encoding")))
