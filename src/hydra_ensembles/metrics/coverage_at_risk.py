"""Coverage at a given selective risk."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from .aurc import confidence_and_error, risk_coverage_points


def coverage_at_risk(probs: Tensor, labels: Tensor, risk: float = 0.05) -> float:
    """The largest share of the inputs that a confidence threshold accepts while the error rate among them is at most
    `risk` (default 5 %): how much can be automated at that error rate; higher is better.

    Convention as `aurc`: confidence max_c p_c, thresholds at the distinct confidences (tied inputs are accepted
    together, so the value does not depend on the order of the rows), a failure (accepted wrong prediction) is the
    positive event. Formula: max { c(t) : r(t) <= risk } with c(t) = accepted / N and r(t) = errors accepted /
    accepted; "at most" allows 1e-9 of an error for the float64 rounding of risk * accepted. The risk need not fall
    monotonically as coverage shrinks: the largest qualifying coverage is taken, wherever it is. 0 when no threshold
    qualifies (even the most confident inputs fail more often: only abstaining on everything meets the risk), where
    torch-uncertainty's CovAtxRisk returns NaN; otherwise, without ties, its value. Shape: probs (N, C); labels (N,).
    Reference: Geifman & El-Yaniv, "Selective classification for deep neural networks", 2017.
    """
    return _compute(*confidence_and_error(probs, labels), risk)


def _compute(confidence: np.ndarray, error: np.ndarray, risk: float) -> float:
    if not 0 <= risk <= 1:
        raise ValueError(f"risk must be in [0, 1], got {risk}.")
    coverage, errors, accepted = risk_coverage_points(confidence, error)
    within = errors <= risk * accepted + 1e-9
    return float(coverage[within].max()) if within.any() else 0.0
