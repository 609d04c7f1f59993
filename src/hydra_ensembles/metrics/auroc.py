"""Area under the ROC curve for OOD detection."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from ._checks import ood_arrays


def auroc(scores: Tensor, is_positive: Tensor) -> float:
    """Probability that a random positive scores higher than a random negative, ties counting one half.

    Convention (OpenOOD, the paper's): OOD samples are the positives and a score is "higher = more OOD", so for
    MSP pass `scores = 1 - msp` (as `OOD_SCORES["msp"]` does). Swapping both the positive class and the score's
    sign gives the same value.

    Formula: AUROC = (R_pos - n_pos (n_pos + 1) / 2) / (n_pos n_neg), with R_pos the sum of the positives'
    ranks among all scores (average ranks for ties) — the Mann-Whitney U statistic, normalised.
    Shape: scores (N,), is_positive (N,) bool. Raises ValueError if only one class is present.
    Reference: Fawcett, "An introduction to ROC analysis", 2006; matches sklearn.metrics.roc_auc_score.
    """
    return _compute(*ood_arrays(scores, is_positive, "AUROC"))


def _compute(scores: np.ndarray, positive: np.ndarray) -> float:
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUROC needs both positive (OOD) and negative (ID) samples; got only one class.")
    _, index, counts = np.unique(scores, return_inverse=True, return_counts=True)
    last_rank = np.cumsum(counts)  # 1-based rank of the last member of each run of tied scores
    ranks = (last_rank - (counts - 1) / 2.0)[index]  # each sample gets its run's average rank
    rank_sum = ranks[positive].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
