"""Evaluate member logits on ID data and OOD sets, in the shape of the paper's tables.

Classification metrics use the ensemble's predictive distribution (mean of member softmaxes). OOD metrics
follow OpenOOD: OOD is the positive class, the score is "higher = more OOD"; near-OOD and far-OOD sets are
averaged separately and all OOD sets together.
Selective classification (`selective_metrics`) and split conformal coverage (`conformal_metrics`) are what
`hydra-ens evaluate` adds to its report, from the test logits it keeps; the benchmark tables leave them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from .. import metrics as M
from ..cost import count_flops, stored_parameters
from ..data.loaders import Batch
from ..io import torch_save_atomic
from ..outputs import labels_of
from ..uncertainty import ensemble_probs, mutual_information
from .conformal import REPORTED, split_evaluation
from .ood import OOD_SCORES
from .scores import collect_scores

CLASSIFICATION = ("acc", "brier", "nll", "ece", "aece", "disagreement", "mi")
OOD = ("auroc", "fpr95", "aupr_in", "aupr_out")
SELECTIVE = ("aurc", "augrc", "risk_at_coverage", "coverage_at_risk")
COVERAGE_LEVEL, RISK_LEVEL = 0.8, 0.05  # where risk_at_coverage and coverage_at_risk are read (torch-uncertainty's)


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


def selective_metrics(
    member_logits: Tensor, labels: Tensor, coverage: float = COVERAGE_LEVEL, risk: float = RISK_LEVEL
) -> dict[str, float]:
    """aurc, augrc, risk_at_coverage (at `coverage`) and coverage_at_risk (at `risk`) of the ensemble prediction,
    its confidence max_c p_c deciding which inputs are accepted (`metrics.aurc`), in float64.
    member_logits (N, M, C), labels (N,)."""
    probs = ensemble_probs(member_logits.double())
    return {
        "aurc": M.aurc(probs, labels),
        "augrc": M.augrc(probs, labels),
        "risk_at_coverage": M.risk_at_coverage(probs, labels, coverage),
        "coverage_at_risk": M.coverage_at_risk(probs, labels, risk),
    }


def conformal_metrics(member_logits: Tensor, labels: Tensor, alpha: float, splits: int = 100) -> dict[str, dict]:
    """Split conformal at miscoverage `alpha` with each score (THR, APS, RAPS at their defaults) on labelled data
    alone: {score: mean and std of the test coverage and mean set size over `splits` seeded random halves}
    (`conformal.split_evaluation`). member_logits (N, M, C), labels (N,)."""
    return {score: split_evaluation(member_logits, labels, alpha, score, splits) for score in REPORTED}


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
    for kind, logits in (("ID", id_member_logits), ("OOD", ood_member_logits)):
        if not isinstance(logits, Tensor) or logits.dim() != 3:
            got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise ValueError(
                f"the {kind} member logits must be a tensor (N, M, C), got {got}: collect a loader's with "
                "hydra_ensembles.outputs.collect_member_logits."
            )
    if id_member_logits.shape[1:] != ood_member_logits.shape[1:]:
        raise ValueError(
            f"the OOD member logits (N', M, C) = {tuple(ood_member_logits.shape)} do not match the ID ones "
            f"{tuple(id_member_logits.shape)} in members or classes: pass the same predictor's logits on both."
        )
    score_fn = OOD_SCORES[score]
    return separation_metrics(score_fn(id_member_logits), score_fn(ood_member_logits), positive)


def separation_metrics(
    id_scores: Tensor, ood_scores: Tensor, positive: Literal["ood", "id"] = "ood"
) -> dict[str, float]:
    """`ood_metrics` of scores already computed (higher = more OOD): ID (N,) and OOD (N',), e.g. a feature
    score's (`scores.collect_scores`)."""
    if positive not in ("ood", "id"):
        raise ValueError(f"positive must be 'ood' or 'id', got {positive!r}.")
    scores = torch.cat([id_scores, ood_scores]).double()
    is_ood = torch.cat([torch.zeros(len(id_scores)), torch.ones(len(ood_scores))]).bool()
    fpr95 = M.fpr_at_tpr(scores, is_ood) if positive == "ood" else M.fpr_at_tpr(-scores, ~is_ood)
    return {
        "auroc": M.auroc(scores, is_ood),
        "fpr95": fpr95,
        "aupr_in": M.aupr_in(scores, is_ood),
        "aupr_out": M.aupr_out(scores, is_ood),
    }


def ood_sets(*groups: Mapping[str, Any] | None) -> dict[str, Any]:
    """The OOD sets of every group (near, far, ood: {name: data}) in one dict, refusing a name given twice (one
    would replace the other, and "all" would average fewer sets)."""
    for group in groups:
        if group is not None and not isinstance(group, Mapping):
            raise TypeError(f"OOD sets go by name: pass {{name: data}}, got {type(group).__name__}.")
    names = [name for group in groups for name in group or {}]
    clash = sorted({name for name in names if names.count(name) > 1})
    if clash:
        raise ValueError(f"OOD set name(s) {clash} are given twice; name every set differently.")
    return {name: data for group in groups for name, data in (group or {}).items()}


def evaluate(
    id_member_logits: Tensor,
    labels: Tensor,
    near: Mapping[str, Tensor] | None = None,
    far: Mapping[str, Tensor] | None = None,
    score: str = "msp",
    positive: Literal["ood", "id"] = "ood",
    ood: Mapping[str, Tensor] | None = None,
    id_scores: Tensor | None = None,
    ood_scores: Mapping[str, Tensor] | None = None,
) -> dict[str, object]:
    """All metrics of one model. `near` / `far` / `ood` map OOD set names to their member logits (N', M, C);
    `ood` sets are neither near nor far and count only towards "all". OOD metrics use `score` of the logits, or
    scores already computed: `id_scores` (N,) of the test set and `ood_scores` of every OOD set by name.

    Returns {"id": {acc, brier, nll, ece, aece, disagreement, mi}, "ood": {set: {auroc, ...}}, "near"/"far"/"all":
    averages}.
    """
    if (id_scores is None) != (ood_scores is None):
        raise ValueError(
            "id_scores and ood_scores go together: pass both (scores already computed) or neither (the logits "
            "scored by `score`)."
        )
    every_set = ood_sets(near, far, ood)  # refuses sets not given by name, and a name given twice
    near, far = dict(near or {}), dict(far or {})
    result: dict[str, object] = {"id": classification_metrics(id_member_logits, labels), "ood": {}}
    for name, logits in every_set.items():
        if ood_scores is None:
            result["ood"][name] = ood_metrics(id_member_logits, logits, score, positive)
        else:
            result["ood"][name] = separation_metrics(id_scores, ood_scores[name], positive)
    for group, names in (("near", list(near)), ("far", list(far)), ("all", list(result["ood"]))):
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
    score: str = "msp",
) -> dict:
    """Metrics on the labelled test set and the OOD sets, parameters and FLOPs per example. Member logits are
    saved to `logits_path` (for figures). `ood` sets count only towards "all". OOD metrics by `score`: a logit
    score (`OOD_SCORES`), or a feature score of a predictor with fitted detectors (`scores.collect_scores`)."""
    test_logits, test_scores = collect_scores(predictor, test, score, progress)
    logits, scores = {"test": test_logits}, {}
    for group, sets in (("near", near), ("far", far), ("ood", ood or {})):
        collected = {name: collect_scores(predictor, data, score, progress) for name, data in sets.items()}
        logits[group] = {name: pair[0] for name, pair in collected.items()}
        scores |= {name: pair[1] for name, pair in collected.items()}
    torch_save_atomic(logits, logits_path)
    probe = {k: v[:8] for k, v in test[0].items() if k != "labels"}
    metrics = evaluate(
        test_logits,
        labels_of(test),
        logits["near"],
        logits["far"],
        ood=logits["ood"],
        id_scores=test_scores,
        ood_scores=scores,
    )
    return {
        "metrics": metrics,
        "params": stored_parameters(predictor),
        "flops_per_example": count_flops(predictor, probe) / len(next(iter(probe.values()))),
    }
