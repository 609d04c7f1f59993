"""Ensemble predictions and their uncertainty, from member logits.

Convention (torch-uncertainty's): the ensemble's predictive distribution is the mean of the members'
softmax probabilities, not the softmax of mean logits. Shapes: B inputs, M members, C classes.

Precision: float64 logits are computed in float64 (evaluation passes them so: float32 creates ties that change
AUPR); anything narrower (float32, bfloat16, float16) is computed in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor


def ensemble_probs(member_logits: Tensor) -> Tensor:
    """p(y|x) = (1/M) sum_m softmax(z_m). member_logits (B, M, C) -> (B, C)."""
    return _wide(_members(member_logits)).softmax(dim=-1).mean(dim=1)


def off_top_mass(probs: Tensor) -> Tensor:
    """1 - max_c p_c, summed from the other classes' probabilities rather than subtracted from 1: above a logit
    margin of ~37 nats max_c p_c rounds to 1.0 even in float64, and confident inputs would tie. (..., C) -> (...)."""
    return probs.scatter(-1, probs.argmax(dim=-1, keepdim=True), 0.0).sum(dim=-1)


def entropy(probs: Tensor) -> Tensor:
    """Shannon entropy in nats over the last axis, with 0 log 0 = 0. probs (..., C) -> (...)."""
    return -(probs * torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))).sum(dim=-1)


def mutual_information(member_logits: Tensor) -> Tensor:
    """Model (epistemic) uncertainty: I = H[mean_m p_m] - mean_m H[p_m], in nats. (B, M, C) -> (B,).

    Zero when all members agree exactly; at most log M.
    """
    return decompose(member_logits)["model"]


def decompose(member_logits: Tensor) -> dict[str, Tensor]:
    """Paper 001 Eq. 6 for classifiers, each (B,) in nats: total = H[mean_m p_m] (entropy of the ensemble
    probability), data = mean_m H[p_m] (expected data uncertainty), model = total - data (the mutual
    information, `mutual_information`). member_logits (B, M, C)."""
    member_probs = _wide(_members(member_logits)).softmax(dim=-1)  # (B, M, C)
    total, data = entropy(member_probs.mean(dim=1)), entropy(member_probs).mean(dim=1)
    return {"total": total, "data": data, "model": (total - data).clamp_min(0.0)}


def gaussian_mixture(member_gaussians: Tensor) -> dict[str, Tensor]:
    """The uniform mixture of M Gaussians N(mu_m, sigma_m^2) and its variance's decomposition, each (B,):
    mean = mean_m mu_m; aleatoric = mean_m sigma_m^2 (data); epistemic = mean_m mu_m^2 - mean^2 (the members'
    disagreement, model); total = aleatoric + epistemic (the mixture's variance). member_gaussians (B, M, 2):
    (mean, log-variance) per member."""
    mu, variance = _wide(member_gaussians[..., 0]), _wide(member_gaussians[..., 1]).exp()  # (B, M)
    mean = mu.mean(dim=1)
    aleatoric, epistemic = variance.mean(dim=1), mu.var(dim=1, unbiased=False)
    return {"mean": mean, "aleatoric": aleatoric, "epistemic": epistemic, "total": aleatoric + epistemic}


def _members(member_logits: Tensor) -> Tensor:
    """`member_logits` if (B, M, C): a single model's (B, C) logits would be averaged over its classes."""
    if member_logits.dim() != 3:
        raise ValueError(
            f"member logits must be (B, M, C), got shape {tuple(member_logits.shape)}: a single model's (B, C) "
            "logits are one member, logits[:, None] (outputs.member_logits_of reads any model's output so)."
        )
    return member_logits


def _wide(x: Tensor) -> Tensor:
    """float64 stays float64; every narrower float type is computed in float32."""
    return x if x.dtype == torch.float64 else x.float()
