"""The greedy search's methods: how each step picks the candidates it scores, with which scorer, and how many
heads it removes (a registry, `METHODS`); `Choice`, one method with its `top` and precision, and its name.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import ClassVar

from .criteria import CircuitCriterion
from .scoring import CandidateScorer, FastScorer, Head, ReferenceScorer, Value


class SearchMethod(ABC):
    """How each step of the greedy search picks the candidates it scores, and with which scorer."""

    exact: ClassVar[bool]  # True: the ranking of Algorithm 1 itself
    scorer: ClassVar[type[CandidateScorer]] = FastScorer

    def check(self, criterion: CircuitCriterion, name: str) -> None:  # noqa: B027 (default: no restriction)
        """Raise ValueError if the method cannot run with `criterion`."""

    def shortlist(
        self,
        remaining: list[Head],
        step: int,
        known: dict[Head, Value],
        scorer: CandidateScorer,
        removed: list[Head],
        top: int,
    ) -> list[Head]:
        """The candidates to score exactly at `step` (default: all of them)."""
        return remaining

    def evaluations(self, left: int, step: int, top: int) -> int:
        """How many candidates `shortlist` returns when `left` remain: the progress bar's unit."""
        return left

    def removals(self, top: int) -> int:
        """Heads removed per step (the best-scoring ones)."""
        return 1


class Fast(SearchMethod):
    """Exact: every candidate, scored with prefix caching and batched candidates (`scoring.FastScorer`)."""

    exact = True


class Reference(SearchMethod):
    """Exact: the literal loop, one full evaluation of the model per candidate (the oracle of `fast`)."""

    exact = True
    scorer = ReferenceScorer


class Lazy(SearchMethod):
    """Approximate: every head at the first step, then only the `top` best by their latest score."""

    exact = False

    def shortlist(self, remaining, step, known, scorer, removed, top):
        return sorted(remaining, key=known.__getitem__, reverse=True)[:top] if known else remaining  # stable

    def evaluations(self, left: int, step: int, top: int) -> int:
        return min(top, left) if step > 0 else left


class Screen(SearchMethod):
    """Approximate: the `top` best by a first-order estimate of the change in a smooth surrogate of S (one
    backward pass per step), scored exactly."""

    exact = False

    def check(self, criterion: CircuitCriterion, name: str) -> None:  # noqa: B027 (default: no restriction)
        if type(criterion).surrogate is CircuitCriterion.surrogate:
            raise ValueError(
                f"criterion {name!r} has no differentiable surrogate, which method='screen' needs: define "
                "surrogate() on it, or use method='fast'."
            )

    def shortlist(self, remaining, step, known, scorer, removed, top):
        estimate = scorer.first_order(removed)  # estimated S after removing each head
        return sorted(remaining, key=lambda head: -estimate[head])[:top]

    def evaluations(self, left: int, step: int, top: int) -> int:
        return min(top, left)


class Multi(SearchMethod):
    """Approximate: every candidate scored exactly, then the `top` best removed at once — `top` times fewer
    steps. Exact for top = 1; otherwise a head's usefulness is not re-measured after its step's other removals."""

    exact = False

    def removals(self, top: int) -> int:
        return top


METHODS: dict[str, SearchMethod] = {
    "fast": Fast(),
    "reference": Reference(),
    "lazy": Lazy(),
    "screen": Screen(),
    "multi": Multi(),
}


def search_name(method: str, top: int, precision: str) -> str:
    """ "exact" for Algorithm 1's own ranking, else the approximation: method, `top` (for the methods that use
    it), precision — e.g. "multi-4-bf16", or "fast-bf16" (every candidate scored, in bfloat16)."""
    if METHODS[method].exact and precision == "fp32":
        return "exact"
    name = method if METHODS[method].exact else f"{method}-{top}"
    return name + ("" if precision == "fp32" else f"-{precision}")


@dataclass(frozen=True)
class Choice:
    """One search: a method of `METHODS`, its `top` and its precision ("fp32" or "bf16")."""

    method: str
    top: int = 8
    precision: str = "fp32"

    def __post_init__(self):
        if self.method in METHODS and not METHODS[self.method].exact and self.top < 1:
            raise ValueError(
                f"search {self.method!r} keeps or removes the `top` best candidates a step: top must be >= 1, "
                f"got {self.top}."
            )

    @property
    def name(self) -> str:
        return search_name(self.method, self.top, self.precision)

    def steps(self, start: int, budget: int) -> range:
        """Heads removed before each of the steps that take the ranking from `start` to `budget` removals."""
        return range(start, budget, METHODS[self.method].removals(self.top))

    def evaluations(self, candidates: int, start: int, budget: int) -> int:
        """Candidate evaluations (the progress bar's unit) from `start` to `budget` removals out of `candidates`."""
        method = METHODS[self.method]
        return sum(method.evaluations(candidates - step, step, self.top) for step in self.steps(start, budget))

    def to_list(self) -> list:
        return [self.method, self.top, self.precision]
