"""Gradients with respect to a few weights only: what Taylor scores and the circuit screen both need."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn


@contextmanager
def gradients_for(model: nn.Module, weights: Sequence[Tensor]) -> Iterator[nn.Module]:
    """`model` in eval mode (no dropout) with gradients enabled for `weights` only, and recorded even inside a
    caller's `torch.no_grad()`; every parameter's `requires_grad` and the model's mode are restored on exit, also
    after an error."""
    flags = {p: p.requires_grad for p in model.parameters()}
    was_training = model.training
    try:
        model.eval().requires_grad_(False)
        for weight in weights:
            weight.requires_grad_(True)
        with torch.enable_grad():
            yield model
    finally:
        for p, flag in flags.items():
            p.requires_grad_(flag)
        model.train(was_training)
