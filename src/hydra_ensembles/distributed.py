"""Scale-out on torch.distributed: launch with `torchrun --nproc-per-node N ...`.

Outside torchrun (or with one process) every helper is a no-op, so the same code runs on one process. The
gloo backend runs on CPU; NCCL on GPUs. Work items are sharded round-robin (`items[rank::world]`) and results
gathered to every rank, so all ranks take the same decisions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


def init_from_env(backend: str | None = None) -> bool:
    """Join the process group torchrun describes in the environment (RANK, WORLD_SIZE, ...), if any.

    Returns whether this process is now part of a group of more than one process.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        import torch

        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":  # each rank its own GPU: torch.device("cuda") then means cuda:LOCAL_RANK
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return is_distributed()


def shutdown() -> None:
    """Leave the process group at the end of a torchrun script: a barrier first, so that no rank exits while
    another still talks to it (a rank that exits with the group alive can abort with "terminate called without an
    active exception"). A no-op outside torchrun."""
    if is_distributed():
        dist.barrier()
        dist.destroy_process_group()


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of `items`, round-robin."""
    return list(items[rank() :: world_size()])


def gather_dict(local: dict[Any, Any]) -> dict[Any, Any]:
    """Merge every rank's dict; every rank receives the union."""
    if not is_distributed():
        return dict(local)
    parts: list[dict] = [{} for _ in range(world_size())]
    dist.all_gather_object(parts, local)
    merged: dict[Any, Any] = {}
    for part in parts:
        merged.update(part)
    return merged


def check_same_on_every_rank(values: Mapping[str, Any], fix: str) -> None:
    """Under torchrun, refuse on every rank alike (before work whose collectives would wait forever for a rank
    that went its own way) ranks whose `values` ({what: its digest}) differ from rank 0's, naming what differs;
    `fix` ends the message."""
    if not is_distributed():
        return
    seen = gather_dict({rank(): dict(values)})
    differ = [r for r in sorted(seen) if seen[r] != seen[0]]
    if differ:
        what = [name for name in values if any(seen[r].get(name) != seen[0].get(name) for r in differ)]
        raise ValueError(f"rank(s) {differ} hold other {' and '.join(what)} than rank 0: {fix}")


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def from_main(value: T) -> T:
    """Rank 0's `value` on every rank (`value` itself with one process): a decision every rank must take alike is
    taken on rank 0's numbers. Early stopping on each rank's own validation NLL, equal up to the last bits of
    rounding, could stop one rank an epoch before the others, which would then wait for it forever."""
    if not is_distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def sum_over_ranks(value: float) -> float:
    """`value` summed over every rank (each receives the sum); `value` itself with one process."""
    if not is_distributed():
        return value
    parts: list[float | None] = [None] * world_size()
    dist.all_gather_object(parts, value)  # any backend: NCCL has no CPU tensors, and a float needs no device
    return sum(parts)
