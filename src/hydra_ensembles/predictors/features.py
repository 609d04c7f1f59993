"""Each member's penultimate features: what its final linear classifier reads, z = W f + b.

One forward pass gives features and logits together. A forward hook on each member's final classifier layer (the
one `nn.Linear` after the encoder with C outputs) makes it return [f, z] concatenated on the last axis, so the
predictor's "logits" come out as (B, M, D + C) and are split. Recording the input instead would not work inside a
Hydra Ensemble, whose members' heads run under `torch.vmap`: a tensor recorded there cannot be taken out.

Which model's features: wrappers that only change the logits (calibration, MC dropout's sampling) are looked
through to the model they wrap (`feature_source`); a deep ensemble has one feature set per member, a Hydra
Ensemble one per fused member, a BatchEnsemble one per member (what its classifier reads in member m's rows; the
member's classifier is W ∘ (s_m r_m^T), b_m), an HF classifier one (M = 1). Shapes: B inputs, M members, D
features, C classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from torch import Tensor, nn

from ..adapters import get_adapter
from ..fusion import HydraEnsemble
from ..outputs import map_batches, member_logits_of
from .baselines import MIMO, BatchEnsemble, DeepEnsemble
from .baselines.batch_ensemble import BatchEnsembleLinear
from .wrapper import Wrapper


@dataclass
class MemberFeatures:
    """features (B, M, D) and the logits (B, M, C) each member's classifier gives them."""

    features: Tensor
    logits: Tensor


@dataclass
class Classifiers:
    """The final linear layers that read the features (hooked), and each member's weights: weight (M, C, D),
    bias (M, C)."""

    layers: list[nn.Module]
    weight: Tensor
    bias: Tensor


def feature_source(model: nn.Module) -> nn.Module:
    """The model whose members' features a predictor's feature scores read: a wrapper that changes only the
    logits is looked through; a deep ensemble or a BatchEnsemble is its own source (its `base` is only its first
    member, or the shared model)."""
    while isinstance(model, Wrapper) and not isinstance(model, (DeepEnsemble, BatchEnsemble)):
        if isinstance(model, MIMO):  # its network's one classifier has M x C outputs over features of M inputs
            raise ValueError(
                "feature-space OOD scores read each member's penultimate features; a MIMO network's members share "
                "one feature vector of all their inputs (one classifier of M x C outputs). Use a logit score "
                "(msp, energy, max_logit, mi) for MIMO."
            )
        model = model.base
    return model


def classifiers(source: nn.Module) -> Classifiers:
    """The final classifier layers of an HF classifier, a Hydra Ensemble, a BatchEnsemble or a deep ensemble of HF
    classifiers."""
    if isinstance(source, HydraEnsemble):
        return _fused_classifiers(source)
    if isinstance(source, BatchEnsemble):
        return _batch_ensemble_classifiers(source)
    if isinstance(source, DeepEnsemble):
        parts = [classifiers(member) for member in source.models]
        return Classifiers(
            [p.layers[0] for p in parts], torch.cat([p.weight for p in parts]), torch.cat([p.bias for p in parts])
        )
    if isinstance(source, transformers.PreTrainedModel):
        _, layer = final_linear(source, source.config.num_labels, get_adapter(source).layers_path)
        bias = layer.bias if layer.bias is not None else layer.weight.new_zeros(layer.out_features)
        return Classifiers([layer], layer.weight.detach()[None], bias.detach()[None])
    raise ValueError(
        f"feature-space OOD scores read the penultimate features of an HF classifier, a Hydra Ensemble, a "
        f"BatchEnsemble or a deep ensemble (or a calibrated one of these); got a {type(source).__name__}."
    )


