"""Top-1 accuracy."""

from __future__ import annotations

from torch import Tensor


def accuracy(probs_or_logits: Tensor, labels: Tensor) -> float:
    """Fraction of inputs whose arg-max class equals the label. Shapes: (N, C) and (N,)."""
    if probs_or_logits.shape[0] != labels.shape[0] or probs_or_logits.shape[0] == 0:
        raise ValueError(
            f"accuracy needs N > 0 predictions and N labels, got {probs_or_logits.shape[0]} and {labels.shape[0]}."
        )
    return (probs_or_logits.argmax(dim=-1) == labels.to(probs_or_logits.device)).double().mean().item()
