"""Input checks shared by the metrics: a clear error where a metric would otherwise crash obscurely (an index
out of range) or return a silently wrong value (NaN placed differently by each OOD metric)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def check_probs(probs: Tensor, labels: Tensor, metric: str) -> None:
    """probs (N, C) and labels (N,), N > 0, no NaN."""
    if probs.ndim != 2 or tuple(labels.shape) != tuple(probs.shape[:1]) or probs.shape[0] == 0:
        raise ValueError(
            f"{metric} needs probs (N, C) and labels (N,) with N > 0, got {tuple(probs.shape)} and "
            f"{tuple(labels.shape)}."
        )
    bad = int(torch.isnan(probs).any(dim=1).sum())
    if bad:
        raise ValueError(
            f"{metric}: {bad} row(s) of the probabilities hold NaN (for example logits that overflowed to inf in "
            "bf16); fix them before measuring."
        )


def check_scores(scores: np.ndarray, metric: str) -> None:
    """OOD scores (N,) without NaN: each metric would rank a NaN differently (AUROC last, AUPR first)."""
    bad = int(np.isnan(scores).sum())
    if bad:
        raise ValueError(
            f"{metric}: {bad} OOD score(s) are NaN (for example logits that overflowed to inf in bf16); fix them "
            "before measuring."
        )
