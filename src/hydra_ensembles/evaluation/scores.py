"""Every OOD score by name, of any predictor over a loader: what `predict --score` and `evaluate --score` call.

A logit score (`ood.OOD_SCORES`) reads the member logits of any predictor. Any other name is a feature score
("mds", "rmds", "knn", "vim", each also "<name>_concat"; `predictors.feature_ood`), which needs a predictor carrying
detectors fit on its training features (`predictors.fit_feature_scores`), possibly under wrappers that change its
logits. It is found by what it offers, `ood_scores(inputs, name) -> (member logits, scores)`: evaluation and
predictors are independent floors (pyproject.toml's import contracts), so this module names no predictor class.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..outputs import collect_member_logits, map_batches, member_logits_of
from .ood import OOD_SCORES

MEMBER_SCORES = ("mutual_information", "disagreement")  # 0 for every input of a one-member model


@torch.no_grad()
def collect_scores(
    model: nn.Module, loader: Iterable[Mapping[str, Any]], score: str, progress: bool = False
) -> tuple[Tensor, Tensor]:
    """Member logits (N, M, C) float32 on the CPU and OOD scores (N,) float64 of any classifier over a loader of
    batches, by any logit score (`OOD_SCORES`), or any feature score the model has fitted detectors for. One
    forward pass per batch; two for a feature score when a wrapper that changes the logits sits over the detectors."""
    if score == "energy" and _returns_log_probs(model):
        raise ValueError(
            "OOD score 'energy' reads the logits' scale, and this model's outputs are normalised log-probabilities "
            "(a probability calibration map: histogram or isotonic), whose energy is 0 up to rounding: "
            "score the model before calibration, or use msp, entropy or max_logit."
        )
    if score in OOD_SCORES:
        logits = collect_member_logits(model, loader, progress)
        return logits, OOD_SCORES[score](logits.double())
    scored = detectors_of(model, score)

    def step(inputs: dict[str, Any]) -> tuple[Tensor, Tensor]:
        part_logits, part_scores = scored.ood_scores(inputs, score)
        if scored is not model:  # a wrapper over the detectors changes the logits: its own pass
            part_logits = member_logits_of(model(**inputs))
        return part_logits.float().cpu(), part_scores.cpu()

    logits, scores = zip(*map_batches(model, loader, step, "scoring", progress, empty="nothing to score"), strict=True)
    return torch.cat(logits), torch.cat(scores)


def check_flags_something(score: str, member_logits: Tensor) -> None:
    """Refuse a member-disagreement score of a one-member model where a threshold is set on it (`predict`):
    every score is 0, so nothing could ever be flagged. (`evaluate` measures it: AUROC 50, the chance level.)"""
    if score in MEMBER_SCORES and member_logits.shape[1] == 1:
        raise ValueError(
            f"OOD score {score!r} measures how the members disagree, and this model has one member (a single "
            "model, or a probability calibration map that returns the ensemble's): every score is 0, so nothing "
            "would be flagged. Use msp, entropy, max_logit or energy."
        )


def _returns_log_probs(model: nn.Module) -> bool:
    """Whether `model`, or a model in its chain of wrappers (each holds the next as `base`: a precision or compile
    wrapper, fitted detectors, MC dropout), is calibrated by a probability map (`predictors.calibration`: its
    member logits are one member's log-probabilities), told by what it holds: this floor names no predictor
    class."""
    maps = (getattr(inner, "calibration_map", None) for inner in _chain(model))
    return any(found is not None and not getattr(found, "on_members", True) for found in maps)


def _chain(model: nn.Module):
    """`model` and the models it is built on, outermost first: each wrapper holds the next as `base` (the duck-typed
    twin of `predictors.wrapper.wrapper_chain`, which this floor cannot import)."""
    while True:
        yield model
        following = getattr(model, "base", None)
        if not isinstance(following, nn.Module) or following is model:
            return
        model = following


def detectors_of(model: nn.Module, score: str) -> nn.Module:
    """The predictor in `model`'s chain of wrappers (each holds the next as `base`) that carries fitted
    detectors, or a ValueError that says how to fit them."""
    inner = next((inner for inner in _chain(model) if hasattr(inner, "ood_scores")), None)
    if inner is None:
        raise ValueError(
            f"OOD score {score!r} is not a logit score ({', '.join(sorted(OOD_SCORES))}); a feature score reads "
            "detectors fit on training features, and this model has none: fit them with "
            "`hydra-ens ood --model MODEL --data train.csv --out DIR` and pass DIR as --model "
            "(in Python: predictors.fit_feature_scores(model, train_loader))."
        )
    return inner
