"""Hydra distillation's two phases (paper 001 §2, "Training with multi-head growth")."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..data.loaders import Batch, materialize, split_batch
from ..fusion import HydraEnsemble
from ..io import tensor_digest, weights_digest, write_json_atomic
from ..outputs import member_outputs_of
from ..training import DistillKL, GaussianKL, TrainConfig, train
from ..training.losses import teacher_mismatch
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
        train_loader: transfer batches with `teacher_outputs` (B, M, C), or `teacher_gaussians` (B, M, 2) for a
            regression student (`attach_teacher`): M heads are grown.
        phase1, phase2: how long and how each phase trains. With `val_loader` each phase keeps its epoch with
            the best `config.monitor` (use "nll": the probabilistic fit is what distillation is for) and stops
            after `patience` epochs without one ("until convergence").
        temperature: T of the KL losses (classification; regression uses the Gaussian KL: T must stay 1).
        head_layers: k, the last layers each head of a transformer student owns (0: the classifier alone).
        checkpoint_dir: each phase checkpoints every epoch (and every 10 minutes within one) under it (`phase1/`,
            `phase2/`) and resumes.
    """
    batches = materialize(train_loader, "transfer loader")
    if val_loader is not None:  # read once: both phases validate on it (a generator would be spent by phase 1)
        val_loader = materialize(val_loader, "validation loader")
    regression = getattr(student, "regression", False)
    key = "teacher_gaussians" if regression else "teacher_outputs"  # a student learns its own kind's teacher
    missing = next((batch for batch in batches if batch.get(key) is None), None)
    if missing is not None:
        raise ValueError(f"every transfer batch needs {key!r}: {teacher_mismatch(key, missing)}")
    if regression and temperature != 1:
        raise ValueError(f"a regressor is distilled by the Gaussian KL, which has no temperature; got {temperature}.")
    if student.num_members != 1:
        raise ValueError(f"distill starts from a one-head student; this one has {student.num_members} heads.")
    members = batches[0][key].shape[1]
    if members < 2:
        raise ValueError(
            "the teacher has one member: the Hydra phase would repeat the knowledge-distillation phase. Distil an "
            "ensemble (a deep ensemble, a Hydra Ensemble, ...), or train one student against it with DistillKL."
        )
    _check_unaugmented(phase1, phase2)
    _check_growth(student, head_layers)  # before phase 1, not after it
    _check_outputs(student, batches[0], key)
    loss = GaussianKL() if regression else DistillKL(temperature)
    where = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if where is not None:  # the loop's checkpoints know their config, not the teacher or the student: say which
        _claim(where, student, batches, key, members, head_layers, temperature)
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
    return student.grow(heads, head_layers) if isinstance(student, HydraEnsemble) else student.grow(heads)


def _check_unaugmented(*phases: TrainConfig) -> None:
    """The teacher's outputs were computed once, on the batches as given: an augmented batch is another input,
    whose teacher output nobody computed (a crop would be taught the whole image's distribution)."""
    augmenting = [phase.augment for phase in phases if phase.augment is not None]
    if augmenting:
        raise ValueError(
            f"distillation cannot augment its transfer batches (augment={augmenting[0]!r}): the teacher's outputs "
            "were computed on the batches as given, so an augmented image would be matched to the original's "
            "prediction. Pass the phase configs with augment=None (config.with_(augment=None))."
        )


def _check_growth(student: nn.Module, head_layers: int) -> None:
    if isinstance(student, HydraEnsemble):
        if not 0 <= head_layers <= student.num_layers:
            raise ValueError(
                f"head_layers must be in 0..{student.num_layers} (the student's layers), got {head_layers}."
            )
    elif head_layers:
        raise ValueError(
            "an MLP student's heads are set when it is built (MultiHeadMLP(head=...)): head_layers is for transformers."
        )


@torch.no_grad()
def _check_outputs(student: nn.Module, batch: Batch, key: str) -> None:
    """The student must predict what the teacher's members do: as many classes, or a (mean, log-variance) pair."""
    inputs, _ = split_batch(getattr(student, "adapter", None), batch)
    was_training = student.training
    try:
        produced = member_outputs_of(student.eval()(**inputs)).shape[-1]
    finally:
        student.train(was_training)
    taught = batch[key].shape[-1]
    if produced != taught:
        raise ValueError(
            f"the teacher's members output {taught} values per input but the student outputs {produced}: a student "
            "must predict the teacher's classes (a regressor: one (mean, log-variance) pair)."
        )


def _claim(
    where: Path, student: nn.Module, batches: list[Batch], key: str, members: int, head_layers: int, t: float
) -> None:
    """Record what the checkpoints under `where` distil; refuse to resume another distillation's."""
    identity = {
        "teacher_outputs": tensor_digest(batch[key] for batch in batches),
        "student": weights_digest(student),
        "members": members,
        "head_layers": head_layers,
        "temperature": t,
    }
    path = where / "distill.json"
    if path.exists() and json.loads(path.read_text()) != identity:
        raise ValueError(
            f"the checkpoints in {str(where)!r} belong to another distillation (teacher outputs, starting student, "
            "heads or temperature differ); delete them or pass another checkpoint_dir."
        )
    where.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, identity)
