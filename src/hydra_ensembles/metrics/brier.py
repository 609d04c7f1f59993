"""Brier score (multi-class)."""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_probs


def brier(probs: Tensor, labels: Tensor) -> float:
    """Mean over inputs of the squared distance between the predicted distribution and the one-hot label.

    Formula: Brier = (1/N) sum_i sum_c (p_ic - 1[y_i = c])^2, in [0, 2]; lower is better.
    Shape: probs (N, C), rows summing to 1; labels (N,).
    Reference: Brier, "Verification of forecasts expressed in terms of probability", 1950 (the multi-class form
    torch-uncertainty reports).
    """
    check_probs(probs, labels, "Brier")
    return _compute(probs.double(), labels.to(probs.device)).item()


def _compute(probs: Tensor, labels: Tensor) -> Tensor:
    one_hot = torch.nn.functional.one_hot(labels.long(), probs.shape[1]).to(probs.dtype)
    return ((probs - one_hot) ** 2).sum(dim=1).mean()
