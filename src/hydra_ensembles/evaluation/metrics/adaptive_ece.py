"""Adaptive expected calibration error: equal-mass confidence bins."""

from __future__ import annotations

import torch
from torch import Tensor

from .ece import _compute


def adaptive_ece(probs: Tensor, labels: Tensor, bins: int = 15) -> float:
    """aECE: the ECE formula over `bins` bins holding (nearly) equal numbers of inputs.

    Inputs are sorted by top-1 confidence and split into `bins` consecutive groups whose sizes differ by at most
    one (the first N mod bins groups get the extra input), so every bin is populated where ECE's equal-width
    bins would leave most of them empty for a confident model. aECE = sum_b (n_b / N) |acc_b - conf_b|.
    Shape: probs (N, C); labels (N,). Reference: Nixon et al., "Measuring calibration in deep learning", 2019.
    """
    confidence, prediction = probs.double().max(dim=1)
    correct = (prediction == labels.to(probs.device)).double()
    count = len(confidence)
    order = torch.argsort(confidence, stable=True)
    sizes = [count // bins + (1 if b < count % bins else 0) for b in range(min(bins, count))]
    index = torch.empty(count, dtype=torch.long, device=probs.device)
    index[order] = torch.repeat_interleave(torch.arange(len(sizes), device=probs.device), torch.tensor(sizes))
    return _compute(confidence, correct, index, len(sizes)).item()
