"""A module's train/eval modes, held for a block and given back."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """`module` in eval mode within the block; after it, every submodule's own mode is given back, not the top
    module's spread over all (`module.train(was_training)` would switch on the dropout of members a wrapper in
    training mode holds in eval mode)."""
    modes = {sub: sub.training for sub in module.modules()}
    try:
        yield module.eval()
    finally:
        for sub, training in modes.items():
            sub.training = training
