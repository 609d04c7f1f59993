"""Area under the generalized risk-coverage curve (Traub et al., 2024), for selective classification."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from .aurc import area_from_zero, confidence_and_error, risk_coverage_points


def augrc(probs: Tensor, labels: Tensor) -> float:
    """AUGRC: the generalized risk (share of all inputs that are accepted and wrong) averaged over coverage; lower is
    better. It is the probability that a random input is a failure and is accepted, when the acceptance threshold
    is set by another random input.

    Convention as `aurc`: confidence max_c p_c, a failure (accepted wrong prediction) is the positive event, each
    distinct confidence is a threshold and tied inputs are accepted together. At threshold t: coverage
    c(t) = accepted / N, generalized risk g(t) = errors accepted / N.

    Formula: the trapezoid rule over (c_j, g_j) at the distinct thresholds, from (0, 0) (Traub et al.'s reference
    code, fd-shifts), which is exactly
    AUGRC = (1/N^2) sum_i err_i (#{j: conf_j < conf_i} + #{j: conf_j = conf_i} / 2)   (j = i counted in the ties)
          = (1 - AUROC_f) acc (1 - acc) + (1 - acc)^2 / 2,
    with AUROC_f the AUROC of the confidence separating right from wrong predictions (ties count half). With ties,
    it is the mean over the orders of the tied inputs of the untied value. torch-uncertainty 0.11 integrates from
    coverage 1/N and divides by 1 - 1/N instead: without ties, ours = theirs (1 - 1/N) + r_1 / (2 N^2), r_1 the
    error (0 or 1) of the most confident input. Computed in float64. Shape: probs (N, C); labels (N,).
    Reference: Traub et al., "Overcoming common flaws in the evaluation of selective classification systems",
    NeurIPS 2024.
    """
    return _compute(*confidence_and_error(probs, labels))


def _compute(confidence: np.ndarray, error: np.ndarray) -> float:
    coverage, errors, _ = risk_coverage_points(confidence, error)
    return area_from_zero(coverage, errors / len(confidence), at_zero=0.0)
