"""Top-1 accuracy."""

from __future__ import annotations

from torch import Tensor


def accuracy(probs_or_logits: Tensor, labels: Tensor) -> float:
    """Fraction of inputs whose arg-max class equals the label. Shapes: (N, C) and (N,)."""
    if probs_or_logits.ndim != 2 or tuple(labels.shape) != tuple(probs_or_logits.shape[:1]) or not len(labels):
        raise ValueError(
            f"accuracy needs predictions (N, C) and labels (N,) with N > 0, got {tuple(probs_or_logits.shape)} and "
            f"{tuple(labels.shape)}."
        )
    return (probs_or_logits.argmax(dim=-1) == labels.to(probs_or_logits.device)).double().mean().item()
