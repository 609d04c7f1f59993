"""Disagreement between ensemble members."""

from __future__ import annotations

import torch
from torch import Tensor


def disagreement(member_logits: Tensor) -> Tensor:
    """Per input, the fraction of member pairs whose predicted classes differ (Fort et al., 2019).

    D = (1 / (M (M - 1))) sum_{m != m'} 1[argmax z_m != argmax z_m']; 0 when all members agree, 0 for M = 1.
    Shape: member_logits (B, M, C) -> (B,), float64 (any input dtype).
    """
    predictions = member_logits.argmax(dim=-1)  # (B, M)
    members = predictions.shape[1]
    if members < 2:
        return predictions.new_zeros(predictions.shape[0], dtype=torch.float64)
    differ = (predictions[:, :, None] != predictions[:, None, :]).sum(dim=(1, 2))  # ordered pairs
    return differ.double() / (members * (members - 1))
