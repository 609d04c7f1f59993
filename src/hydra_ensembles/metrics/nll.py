"""Negative log-likelihood."""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_probs

NLL_FLOOR = torch.finfo(torch.float64).eps  # the least probability the NLL charges for (as sklearn's log_loss)


def nll(probs: Tensor, labels: Tensor) -> float:
    """Mean negative log-probability of the true class: NLL = -(1/N) sum_i log p_{i, y_i}; lower is better.

    Computed in float64 from probabilities (an ensemble's are a mean of softmaxes, not a softmax of anything),
    clamped below at the float64 machine epsilon, 2.22e-16 (as sklearn's `log_loss`), so that a zero probability
    costs -log(2.22e-16) = 36.04 nats rather than infinity.
    Shape: probs (N, C); labels (N,).
    """
    check_probs(probs, labels, "NLL")
    return _compute(probs.double(), labels.to(probs.device)).item()


def _compute(probs: Tensor, labels: Tensor) -> Tensor:
    true_class = probs.gather(1, labels.long()[:, None]).squeeze(1)
    return example_nll(true_class).mean()


def example_nll(true_class: Tensor) -> Tensor:
    """Each example's -log p_y, with p_y floored at `NLL_FLOOR`: the one definition the metric, the bootstrap and
    the calibration fits share. Shape: true_class (N,) probabilities -> (N,)."""
    return -torch.log(true_class.clamp_min(NLL_FLOOR))
