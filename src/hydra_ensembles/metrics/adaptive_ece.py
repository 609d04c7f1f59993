"""Adaptive expected calibration error: equal-mass confidence bins."""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_bins, check_probs
from .ece import _compute


def adaptive_ece(probs: Tensor, labels: Tensor, bins: int = 15) -> float:
    """aECE: the ECE formula over `bins` bins holding (nearly) equal numbers of inputs.

    Inputs are sorted by top-1 confidence and split into `bins` consecutive groups whose sizes differ by at most
    one (the first N mod bins groups get the extra input), so every bin is populated where ECE's equal-width
    bins would leave most of them empty for a confident model. aECE = sum_b (n_b / N) |acc_b - conf_b|.

    Ties: inputs with equal confidence always share a bin, the bin of the first of them in sorted order (a run
    of ties that crosses a bin boundary goes whole to the lower bin). So the value does not depend on the order
    of the rows; with ties, bins are equal-mass up to the tied runs, and a bin may end up empty (it adds nothing).
    Computed in float64. Shape: probs (N, C); labels (N,).
    Reference: Nixon et al., "Measuring calibration in deep learning", 2019.
    """
    check_probs(probs, labels, "adaptive ECE")
    check_bins(bins, "adaptive ECE")
    confidence, prediction = probs.double().max(dim=1)
    correct = (prediction == labels.to(probs.device)).double()
    return _bins_and_compute(confidence, correct, bins).item()


def _bins_and_compute(confidence: Tensor, correct: Tensor, bins: int) -> Tensor:
    count = len(confidence)
    order = torch.argsort(confidence, stable=True)
    sizes = [count // bins + (1 if b < count % bins else 0) for b in range(min(bins, count))]
    position_bin = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)).to(confidence.device)
    _, run, run_length = torch.unique_consecutive(confidence[order], return_inverse=True, return_counts=True)
    run_start = torch.cumsum(run_length, 0) - run_length  # sorted position of each run's first input
    index = torch.empty(count, dtype=torch.long, device=confidence.device)
    index[order] = position_bin[run_start[run]]  # every input takes the bin of its run's first input
    return _compute(confidence, correct, index, len(sizes))
