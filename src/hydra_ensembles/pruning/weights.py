"""Unstructured weight pruning: single weights set to zero and held there while the model trains on.

Unlike heads and neurons, a pruned weight changes no shape: the model stays the same HF model with the same
parameters, some of them zero, so it saves and loads as it is and costs what the dense model costs (no kernel
here skips zeros). A *weight mask* is `{parameter name: bool tensor of its shape}`, True where the weight is kept.

`zero_weights` zeroes what a mask drops; `mask_weights` does that and zeroes the same entries of each masked
parameter's gradient (a hook), so the training loop's optimisers keep those weights at exactly zero: a zero
gradient moves neither SGD (its weight decay is proportional to the weight, 0) nor AdamW (moments start at 0 and
stay there; its decay is decoupled and proportional to the weight). That holds for an optimiser built after the mask:
one that already holds momentum or Adam moments for a weight moves it on, so mask before building the optimiser.
The hold belongs to these parameter objects: a copy (`copy.deepcopy`, which `build_members` makes), a model whose
layers are then cut (`prune_heads`, `prune_neurons`: new Linears) or one loaded from a save starts without it, its
zeros free to train: call `mask_weights` on it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

WeightMask = dict[str, Tensor]


def linear_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters unstructured pruning may remove: weight and bias of every `nn.Linear` (attention
    projections, MLP, pooler, classifier), by name. Embeddings, norms and scales are never pruned."""
    return {
        f"{module_name}.{name}" if module_name else name: parameter
        for module_name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        for name, parameter in module.named_parameters(recurse=False)
    }


def zero_weights(model: nn.Module, masks: Mapping[str, Tensor]) -> dict[str, nn.Parameter]:
    """Zero the weights `masks` drop, in place ({parameter name: bool tensor of the parameter's shape}, True =
    kept). Returns the masked parameters by name."""
    parameters = dict(model.named_parameters())
    for name, mask in masks.items():
        if name not in parameters:
            raise KeyError(f"the mask names {name!r}, which is not a parameter of this model; build masks from it.")
        parameter = parameters[name]
        if mask.shape != parameter.shape or mask.dtype != torch.bool:
            raise ValueError(
                f"the mask of {name!r} is {mask.dtype} {tuple(mask.shape)}; it must be torch.bool of the parameter's "
                f"shape {tuple(parameter.shape)}."
            )
        with torch.no_grad():
            parameter.masked_fill_(~mask.to(parameter.device), 0)  # not mul_: an inf or NaN times 0 stays NaN
    return {name: parameters[name] for name in masks}


def mask_weights(model: nn.Module, masks: Mapping[str, Tensor]) -> list[RemovableHandle]:
    """Zero the weights `masks` drop, in place, and keep them zero under training (gradient hooks).

    Args:
        model: any module; `masks` names its parameters.
        masks: {parameter name: bool tensor of the parameter's shape}, True = kept.

    Returns:
        the hooks' handles (`handle.remove()` lets the zeroed weights train again).

    Under torchrun (DistributedDataParallel), every process must mask the same weights: a gradient all-reduced
    from a process that kept a weight would move it here. A deep copy, a later head or neuron pruning or a reload
    drops the hold (the hooks stay with these parameters): mask again.
    """
    handles = []
    for name, parameter in zero_weights(model, masks).items():
        kept = masks[name].to(parameter.device)
        trains = parameter.requires_grad  # a frozen weight the training loop may unfreeze gets its hook too
        parameter.requires_grad_(True)
        handles.append(parameter.register_hook(partial(_masked_gradient, kept=kept)))
        parameter.requires_grad_(trains)
    return handles


def _masked_gradient(grad: Tensor, kept: Tensor) -> Tensor:
    """The gradient with the removed weights' entries set to 0 (not multiplied: an inf there would give NaN)."""
    return grad.masked_fill(~kept.to(grad.device), 0)


def kept_fraction(masks: Mapping[str, Tensor]) -> float:
    """The share of the masked weights that are kept."""
    kept = sum(int(mask.sum()) for mask in masks.values())
    return kept / max(1, sum(mask.numel() for mask in masks.values()))
