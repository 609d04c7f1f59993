"""Selective risk at a given coverage."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from .aurc import confidence_and_error, risk_coverage_points


def risk_at_coverage(probs: Tensor, labels: Tensor, coverage: float = 0.8) -> float:
    """The error rate among the most confident inputs when at least `coverage` of them are accepted (default 80 %):
    the risk of automating that share; lower is better.

    Convention as `aurc`: confidence max_c p_c, thresholds at the distinct confidences, a failure (accepted wrong
    prediction) is the positive event. Formula: r(t*) = errors accepted / accepted at the strictest threshold t*
    with c(t*) = accepted / N >= coverage, i.e. the ceil(coverage N) most confident inputs, and with them every
    input tied with the last of them (tied inputs are accepted together, so the value does not depend on the order
    of the rows); "at least" allows 1e-9 of an input for the float64 rounding of coverage * N (0.28 * 25 rounds to
    7.000000000000001). Without ties it is torch-uncertainty's RiskAtxCov. Shape: probs (N, C); labels (N,).
    Reference: Geifman & El-Yaniv, "Selective classification for deep neural networks", 2017.
    """
    return _compute(*confidence_and_error(probs, labels), coverage)


def _compute(confidence: np.ndarray, error: np.ndarray, coverage: float) -> float:
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}.")
    _, errors, accepted = risk_coverage_points(confidence, error)
    first = int(np.argmax(accepted >= coverage * len(confidence) - 1e-9))  # the last point (all inputs) always is
    return float(errors[first] / accepted[first])
