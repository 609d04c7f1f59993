"""Area under the precision-recall curve, with OOD or ID as the positive class."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from ._checks import ood_arrays


def average_precision(scores: Tensor, is_positive: Tensor) -> float:
    """AP = sum_k (R_k - R_{k-1}) P_k over the distinct thresholds, strictest first (step-wise, no interpolation).

    P_k and R_k are precision and recall when samples with score >= the k-th threshold are called positive.
    Shape: scores (N,), is_positive (N,) bool. Matches sklearn.metrics.average_precision_score.
    """
    return _compute(*ood_arrays(scores, is_positive, "AUPR"))


def aupr_out(ood_scores: Tensor, is_ood: Tensor) -> float:
    """AUPR-Out: OOD is the positive class and `ood_scores` ("higher = more OOD") rank it (OpenOOD default).

    Shape: ood_scores (N,), is_ood (N,) bool.
    """
    return average_precision(ood_scores, is_ood)


def aupr_in(ood_scores: Tensor, is_ood: Tensor) -> float:
    """AUPR-In: ID is the positive class, ranked by the negated OOD score.

    Shape: ood_scores (N,), is_ood (N,) bool.
    """
    scores, is_ood = ood_arrays(ood_scores, is_ood, "AUPR-In")
    return _compute(-scores, ~is_ood)


def _compute(scores: np.ndarray, positive: np.ndarray) -> float:
    if not positive.any():
        raise ValueError(
            "average precision needs at least one positive sample: pass both ID and OOD samples (is_ood with "
            "True and False entries)."
        )
    order = np.argsort(-scores, kind="mergesort")
    sorted_scores, hits = scores[order], positive[order]
    last_of_run = np.r_[sorted_scores[1:] != sorted_scores[:-1], True]  # thresholds: ends of tied runs
    true_pos = np.cumsum(hits)[last_of_run]
    called = (np.arange(len(scores)) + 1)[last_of_run]
    precision, recall = true_pos / called, true_pos / positive.sum()
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))
