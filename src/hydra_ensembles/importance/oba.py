"""Optimal Brain Apoptosis (Sun et al., ICLR 2025): unstructured weight importance from the exact Hessian-vector
product, paper 000's unstructured pruning baseline ("OBA", Table 1).

With L the mean cross-entropy over the calibration data and theta every parameter of the model, removing all of
them changes L, to second order, by 1/2 theta^T H theta = 1/2 sum_i theta_i (H theta)_i. OBA scores weight i by
its share of that term:

    s_i = theta_i (H theta)_i

exact, by double backward (H theta = grad(grad L . theta)), no Hessian approximation. The first-order term
-g_i theta_i is left out, as the authors' code leaves it out by default. Weights are ranked globally as the
authors' released FastOBA ranks them, the scores scaled by their largest in the same tensor and the magnitudes by
the largest in the model (`|theta|` breaks the ties of vanishing curvature):

    r_i = |s_i| / max_tensor |s| + |theta_i| / max_model |theta|

and pruned in `steps` rounds, each re-scoring the pruned model: after round k a fraction d^(k/steps) of the
eligible weights is kept, d the final one. Eligible: weight and bias of every `nn.Linear` (`linear_parameters`).

Differences from the authors' code, on purpose: the model is scored in eval mode on fixed calibration batches (no
dropout or augmentation, so the scores are reproducible), and each round's scores are its own (their running mean,
for biases over every round, carries earlier rounds' scores of weights that have since changed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

from ..adapters import get_adapter
from ..data.loaders import Batch, materialize
from ..pruning.weights import WeightMask, linear_parameters, mask_weights, zero_weights
from .gradients import gradients_for
from .losses import weighted_losses


def oba_scores(model: nn.Module, loader: Iterable[Batch], *, progress: bool = True) -> dict[str, Tensor]:
    """s_i = theta_i (H theta)_i of every eligible parameter, H the Hessian of the mean cross-entropy over
    `loader`'s examples (batches weighted by their size, so the batching does not matter).

    Args:
        model: a supported HF classifier; not modified (eval mode while scoring).
        loader: labelled calibration batches.

    Returns:
        {parameter name: CPU tensor of the parameter's shape (float32; float64 for a float64 model)}, signed.
    """
    batches = materialize(loader, "calibration loader")
    if not get_adapter(model).is_classifier(model):
        raise ValueError("OBA scores a classifier's cross-entropy; this model has no classification head.")
    eligible = linear_parameters(model)
    parameters = list(model.parameters())
    names = {id(p): name for name, p in eligible.items()}
    targets = [p for p in parameters if id(p) in names]
    hessian_theta = [torch.zeros_like(p, dtype=torch.promote_types(p.dtype, torch.float32)) for p in targets]
    # the math kernel of scaled_dot_product_attention has a double backward; the fused CPU kernels do not
    with gradients_for(model, parameters), sdpa_kernel(SDPBackend.MATH):
        values = weighted_losses("cross_entropy", model, batches, classifier=True, temperature=1.0)
        for value, share in tqdm(values, desc="OBA scores", total=len(batches), disable=not progress, leave=False):
            grads = torch.autograd.grad(value * share, parameters, create_graph=True, allow_unused=True)
            directional = sum((g * p.detach()).sum() for g, p in zip(grads, parameters) if g is not None)
            for acc, hv in zip(hessian_theta, torch.autograd.grad(directional, targets, allow_unused=True)):
                if hv is not None:
                    acc += hv  # H theta, summed over batches: the Hessian of the mean loss
    return {names[id(p)]: (p.detach() * hv).cpu() for p, hv in zip(targets, hessian_theta)}


def oba_ranking(model: nn.Module, scores: dict[str, Tensor]) -> dict[str, Tensor]:
    """r_i = |s_i| / max_tensor |s| + |theta_i| / max_model |theta| of the scored parameters; higher = more
    important.

    Returns:
        {parameter name: float CPU tensor of the parameter's shape}.
    """
    eligible = linear_parameters(model)
    top_weight = max(float(p.detach().abs().max()) for p in model.parameters()) or 1.0  # every parameter's
    return {
        name: score.abs() / (float(score.abs().max()) or 1.0) + eligible[name].detach().float().abs().cpu() / top_weight
        for name, score in scores.items()
    }


def oba_prune(
    model: nn.Module, loader: Iterable[Batch], remove: int, *, steps: int = 49, progress: bool = True
) -> WeightMask:
    """Remove `remove` eligible weights by OBA in `steps` rounds (the authors' schedule: 49), in place.

    The removed weights are zero and stay zero while the model trains (`mask_weights`' gradient hooks).

    Args:
        model: a supported HF classifier.
        loader: labelled calibration batches, scored again in every round.
        remove: how many eligible weights to remove in all (e.g. as many as a head-pruned model lacks).
        steps: pruning rounds; each costs one double-backward pass over `loader`.

    Returns:
        the masks, {parameter name: bool CPU tensor of the parameter's shape}, True = kept. Under torchrun, every
        process must hold the same masks (prune on one and broadcast them, or score the same data deterministically).
    """
    eligible = linear_parameters(model)
    total = sum(p.numel() for p in eligible.values())
    if not 0 < remove < total:
        raise ValueError(f"remove must be between 1 and {total - 1} (the model's Linear weights); got {remove}.")
    if steps < 1:
        raise ValueError(f"steps must be at least 1; got {steps}.")
    batches = materialize(loader, "calibration loader")
    masks = {name: torch.ones_like(p, dtype=torch.bool, device="cpu") for name, p in eligible.items()}
    density = (total - remove) / total
    for step in tqdm(range(1, steps + 1), desc="OBA pruning", disable=not progress):
        keep = total - remove if step == steps else round(total * density ** (step / steps))
        ranking = oba_ranking(model, oba_scores(model, batches, progress=progress))
        flat = torch.cat([torch.where(masks[n], ranking[n], -math.inf).flatten() for n in masks])
        kept = torch.zeros(total, dtype=torch.bool)
        kept[torch.topk(flat, keep, sorted=False).indices] = True  # a removed weight ranks last: never back
        pieces = kept.split([mask.numel() for mask in masks.values()])
        masks = {name: piece.view(mask.shape) for (name, mask), piece in zip(masks.items(), pieces)}
        zero_weights(model, masks)  # the next round scores the pruned model
    mask_weights(model, masks)
    return masks
