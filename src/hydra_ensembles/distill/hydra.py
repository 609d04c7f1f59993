"""Hydra distillation's two phases (paper 001 §2, "Training with multi-head growth")."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..data.loaders import Batch, materialize
from ..fusion import HydraEnsemble
from ..training import DistillKL, GaussianKL, TrainConfig, train
from .students import MultiHeadMLP

Student = HydraEnsemble | MultiHeadMLP


@dataclass
class Distilled:
    """The two students of one distillation: `kd`, the one-head student after phase 1 (Hinton et al.'s knowledge
    distillation on the ensemble mean, the baseline), and `hydra`, M heads grown from it and trained against
    the M members (phase 2). `temperature`: the one both were trained at."""

    kd: Student
    hydra: Student
    temperature: float


def distill(
    student: Student,
    train_loader: Iterable[Batch],
    *,
    phase1: TrainConfig,
    phase2: TrainConfig,
    temperature: float = 1.0,
    head_layers: int = 0,
    val_loader: Iterable[Batch] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> Distilled:
    """Distil the teacher whose outputs the batches carry into `student`, in two phases.

    Args:
        student: a one-head student: `HydraEnsemble.fuse([model])` for a transformer classifier (the body is
            its first L - head_layers layers), or `MultiHeadMLP(..., heads=1)`. Trained in place in phase 1.
        train_loader: transfer batches with `teacher_outputs` (B, M, C) (`attach_teacher`): M heads are grown.
        phase1, phase2: how long and how each phase trains. With `val_loader` each phase keeps its epoch with
            the best validation NLL and stops after `patience` epochs without one ("until convergence").
        temperature: T of the KL losses (classification; regression uses the Gaussian KL, no temperature).
        head_layers: k, the last layers each head of a transformer student owns (0: the classifier alone).
        checkpoint_dir: each phase checkpoints every epoch under it (`phase1/`, `phase2/`) and resumes.
    """
    batches = materialize(train_loader, "transfer loader")
    if any(batch.get("teacher_outputs") is None for batch in batches):
        raise ValueError(
            "every transfer batch needs 'teacher_outputs': build them with attach_teacher(loader, teacher)."
        )
    if student.num_members != 1:
        raise ValueError(f"distill starts from a one-head student; this one has {student.num_members} heads.")
    members = batches[0]["teacher_outputs"].shape[1]
    loss = GaussianKL() if getattr(student, "regression", False) else DistillKL(temperature)
    where = Path(checkpoint_dir) if checkpoint_dir is not None else None
    common = {"loss": loss, "val_loader": val_loader, "progress": progress}
    kd = train(
        student, batches, phase1, checkpoint_dir=where and where / "phase1", desc="distil: Hinton head", **common
    )
    hydra = _grow(kd, members, head_layers)
    hydra = train(
        hydra, batches, phase2, checkpoint_dir=where and where / "phase2", desc=f"distil: {members} heads", **common
    )
    return Distilled(kd=kd, hydra=hydra, temperature=temperature)


def _grow(student: nn.Module, heads: int, head_layers: int) -> Student:
    if isinstance(student, HydraEnsemble):
        return student.grow(heads, head_layers)
    if head_layers:
        raise ValueError(
            "an MLP student's heads are set when it is built (MultiHeadMLP(head=...)): head_layers is for transformers."
        )
    return student.grow(heads)
