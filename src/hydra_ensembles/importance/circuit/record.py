"""What a circuit extraction leaves behind, shared by `Circuit` (one model's heads, `search.py`) and
`JointCircuit` (both towers' heads, `joint.py`): the removal order, S after each removal and before any, the
heads kept when extraction started, which search and tie rule ranked them and how many removals were ties;
saved as JSON (atomically) and loaded back, also from files written before `ties` or `tie_break` was recorded.
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
from .criteria import TIE_BREAKS

TIES_ADVICE = "the circuit data does not tell those heads apart (more or harder examples would)"


@dataclass
class CircuitRecord(ABC):
    """The fields and behaviour every circuit shares; a subclass says how one head and the kept heads are
    written in JSON (`_head`, `_kept`) and in which order its candidates are scanned (`head_order`).

    removed: heads in removal order, least useful for the criterion first.
    scores: S after each removal (the winning candidate's score at that step); with "multi", the S of each head
        removed alone on top of its step's start, so S after the step is known only for its first head. baseline:
        S before any removal.
    kept: the head map(s) when extraction started (all heads for an unpruned model).
    search: "exact" (every candidate scored at every step, in fp32: method "fast" or "reference"; Algorithm 1's
        own ranking where `tie_break` is "order", and where it is "score" wherever S alone decided), else the
        approximation used, e.g. "multi-4-bf16" (method, `top`, precision).
    tie_break: the tie rule candidates were compared by (`criteria.TIE_BREAKS`): "score" (S, then the
        criterion's continuous secondary score) or "order" (S alone, Algorithm 1's literal rule; files saved before
        the rule was recorded used it).
    ties: for each removal, how many other candidates scored at its step were equal to it under `tie_break` (S,
        and for "score" the secondary score too; with "multi", those removed in the same step count too): where
        > 0, the data did not decide it and candidate order placed it. "lazy" and "screen" score a shortlist, so
        theirs are lower bounds. None where unknown (saved by a version that did not record ties).
    """

    head_order: ClassVar[str]

    criterion: str
    removed: list[tuple]
    scores: list[float]
    baseline: float
    kept: dict
    _: KW_ONLY
    search: str = "exact"
    tie_break: str = "order"
    ties: list[int | None] = field(default_factory=list)

    def tied(self) -> int:
        """Removals the data did not decide (tied with another candidate under `tie_break`)."""
        return sum(1 for t in self.ties if t)

    def tie_note(self) -> str:
        """ "k of n removals tied ..." under which rule, as a sentence; "" when no removal's ties are known."""
        known = sum(1 for t in self.ties if t is not None)
        if not known:
            return ""
        rule = f'tie rule "{self.tie_break}": {TIE_BREAKS[self.tie_break].says}'
        return f"{self.tied()} of {known} removals tied ({rule}; equal ones decided by {self.head_order} order)"

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
    """Print `circuit`'s tie note and, when some removals tied, what would break the ties (main process only;
    nothing when no removal's ties are known)."""
    note = circuit.tie_note()
    if note and is_main():
        tqdm.write(f"{search}: {note}" + (f": {TIES_ADVICE}" if circuit.tied() else ""))


def _string_keys(value: Any) -> Any:
    return {str(k): _string_keys(v) for k, v in value.items()} if isinstance(value, dict) else value
