"""The losses whose gradients Taylor importance reads.

With labels: cross-entropy. Without labels: the information entropy of the model's predictions (paper 002,
§3.3) — of the softmax over classes for a classifier, or, for an encoder without a classifier, of the softmax
over in-batch cosine similarities of its pooled embeddings (Eq. 5-7).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ..uncertainty import entropy


def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy. logits (B, C), labels (B,) -> scalar."""
    return F.cross_entropy(logits.float(), labels.to(logits.device))


def prediction_entropy(logits: Tensor) -> Tensor:
    """Mean entropy of softmax(logits): E = -(1/B) sum_i sum_c p_ic log p_ic. logits (B, C) -> scalar."""
    return entropy(logits.float().softmax(dim=-1)).mean()


def similarity_entropy(embeddings: Tensor, temperature: float = 1 / 15) -> Tensor:
    """Label-free entropy of an encoder (paper 002, Eq. 5-7).

    s_ij = cos(z_i, z_j); p_ij = softmax_j(s_ij / tau); E = -(1/B) sum_i sum_j p_ij log p_ij.
    Shape: embeddings (B, D) -> scalar. Needs B >= 2 (with B = 1 the entropy is constantly zero).
    """
    if embeddings.shape[0] < 2:
        raise ValueError("the label-free similarity entropy needs batches of at least 2 examples.")
    z = F.normalize(embeddings.float(), dim=-1)
    probs = (z @ z.T / temperature).softmax(dim=-1)  # (B, B)
    return entropy(probs).mean()


def importance_loss(
    output: Tensor, labels: Tensor | None, *, loss: str, classifier: bool, temperature: float
) -> Tensor:
    """Dispatch on `loss` in {"cross_entropy", "entropy"}; `output` is logits or a pooled embedding."""
    if loss == "cross_entropy":
        if labels is None or not classifier:
            raise ValueError(
                "loss='cross_entropy' needs a classifier and batches with 'labels'; "
                "use loss='entropy' (label-free) otherwise."
            )
        return cross_entropy(output, labels)
    if loss == "entropy":
        return prediction_entropy(output) if classifier else similarity_entropy(output, temperature)
    raise ValueError(f"loss must be 'auto', 'cross_entropy' or 'entropy', got {loss!r}.")


def has_labels(batches: list) -> bool:
    return all(batch.get("labels") is not None for batch in batches)


__all__ = ["cross_entropy", "has_labels", "importance_loss", "prediction_entropy", "similarity_entropy"]
