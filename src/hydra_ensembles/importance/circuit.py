"""Greedy circuit extraction under a head budget (paper 000, §D.1.2, Algorithm 1).

At each step every remaining head is ablated in turn (its column block of W_o zeroed), the model is evaluated
on the ID validation set (and the OOD validation set), and the head whose removal leaves the highest score S is
removed for good. After B steps the removal order ranks the heads from least to most useful for S.

    S_acc = ID accuracy        S_ood = AUROC of MSP, ID vs OOD        S_avg = (S_acc + S_ood) / 2

Ties are broken towards the candidate that comes first in (layer, head) order — the literal `S > best` of
Algorithm 1 scanning candidates layer by layer, head by head.

This is the literal reference: it runs the whole model once per candidate per step. The ranking is saved after
every step (`state_path`), so a killed run resumed with the same arguments ends with the same ranking.
"""

from __future__ import annotations

import hashlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..adapters import get_adapter
from ..data.loaders import Batch, materialize, split_batch, to_device
from ..evaluation.metrics import accuracy, auroc
from ..io import write_json_atomic
from ..pruning import HeadMap, ablate_heads, kept_heads

STATE_VERSION = 1


# ---- criteria: one class each behind a tiny interface, chosen by name from a registry ----


class CircuitCriterion(ABC):
    """A validation score S to keep high while heads are removed."""

    needs_ood: ClassVar[bool]

    @abstractmethod
    def __call__(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        """S from ID logits (N, C), ID labels (N,) and OOD logits (N_ood, C)."""


class AccuracyCriterion(CircuitCriterion):
    """S_acc: top-1 accuracy on the ID validation set."""

    needs_ood = False

    def __call__(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        return accuracy(id_logits, id_labels)


class MSPAurocCriterion(CircuitCriterion):
    """S_ood: AUROC of the maximum softmax probability separating ID from OOD (OOD positive, score = -MSP)."""

    needs_ood = True

    def __call__(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        msp = torch.cat([id_logits, ood_logits]).double().softmax(dim=-1).amax(dim=-1)
        is_ood = torch.cat([torch.zeros(len(id_logits)), torch.ones(len(ood_logits))]).bool()
        return auroc(-msp, is_ood)


class AverageCriterion(CircuitCriterion):
    """S_avg = (S_acc + S_ood) / 2."""

    needs_ood = True

    def __call__(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        acc = AccuracyCriterion()(id_logits, id_labels, ood_logits)
        return (acc + MSPAurocCriterion()(id_logits, id_labels, ood_logits)) / 2


CRITERIA: dict[str, CircuitCriterion] = {
    "acc": AccuracyCriterion(),
    "ood": MSPAurocCriterion(),
    "avg": AverageCriterion(),
}


def register_criterion(name: str, criterion: CircuitCriterion) -> None:
    """Make `criterion` available as `extract_circuit(..., criterion=name)`."""
    CRITERIA[name] = criterion


# ---- the result ----


@dataclass
class Circuit:
    """The outcome of a circuit extraction.

    removed: heads (layer, head) in removal order, least useful for the criterion first.
    scores: S after each removal (the winning candidate's score at that step).
    baseline: S of the model before any removal.
    kept: the model's head map when extraction started (all heads for an unpruned model).
    """

    criterion: str
    removed: list[tuple[int, int]]
    scores: list[float]
    baseline: float
    kept: HeadMap
    num_heads: int

    def head_map(self, budget: int | None = None) -> HeadMap:
        """Kept heads after removing the first `budget` heads of the ranking (all of it by default)."""
        budget = len(self.removed) if budget is None else budget
        if not 0 <= budget <= len(self.removed):
            raise ValueError(f"budget must be in 0..{len(self.removed)} (the heads this circuit ranked), got {budget}.")
        gone = set(self.removed[:budget])
        return {layer: [h for h in heads if (layer, h) not in gone] for layer, heads in self.kept.items()}

    def to_dict(self) -> dict:
        data = asdict(self)
        data["removed"] = [list(x) for x in self.removed]
        data["kept"] = {str(k): v for k, v in self.kept.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Circuit:
        return cls(
            criterion=data["criterion"],
            removed=[(int(layer), int(head)) for layer, head in data["removed"]],
            scores=[float(s) for s in data["scores"]],
            baseline=float(data["baseline"]),
            kept={int(k): [int(h) for h in v] for k, v in data["kept"].items()},
            num_heads=int(data["num_heads"]),
        )

    def save(self, path: str | os.PathLike) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Circuit:
        return cls.from_dict(json.loads(Path(path).read_text()))


# ---- the extraction ----


def extract_circuit(
    model: nn.Module,
    id_loader: Iterable[Batch],
    ood_loader: Iterable[Batch] | None = None,
    criterion: str = "avg",
    budget: int = 1,
    *,
    state_path: str | os.PathLike | None = None,
    progress: bool = True,
) -> Circuit:
    """Rank heads by greedy removal (Algorithm 1); the model is left unchanged.

    Args:
        model: a supported HF classifier, pruned or not.
        id_loader: labelled ID validation batches.
        ood_loader: OOD validation batches (labels unused); required for "ood" and "avg".
        criterion: "acc", "ood", "avg", or a name added with `register_criterion`.
        budget: number of heads to remove, 1 <= budget < number of heads.
        state_path: a JSON file updated after every step; if it exists and was written for this model, data and
            criterion, extraction resumes from it.
        progress: show a progress bar over candidate evaluations.
    """
    adapter = get_adapter(model)
    if criterion not in CRITERIA:
        raise ValueError(f"unknown criterion {criterion!r}; choose from {sorted(CRITERIA)}.")
    score_fn = CRITERIA[criterion]
    if not adapter.is_classifier(model):
        raise ValueError(
            f"circuit extraction scores accuracy and MSP, which needs a classifier; {type(model).__name__} has none."
        )
    id_batches = materialize(id_loader, "id_loader")
    if any(batch.get("labels") is None for batch in id_batches):
        raise ValueError("id_loader batches need 'labels' (circuit scores use ID accuracy / MSP on labelled data).")
    ood_batches = materialize(ood_loader, "ood_loader") if score_fn.needs_ood else []
    kept = kept_heads(model)
    candidates = [(layer, h) for layer, heads in kept.items() for h in heads]
    if not 1 <= budget < len(candidates):
        raise ValueError(
            f"budget must be between 1 and {len(candidates) - 1} (the model has {len(candidates)} heads and a "
            f"circuit keeps at least one), got {budget}."
        )

    def evaluate(ablated: list[tuple[int, int]]) -> float:
        heads: dict[int, list[int]] = {}
        for layer, h in ablated:
            heads.setdefault(layer, []).append(h)
        with ablate_heads(model, heads):
            id_logits, id_labels = _logits(model, id_batches)
            ood_logits = _logits(model, ood_batches)[0] if ood_batches else None
        return score_fn(id_logits, id_labels, ood_logits)

    identity = _identity(model, id_batches, ood_batches, criterion)
    state = _load_state(state_path, identity)
    removed = [tuple(x) for x in state.get("removed", [])][:budget]
    scores = state.get("scores", [])[: len(removed)]
    baseline = state["baseline"] if "baseline" in state else evaluate([])
    steps = range(len(removed), budget)
    total = sum(len(candidates) - t for t in steps)
    with tqdm(total=total, desc=f"circuit ({criterion})", disable=not progress) as bar:
        for step in steps:
            best, best_head = -float("inf"), None
            for head in candidates:
                if head in removed:
                    continue
                s = evaluate(removed + [head])
                if s > best:  # strict: ties keep the earlier (layer, head)
                    best, best_head = s, head
                bar.update()
            removed.append(best_head)
            scores.append(best)
            bar.set_postfix(step=f"{step + 1}/{budget}", removed=f"{best_head}", S=f"{best:.4f}")
            if state_path is not None:
                write_json_atomic(
                    state_path,
                    {**identity, "removed": [list(x) for x in removed], "scores": scores, "baseline": baseline},
                )
    return Circuit(
        criterion=criterion,
        removed=[tuple(x) for x in removed],
        scores=scores,
        baseline=baseline,
        kept=kept,
        num_heads=adapter.num_heads(model),
    )


@torch.no_grad()
def _logits(model: nn.Module, batches: list[Batch]) -> tuple[Tensor, Tensor | None]:
    """Logits (N, C) and labels (N,) (None if unlabelled) over all batches, in eval mode."""
    adapter = get_adapter(model)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        logits, labels = [], []
        for batch in batches:
            inputs, batch_labels = split_batch(adapter, batch)
            logits.append(adapter.output(model, to_device(inputs, device)).float().cpu())
            if batch_labels is not None:
                labels.append(torch.as_tensor(batch_labels).cpu())
    finally:
        model.train(was_training)
    return torch.cat(logits), (torch.cat(labels) if labels else None)


def _identity(model: nn.Module, id_batches: list[Batch], ood_batches: list[Batch], criterion: str) -> dict:
    """What a saved state must match to be resumed: the criterion, the model's weights and the data."""
    return {
        "version": STATE_VERSION,
        "criterion": criterion,
        "model": _digest(t for _, t in sorted(model.state_dict().items())),
        "data": _digest(
            v for batch in id_batches + ood_batches for _, v in sorted(batch.items()) if isinstance(v, Tensor)
        ),
    }


def _digest(tensors: Iterable[Tensor]) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _load_state(path: str | os.PathLike | None, identity: dict) -> dict:
    if path is None or not Path(path).exists():
        return {}
    state = json.loads(Path(path).read_text())
    mismatched = [key for key in identity if state.get(key) != identity[key]]
    if mismatched:
        raise ValueError(
            f"the circuit state at {str(path)!r} was written for a different {', '.join(mismatched)} "
            "(criterion, model weights or validation data); delete it or pass another state_path."
        )
    return state
