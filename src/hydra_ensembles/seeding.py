"""Seeded random draws that leave the caller's random state as it was."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def seeded(seed: int, device: torch.device | str = "cpu") -> Iterator[None]:
    """Run the block with the CPU generator, and `device`'s when it is a CUDA device (where a model on it draws
    its dropout masks), seeded from `seed`, and put them back afterwards. torch.manual_seed would also (lazily)
    seed every CUDA device, which `fork_rng(devices=[])` did not put back: the caller's CUDA stream was reset."""
    device = torch.device(device)
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(seed)
        for index in cuda:
            torch.cuda.default_generators[index].manual_seed(seed)
        yield
