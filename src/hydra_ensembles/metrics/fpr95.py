"""False-positive rate at 95% true-positive rate, for OOD detection."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from ._checks import ood_arrays


def fpr_at_tpr(scores: Tensor, is_positive: Tensor, tpr: float = 0.95) -> float:
    """Fraction of negatives flagged at the strictest threshold that flags at least `tpr` of the positives.

    Convention (OpenOOD, the paper's): OOD samples are the positives and a score is "higher = more OOD"; a
    sample is flagged when its score >= threshold. FPR95 = the fraction of ID samples flagged when 95% of the
    OOD samples are caught: the threshold is the ceil(0.95 n_OOD)-th highest OOD score, so ties are flagged
    together (the first point of sklearn.metrics.roc_curve, without dropping intermediate thresholds, whose TPR
    reaches 0.95). Shape: scores (N,), is_positive (N,) bool.
    """
    return _compute(*ood_arrays(scores, is_positive, "FPR at TPR"), tpr)


def _compute(scores: np.ndarray, positive: np.ndarray, tpr: float) -> float:
    if not 0 < tpr <= 1:
        raise ValueError(f"FPR at TPR needs a true-positive rate in (0, 1], got {tpr}.")
    if positive.all() or not positive.any():
        raise ValueError("FPR at TPR needs both positive (OOD) and negative (ID) samples; got only one class.")
    positives = np.sort(scores[positive])[::-1]
    needed = int(np.ceil(tpr * len(positives) - 1e-12))  # positives the threshold must catch
    threshold = positives[max(needed, 1) - 1]  # the strictest threshold catching them: the needed-th highest
    return float((scores[~positive] >= threshold).mean())
