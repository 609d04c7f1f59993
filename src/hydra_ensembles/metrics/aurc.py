"""Area under the risk-coverage curve, for selective classification; the curve the other selective metrics read."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from ..uncertainty import off_top_mass
from ._checks import check_probs


def aurc(probs: Tensor, labels: Tensor) -> float:
    """AURC: the selective risk (error rate among the accepted inputs) averaged over coverage; lower is better.

    Convention: the classifier predicts argmax_c p_c and accepts the inputs whose confidence max_c p_c is at least a
    threshold t; a failure (an accepted wrong prediction) is the positive event. Every distinct confidence is a
    threshold, so tied inputs are accepted or rejected together and the value does not depend on the order of the
    rows. At threshold t: coverage c(t) = accepted / N and selective risk r(t) = errors accepted / accepted.

    Formula: the trapezoid rule over the points (c_j, r_j) of the distinct thresholds, strictest first, with r_1
    held flat down to coverage 0 (Traub et al.'s reference code, fd-shifts):
    AURC = c_1 r_1 + sum_{j>1} (c_j - c_{j-1}) (r_j + r_{j-1}) / 2.
    torch-uncertainty 0.11 instead integrates from coverage 1/N, divides by 1 - 1/N and orders tied inputs by their
    position; without ties, ours = theirs (1 - 1/N) + r_1 / N, at most 1/N apart.
    Confidences are ranked in float64 by 1 - max_c p_c summed from the other classes (`off_top_mass`), so that
    confident inputs do not round into ties at 1.0. Shape: probs (N, C); labels (N,).
    Reference: Geifman et al., "Bias-reduced uncertainty estimation for deep neural classifiers", 2019; Traub et al.,
    "Overcoming common flaws in the evaluation of selective classification systems", 2024.
    """
    return _compute(*confidence_and_error(probs, labels))


def _compute(confidence: np.ndarray, error: np.ndarray) -> float:
    coverage, errors, accepted = risk_coverage_points(confidence, error)
    risk = errors / accepted
    return area_from_zero(coverage, risk, at_zero=risk[0])


def confidence_and_error(probs: Tensor, labels: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Each input's confidence (ordered as max_c p_c: the negated off-top mass, float64) and whether its arg-max
    prediction is wrong, as numpy arrays (N,). probs (N, C), labels (N,)."""
    check_probs(probs, labels, "selective metrics")  # logits would rank by a meaningless off-top sum
    probs = probs.double()
    error = probs.argmax(dim=1) != labels.to(probs.device)
    return (-off_top_mass(probs)).detach().cpu().numpy(), error.cpu().numpy()


def risk_coverage_points(confidence: np.ndarray, error: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The risk-coverage curve at its K distinct confidence thresholds, strictest first: coverage (K,) rising to 1,
    errors accepted (K,) and inputs accepted (K,), float64. A threshold accepts every input at least as confident,
    so tied inputs enter together. confidence, error: (N,)."""
    if np.isnan(confidence).any():
        raise ValueError("a confidence is NaN: the probabilities hold NaN; fix them before the selective metrics.")
    order = np.argsort(-confidence, kind="stable")
    ranked = confidence[order]
    last_of_run = np.r_[ranked[1:] != ranked[:-1], True]  # thresholds: the ends of tied runs
    accepted = (np.arange(len(ranked)) + 1.0)[last_of_run]
    errors = np.cumsum(error[order].astype(np.float64))[last_of_run]
    return accepted / len(ranked), errors, accepted


def area_from_zero(coverage: np.ndarray, risk: np.ndarray, at_zero: float) -> float:
    """Trapezoid area under (coverage, risk), coverage rising to 1, from coverage 0 where the risk is `at_zero`."""
    first = coverage[0] * (at_zero + risk[0]) / 2
    return float(first + np.sum(np.diff(coverage) * (risk[1:] + risk[:-1]) / 2))
