"""Top-1 accuracy."""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_labels


def accuracy(probs_or_logits: Tensor, labels: Tensor) -> float:
    """Fraction of inputs whose arg-max class equals the label. Shapes: (N, C) and (N,); probabilities or logits
    (the arg-max is the same), without NaN, and labels integer class ids in [0, C)."""
    if probs_or_logits.ndim != 2 or tuple(labels.shape) != tuple(probs_or_logits.shape[:1]) or not len(labels):
        raise ValueError(
            f"accuracy needs predictions (N, C) and labels (N,) with N > 0, got {tuple(probs_or_logits.shape)} and "
            f"{tuple(labels.shape)}."
        )
    bad = int(torch.isnan(probs_or_logits).any(dim=1).sum())
    if bad:
        raise ValueError(f"accuracy: {bad} row(s) of the predictions hold NaN; fix them before measuring.")
    check_labels(labels, probs_or_logits.shape[1], "accuracy")
    return (probs_or_logits.argmax(dim=-1) == labels.to(probs_or_logits.device)).double().mean().item()
