"""Evaluate member logits on ID data and OOD sets, in the shape of the paper's tables.

Classification metrics use the ensemble's predictive distribution (mean of member softmaxes). OOD metrics
follow OpenOOD: OOD is the positive class, the score is "higher = more OOD"; near-OOD and far-OOD sets are
averaged separately and all OOD sets together.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from .. import metrics as M
from ..cost import count_flops, count_parameters
from ..data.loaders import Batch
from ..io import torch_save_atomic
from ..outputs import collect_member_logits, labels_of
from ..uncertainty import ensemble_probs, mutual_information
from .ood import OOD_SCORES

CLASSIFICATION = ("acc", "brier", "nll", "ece", "aece", "disagreement", "mi")
OOD = ("auroc", "fpr95", "aupr_in", "aupr_out")


def classification_metrics(member_logits: Tensor, labels: Tensor) -> dict[str, float]:
    """acc, brier, nll, ece, aece of the ensemble prediction, in float64, and how much the members differ: the
    mean pairwise disagreement of their top-1 classes and the mean mutual information (nats; both 0 for one
    member). member_logits (N, M, C), labels (N,)."""
    probs = ensemble_probs(member_logits.double())
    return {
        "disagreement": M.disagreement(member_logits.double()).mean().item(),
        "mi": mutual_information(member_logits.double()).mean().item(),
        "acc": M.accuracy(probs, labels),
        "brier": M.brier(probs, labels),
        "nll": M.nll(probs, labels),
        "ece": M.ece(probs, labels),
        "aece": M.adaptive_ece(probs, labels),
    }


def ood_metrics(
    id_member_logits: Tensor, ood_member_logits: Tensor, score: str = "msp", positive: Literal["ood", "id"] = "ood"
) -> dict[str, float]:
    """auroc, fpr95, aupr_in, aupr_out separating ID (N, M, C) from OOD (N', M, C) by an OOD score.

    positive="ood" (default, OpenOOD): FPR95 is the fraction of ID inputs flagged when 95% of OOD inputs are.
    positive="id" (the older Hendrycks & Gimpel convention): ID is the positive class scored by -score, FPR95 is
    the fraction of OOD inputs accepted when 95% of ID inputs are. AUROC is the same number either way;
    AUPR-In / AUPR-Out always mean "ID positive" / "OOD positive".
    """
    if score not in OOD_SCORES:
        raise ValueError(f"unknown OOD score {score!r}; choose one of {sorted(OOD_SCORES)}.")
    if positive not in ("ood", "id"):
        raise ValueError(f"positive must be 'ood' or 'id', got {positive!r}.")
    score_fn = OOD_SCORES[score]
    scores = torch.cat([score_fn(id_member_logits), score_fn(ood_member_logits)]).double()
    is_ood = torch.cat([torch.zeros(len(id_member_logits)), torch.ones(len(ood_member_logits))]).bool()
    fpr95 = M.fpr_at_tpr(scores, is_ood) if positive == "ood" else M.fpr_at_tpr(-scores, ~is_ood)
    return {
        "auroc": M.auroc(scores, is_ood),
        "fpr95": fpr95,
        "aupr_in": M.aupr_in(scores, is_ood),
        "aupr_out": M.aupr_out(scores, is_ood),
    }


def evaluate(
    id_member_logits: Tensor,
    labels: Tensor,
    near: Mapping[str, Tensor] | None = None,
    far: Mapping[str, Tensor] | None = None,
    score: str = "msp",
    positive: Literal["ood", "id"] = "ood",
    ood: Mapping[str, Tensor] | None = None,
) -> dict[str, object]:
    """All metrics of one model. `near` / `far` / `ood` map OOD set names to their member logits (N', M, C);
    `ood` sets are neither near nor far and count only towards "all".

    Returns {"id": {acc, brier, nll, ece, aece, disagreement, mi}, "ood": {set: {auroc, ...}}, "near"/"far"/"all":
    averages}.
    """
    near, far, ood = dict(near or {}), dict(far or {}), dict(ood or {})
    clash = (set(near) & set(far)) | (set(near) & set(ood)) | (set(far) & set(ood))
    if clash:
        raise ValueError(f"OOD set name(s) {sorted(clash)} are given twice; name every set differently.")
    result: dict[str, object] = {"id": classification_metrics(id_member_logits, labels), "ood": {}}
    for name, logits in {**near, **far, **ood}.items():
        result["ood"][name] = ood_metrics(id_member_logits, logits, score, positive)
    everything = list(near) + list(far) + list(ood)
    for group, names in (("near", list(near)), ("far", list(far)), ("all", everything)):
        if names:
            result[group] = {k: float(np.mean([result["ood"][n][k] for n in names])) for k in OOD}
    return result


def measure(
    predictor: nn.Module,
    test: list[Batch],
    near: Mapping[str, list[Batch]],
    far: Mapping[str, list[Batch]],
    logits_path: Path,
    ood: Mapping[str, list[Batch]] | None = None,
    progress: bool = False,
) -> dict:
    """Metrics on the labelled test set and the OOD sets, parameters and FLOPs per example. Member logits are
    saved to `logits_path` (for figures). `ood` sets count only towards "all"."""
    test_logits = collect_member_logits(predictor, test, progress)
    logits = {"test": test_logits}
    for group, sets in (("near", near), ("far", far), ("ood", ood or {})):
        logits[group] = {name: collect_member_logits(predictor, data, progress) for name, data in sets.items()}
    torch_save_atomic(logits, logits_path)
    probe = {k: v[:8] for k, v in test[0].items() if k != "labels"}
    stored = getattr(predictor, "stored_parameters", None)
    return {
        "metrics": evaluate(test_logits, labels_of(test), logits["near"], logits["far"], ood=logits["ood"]),
        "params": stored if stored is not None else count_parameters(predictor),
        "flops_per_example": count_flops(predictor, probe) / len(next(iter(probe.values()))),
    }