def final_linear(model: nn.Module, classes: int, layers_path: str = "") -> tuple[str, nn.Module]:
    """The one linear layer (`nn.Linear`, or a BatchEnsemble's wrapped one) with `classes` outputs outside the
    encoder layers, by name; refused when there are none or several (DeiT with a distillation token averages two
    classifiers: no one feature vector)."""
    linears = (nn.Linear, BatchEnsembleLinear)
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, linears) and module.out_features == classes and not _inside(name, layers_path)
    ]
    if len(found) != 1:
        names = [name for name, _ in found]
        raise ValueError(
            f"feature-space OOD scores need one final linear classifier with {classes} outputs; a "
            f"{type(model).__name__} has {len(found)} ({names}), so its penultimate features are not one vector."
        )
    return found[0]


def _inside(name: str, layers_path: str) -> bool:
    """Whether the module `name` sits in the encoder layers (`layers_path`, relative to the backbone)."""
    return bool(layers_path) and f".{layers_path}." in f".{name}."


def _fused_classifiers(ensemble: HydraEnsemble) -> Classifiers:
    """A Hydra Ensemble's classifier layer (in the structure-only model its heads run through; hooked there) and
    the members' own weights of it (heads are always per member)."""
    if not ensemble.is_classifier:
        raise ValueError("this Hydra Ensemble has no classifier: its features are its `member_pooled` outputs.")
    skeleton = ensemble.outer.skeleton
    name, layer = final_linear(skeleton, ensemble.model_config.num_labels)
    tensors = ensemble.outer.shared.tensors() | ensemble.outer.member.tensors()
    weight = tensors[f"{name}.weight"].detach()
    weight = weight if weight.dim() == 3 else weight.expand(ensemble.num_members, -1, -1)  # (M, C, D)
    bias = tensors.get(f"{name}.bias", weight.new_zeros(weight.shape[:2]))
    bias = bias.detach() if bias.dim() == 2 else bias.detach().expand(ensemble.num_members, -1)  # (M, C)
    return Classifiers([layer], weight, bias)


def _batch_ensemble_classifiers(ensemble: BatchEnsemble) -> Classifiers:
    """A BatchEnsemble's classifier layer (hooked: in member-major rows it reads each member's features) and each
    member's own weights of it, W ∘ (s_m r_m^T) and b_m."""
    model = ensemble.model
    _, layer = final_linear(model, model.config.num_labels, get_adapter(model).layers_path)
    weight = layer.weight[None] * (layer.s[:, :, None] * layer.r[:, None, :])  # (M, C, D)
    bias = layer.bias if layer.bias is not None else weight.new_zeros(weight.shape[:2])  # (M, C)
    return Classifiers([layer], weight.detach(), bias.detach())


@contextmanager
def exposing_features(layers: Iterable[nn.Module]) -> Iterator[None]:
    """While inside, each of `layers` returns its input and output concatenated, [f, z] (..., D + C)."""

    def both(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return torch.cat([args[0], output.to(args[0].dtype)], dim=-1)

    handles = [layer.register_forward_hook(both) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def member_features(source: nn.Module, inputs: Mapping[str, Any], found: Classifiers | None = None) -> MemberFeatures:
    """Features and logits of a feature source (`feature_source`) on one batch of inputs (no labels), in one
    forward pass."""
    found = found or classifiers(source)
    with exposing_features(found.layers):
        combined = member_logits_of(source(**inputs))  # (B, M, D + C)
    classes = found.weight.shape[1]
    return MemberFeatures(combined[..., :-classes], combined[..., -classes:])


@torch.no_grad()
def collect_features(
    model: nn.Module, loader: Iterable[Mapping[str, Any]], progress: bool = False
) -> tuple[MemberFeatures, Classifiers]:
    """Member features (N, M, D) and logits (N, M, C), float32 on the CPU, of any predictor's feature source over
    a loader of batches, and its classifiers. Runs in eval mode and puts the model back in its mode."""
    source = feature_source(model)
    found = classifiers(source)

    def step(inputs: dict[str, Any]) -> MemberFeatures:
        part = member_features(source, inputs, found)
        return MemberFeatures(part.features.float().cpu(), part.logits.float().cpu())

    parts = map_batches(source, loader, step, "features", progress, empty="no features to collect")
    features = MemberFeatures(torch.cat([p.features for p in parts]), torch.cat([p.logits for p in parts]))
    return features, found
