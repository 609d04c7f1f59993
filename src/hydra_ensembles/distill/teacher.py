"""The teacher's outputs, computed once and carried in the batches (the teacher is frozen: a student trained
for many epochs never runs it again)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..data.loaders import Batch, materialize
from ..outputs import collect_member_logits, map_batches, member_outputs_of


def attach_teacher(loader: Iterable[Batch], teacher: nn.Module, progress: bool = False) -> list[dict]:
    """The batches of `loader`, each with the teacher's member outputs on its inputs added: member logits
    (B, M, C) of any classifier as `teacher_outputs` (a plain classifier is M = 1), or member Gaussians (B, M, 2)
    of a regressor as `teacher_gaussians`; float32 on the CPU."""
    batches = materialize(loader, "transfer loader")
    outputs = [
        collect_member_logits(teacher, [batch])
        for batch in tqdm(batches, desc="teacher", disable=not progress, leave=False)
    ]
    again = map_batches(teacher, batches[:1], lambda inputs: teacher(**inputs), "teacher")[0]  # the first batch
    _check_fixed_members(outputs[0], member_outputs_of(again).float().cpu())
    # (B, M, 2) alone does not tell a regressor's Gaussians from a two-class classifier's logits: the output does
    key = "teacher_gaussians" if getattr(again, "member_gaussians", None) is not None else "teacher_outputs"
    return [dict(batch) | {key: out} for batch, out in zip(batches, outputs)]


def _check_fixed_members(first: Tensor, again: Tensor) -> None:
    """Head m of a Hydra student learns member m, so member m must be one model from input to input. A teacher
    whose members change from call to call (MC dropout draws new masks at every call: its m-th sample is no
    model) would teach each head noise around the mean; refused. `first` and `again`: the member outputs of the
    first batch, computed twice."""
    if not torch.allclose(first, again, rtol=1e-3, atol=1e-3):
        gap = (first - again).abs().max().item()
        raise ValueError(
            f"the teacher's members change from call to call (the same inputs' member outputs differ by up to "
            f"{gap:.3g}; MC dropout does this): head m of a student would learn a different model at every batch. "
            "Distil an ensemble of fixed members: a deep ensemble, a Hydra Ensemble, BatchEnsemble, Packed or MIMO."
        )
