"""What a circuit extraction leaves behind, shared by `Circuit` (one model's heads, `search.py`) and
`JointCircuit` (both towers' heads, `joint.py`): the removal order, S after each removal and before any, the
heads kept when extraction started, which search ranked them and how many removals were ties; saved as JSON
(atomically) and loaded back, also from files written before `ties` was recorded.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import KW_ONLY, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from tqdm.auto import tqdm

from ...distributed import is_main
from ...io import write_json_atomic

TIES_ADVICE = "the circuit data does not tell those heads apart (more or harder examples would)"


@dataclass
class CircuitRecord(ABC):
    """The fields and behaviour every circuit shares; a subclass says how one head and the kept heads are
    written in JSON (`_head`, `_kept`) and in which order its candidates are scanned (`head_order`).

    removed: heads in removal order, least useful for the criterion first.
    scores: S after each removal (the winning candidate's score at that step). baseline: S before any removal.
    kept: the head map(s) when extraction started (all heads for an unpruned model).
    search: "exact" (Algorithm 1's own ranking: method "fast" or "reference" in fp32), else the approximation
        used, e.g. "multi-4-bf16" (method, `top`, precision).
    ties: for each removal, how many other candidates scored at its step left exactly the same S (with "multi",
        those removed in the same step too): where > 0, candidate order placed it. "lazy" and "screen" score a
        shortlist, so theirs are lower bounds. None where unknown (saved by a version that did not record ties).
    """

    head_order: ClassVar[str]

    criterion: str
    removed: list[tuple]
    scores: list[float]
    baseline: float
    kept: dict
    _: KW_ONLY
    search: str = "exact"
    ties: list[int | None] = field(default_factory=list)

    def tie_note(self) -> str:
        """ "k of n removals tied ..." decided by candidate order, as a sentence; "" when no removal tied."""
        tied = sum(1 for t in self.ties if t)
        if not tied:
            return ""
        known = sum(1 for t in self.ties if t is not None)
        return f"{tied} of {known} removals tied with another candidate's S (decided by {self.head_order} order)"

    def first_removed(self, budget: int | None = None) -> list[tuple]:
        """The first `budget` heads of the ranking (all of it by default)."""
        budget = len(self.removed) if budget is None else budget
        if not 0 <= budget <= len(self.removed):
            raise ValueError(f"budget must be in 0..{len(self.removed)} (the heads this circuit ranked), got {budget}.")
        return self.removed[:budget]

    def to_dict(self) -> dict:
        """A JSON-ready dict: heads as lists, layer numbers as string keys."""
        return asdict(self) | {"removed": [list(head) for head in self.removed], "kept": _string_keys(self.kept)}

    @classmethod
    def from_dict(cls, data: dict) -> CircuitRecord:
        removed = [cls._head(head) for head in data["removed"]]
        decoded = {
            "removed": removed,
            "scores": [float(s) for s in data["scores"]],
            "baseline": float(data["baseline"]),
            "kept": cls._kept(data["kept"]),
            "ties": list(data.get("ties", [None] * len(removed))),
        }
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data} | decoded)

    def save(self, path: str | os.PathLike) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> CircuitRecord:
        return cls.from_dict(json.loads(Path(path).read_text()))

    @abstractmethod
    def without(self, removed: Iterable[tuple]) -> dict:
        """The kept heads (a head map; for a joint circuit, one per tower) once `removed` heads are gone."""

    @staticmethod
    @abstractmethod
    def _head(values: list) -> tuple:
        """One head as read from JSON."""

    @staticmethod
    @abstractmethod
    def _kept(data: dict) -> dict:
        """The kept heads as read from JSON (string keys)."""


def head_map_from_json(data: dict[str, list]) -> dict[int, list[int]]:
    """A head map saved as JSON ({"layer": [heads]}) with integer layers and heads again."""
    return {int(layer): [int(h) for h in heads] for layer, heads in data.items()}


def say_ties(circuit: CircuitRecord, search: str = "circuit search") -> None:
    """Print `circuit`'s tie note and what would break the ties (main process only; nothing when none tied)."""
    note = circuit.tie_note()
    if note and is_main():
        tqdm.write(f"{search}: {note}: {TIES_ADVICE}")


def _string_keys(value: Any) -> Any:
    return {str(k): _string_keys(v) for k, v in value.items()} if isinstance(value, dict) else value
