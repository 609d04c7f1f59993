"""Seeded random draws that leave the caller's random state as it was."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with every generator torch.manual_seed sets (the CPU's and each CUDA device's) seeded from
    `seed`, and put them all back afterwards: `fork_rng(devices=[])` restored the CPU's alone, so a seeded draw
    reset the caller's CUDA stream."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
