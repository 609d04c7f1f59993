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
    return _wide(member_logits).softmax(dim=-1).mean(dim=1)


def entropy(probs: Tensor) -> Tensor:
    """Shannon entropy in nats over the last axis, with 0 log 0 = 0. probs (..., C) -> (...)."""
    return -(probs * torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))).sum(dim=-1)


def mutual_information(member_logits: Tensor) -> Tensor:
    """Model (epistemic) uncertainty: I = H[mean_m p_m] - mean_m H[p_m], in nats. (B, M, C) -> (B,).

    Zero when all members agree exactly; at most log M.
    """
    member_probs = _wide(member_logits).softmax(dim=-1)  # (B, M, C)
    return (entropy(member_probs.mean(dim=1)) - entropy(member_probs).mean(dim=1)).clamp_min(0.0)


def _wide(x: Tensor) -> Tensor:
    """float64 stays float64; every narrower float type is computed in float32."""
    return x if x.dtype == torch.float64 else x.float()
