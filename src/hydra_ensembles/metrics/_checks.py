"""Input checks shared by the metrics: a clear error where a metric would otherwise crash obscurely (an index
out of range) or return a silently wrong value (NaN placed differently by each OOD metric)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def check_probs(probs: Tensor, labels: Tensor, metric: str) -> None:
    """probs (N, C) and labels (N,), N > 0, no NaN; each row a probability distribution (logits would give a
    negative NLL or an ECE above 1), each label a class id in [0, C)."""
    if probs.ndim != 2 or tuple(labels.shape) != tuple(probs.shape[:1]) or probs.shape[0] == 0:
        raise ValueError(
            f"{metric} needs probs (N, C) and labels (N,) with N > 0, got {tuple(probs.shape)} and "
            f"{tuple(labels.shape)}."
        )
    check_distributions(probs, metric)
    check_labels(labels, probs.shape[1], metric)


def check_distributions(probs: Tensor, metric: str) -> None:
    """probs (N, C): no NaN, each row a probability distribution."""
    bad = int(torch.isnan(probs).any(dim=1).sum())
    if bad:
        raise ValueError(
            f"{metric}: {bad} row(s) of the probabilities hold NaN (for example logits that overflowed to inf in "
            "bf16); fix them before measuring."
        )
    sums = probs.sum(dim=1, dtype=torch.float64)
    # 1e-2: bf16 probabilities (upcast or not) sum to 1 within ~4e-3; logits are off by far more
    if probs.min() < -1e-6 or probs.max() > 1 + 1e-6 or (sums - 1).abs().max() > 1e-2:
        raise ValueError(
            f"{metric} needs probabilities (each in [0, 1], each row summing to 1), got values in "
            f"[{probs.min().item():.3g}, {probs.max().item():.3g}] and row sums in [{sums.min().item():.4g}, "
            f"{sums.max().item():.4g}]: pass softmax(logits) (a predictor's `out.probs`), not logits."
        )


def check_labels(labels: Tensor, classes: int, metric: str) -> None:
    """labels: integer class ids in [0, classes) (metrics, calibration, and every cross-entropy loss, for which
    torch reports an id out of range as "Target 7 is out of bounds", or on some devices not at all)."""
    if labels.numel() and (labels.dtype.is_floating_point or labels.min() < 0 or labels.long().max() >= classes):
        if (labels == -100).any():
            got = "label -100 (cross-entropy's ignore index): drop the unlabelled ones"
        else:
            got = f"{labels.dtype} labels in [{labels.min().item()}, {labels.max().item()}]"
            if not labels.dtype.is_floating_point:
                got += ": number the classes from 0 (labels 1..C are one off), or map class names with "
                got += "hydra_ensembles.data.files.label_ids"
        raise ValueError(f"{metric} needs integer class ids in [0, {classes}) as labels, got {got}.")


def check_bins(bins: int, metric: str) -> None:
    if not isinstance(bins, int) or isinstance(bins, bool) or bins < 1:
        raise ValueError(f"{metric} needs bins >= 1 (an integer), got {bins!r}.")


def check_scores(scores: np.ndarray, metric: str, positive: np.ndarray | None = None) -> None:
    """OOD scores (N,), all finite: each metric would rank a NaN differently (AUROC last, AUPR first), and an
    overflowed logit's -inf energy would pass for the most in-distribution input of all; with `positive`, the
    labels (N,) beside them."""
    if scores.ndim != 1 or (positive is not None and positive.shape != scores.shape):
        shapes = f"{scores.shape} and {positive.shape}" if positive is not None else f"{scores.shape}"
        raise ValueError(f"{metric} needs scores and labels that are both (N,), got {shapes}.")
    bad = int((~np.isfinite(scores)).sum())
    if bad:
        raise ValueError(
            f"{metric}: {bad} OOD score(s) are NaN or infinite (for example logits that overflowed to inf in "
            "bf16); fix them before measuring."
        )


def ood_arrays(scores: Tensor | np.ndarray, is_positive: Tensor | np.ndarray, metric: str) -> tuple[np.ndarray, ...]:
    """(scores float64 (N,), is_positive bool (N,)), checked by `check_scores`. Scores are widened first
    (negating uint8 scores wraps around); flags must be bool or 0/1: class ids or OpenOOD's -1 labels would read
    as "every nonzero is OOD"."""
    scores, flags = _numpy(scores).astype(np.float64), _numpy(is_positive)
    if flags.dtype != np.bool_:
        values = np.unique(flags)
        if not np.isin(values, (0, 1)).all():
            raise ValueError(
                f"{metric} needs is_positive as bool (True = OOD) or 0/1, got the values {values[:6].tolist()}"
                f"{' ...' if len(values) > 6 else ''}: pass a mask such as labels == -1 or a group's membership."
            )
        flags = flags.astype(bool)
    check_scores(scores, metric, flags)
    return scores, flags


def _numpy(x: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().cpu().to(torch.float64 if x.is_floating_point() else x.dtype).numpy()
    return np.asarray(x)
