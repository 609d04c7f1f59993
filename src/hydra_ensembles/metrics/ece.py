"""Expected calibration error with equal-width confidence bins."""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_bins, check_probs


def ece(probs: Tensor, labels: Tensor, bins: int = 15) -> float:
    """ECE = sum_b (n_b / N) |acc_b - conf_b| over `bins` equal-width bins of the top-1 confidence (L1 norm).

    Bin b (b = 0..bins-1) holds the inputs whose confidence lies in [b/bins, (b+1)/bins) (the last bin also holds
    1); acc_b is their accuracy and conf_b their mean confidence; empty bins add nothing.
    Shape: probs (N, C); labels (N,). Reference: Guo et al., "On calibration of modern neural networks", 2017;
    matches torchmetrics' `MulticlassCalibrationError(n_bins=15, norm="l1")` except at a confidence of exactly 1
    (a top logit ahead by ~37 nats in float64), which torchmetrics puts in a bin of its own and this the last bin,
    and at a confidence exactly on an edge b/15, which torchmetrics' float32 edges may put in the bin below.
    """
    check_probs(probs, labels, "ECE")
    check_bins(bins, "ECE")
    confidence, prediction = probs.double().max(dim=1)
    correct = (prediction == labels.to(probs.device)).double()
    return _compute(confidence, correct, bin_index(confidence, bins), bins).item()


def bin_index(values: Tensor, bins: int) -> Tensor:
    """Each value's equal-width bin b, [b/bins, (b+1)/bins), the last bin also holding 1: the one binning of the
    ECE, its bootstrap, the reliability diagram and histogram binning. values in [0, 1], (...) -> (...) long."""
    return (values * bins).long().clamp(0, bins - 1)


def _compute(confidence: Tensor, correct: Tensor, index: Tensor, bins: int) -> Tensor:
    """sum_b |sum_{i in b} (correct_i - confidence_i)| / N, given each input's bin index."""
    gap = torch.zeros(bins, dtype=torch.float64, device=confidence.device)
    gap.index_add_(0, index, correct - confidence)
    return gap.abs().sum() / len(confidence)
