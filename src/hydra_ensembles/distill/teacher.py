"""The teacher's outputs, computed once and carried in the batches (the teacher is frozen: a student trained
for many epochs never runs it again)."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn
from tqdm.auto import tqdm

from ..data.loaders import Batch, materialize
from ..outputs import collect_member_logits


def attach_teacher(loader: Iterable[Batch], teacher: nn.Module, progress: bool = False) -> list[dict]:
    """The batches of `loader`, each with the teacher's member outputs on its inputs added as `teacher_outputs`:
    member logits (B, M, C) of any predictor (a plain classifier is M = 1), or member Gaussians (B, M, 2) of a
    regressor; float32 on the CPU."""
    batches = materialize(loader, "transfer loader")
    return [
        dict(batch) | {"teacher_outputs": collect_member_logits(teacher, [batch])}
        for batch in tqdm(batches, desc="teacher", disable=not progress, leave=False)
    ]
