"""What a circuit search costs, and which search fits a time budget (method "auto").

A search's time is, to a good approximation, its number of candidate evaluations (the progress bar's unit,
`Choice.evaluations`) times the cost of one evaluation over all the validation examples. A short timed probe
measures that cost on the actual data and model (`probe_seconds`: every candidate of the first step on the first
batch of examples, so the batch shapes are the search's own; after one untimed warm-up call). Later steps run a
smaller model but their candidates' layers vary, so the estimate can err either way; the pace check after every
step is what keeps the budget.

`plan_search` picks the most accurate search of `ladder` predicted to fit, or raises before any real work,
naming what does fit: a subsample of the validation data (`--max-examples`, sized from the measured per-example
cost) or the coarsest search. A refused search keeps its probe beside its state file (`save_probe`), so the rerun
on a subsample or with more time plans from it rather than probing again (minutes on a 12-layer model).
During the search, `Pace` compares the measured with the predicted time after every step and, once the remaining
removals would overrun the budget at the measured pace, switches them to the most accurate coarser search that fits
— a warning says so, and the circuit records from which removal; when none fits, the search stops after the step,
its state saved, and `TimeBudgetExceeded` says what finishes it. We fall back before we stop: the removals already
made keep their meaning (the coarser search continues the same greedy ranking from the same removed heads, as
`multi` and bf16 always do), and the first removals, which decide the members' heads, stay as exact as the budget
allowed.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ...data.loaders import TARGETS, Batch, per_example, rebatch
from ...data.loaders import batch_size as examples_in
from ...distributed import gather_dict, is_main, world_size
from ...io import write_json_atomic
from ...pruning import kept_heads
from .methods import Choice
from .scoring import FastScorer

AUTO_MULTI_TOPS = (2, 4, 8)  # "auto"'s coarser searches: multi removing 2, 4 or 8 heads per step
SUBSAMPLE_MARGIN = 0.9  # a suggested subsample is sized to 90 % of the time left: the probe's own noise
MIN_SUBSAMPLE = 8  # fewer examples than this leave S (accuracy, AUROC) so coarse that most removals tie: not offered
Clock = Callable[[], float]


# ---- measured costs ----


def probe_seconds(
    model: nn.Module,
    id_batches: list[Batch],
    ood_batches: list[Batch],
    batch_size: int = 16,
    precision: str = "fp32",
    clock: Clock = time.perf_counter,
) -> float:
    """Seconds of one candidate evaluation over all the ID and OOD examples at `precision`: the first step's
    candidates timed on the first batch of examples, per candidate, scaled to all the examples."""
    candidates = [(layer, h) for layer, heads in kept_heads(model).items() for h in heads]
    chunks = rebatch(id_batches + ood_batches, batch_size)
    scorer = FastScorer(model, chunks[:1], [], None, batch_size=batch_size, precision=precision)  # outputs only
    scorer.outputs([], candidates[:1], lambda n: None)  # warm-up, untimed: a first call (bf16 most) runs slow
    started = clock()
    scorer.outputs([], candidates, lambda n: None)
    per_example = (clock() - started) / examples_in(chunks[0])
    return per_example * sum(map(examples_in, chunks)) / len(candidates)


class Costs:
    """Seconds of one candidate evaluation over all the examples, per precision; each precision is probed the first
    time it is asked for (`probe`), and the probes' own seconds add up in `probe_s`."""

    def __init__(self, probe: Callable[[str], tuple[float, float]], examples: tuple[int, int], known=None):
        self.probe, self.examples = probe, examples
        self.per_candidate: dict[str, float] = dict(known or {})
        self.probe_s = 0.0
        self.reused: str | None = None  # the file of a refused run's probe these costs came from, if any

    def per(self, precision: str) -> float:
        if precision not in self.per_candidate:
            self.per_candidate[precision], seconds = self.probe(precision)
            self.probe_s += seconds
        return self.per_candidate[precision]

    def seconds(self, choice: Choice, candidates: int, start: int, budget: int, examples: int | None = None) -> float:
        """Predicted seconds of `choice` from `start` to `budget` removals, on all examples or `examples` of them."""
        scale = 1.0 if examples is None else examples / sum(self.examples)
        return self.per(choice.precision) * choice.evaluations(candidates, start, budget) * scale

    def subsampled(self, max_examples: int) -> int:
        """Examples left by `--max-examples max_examples` (ID and OOD each capped)."""
        return sum(min(max_examples, n) for n in self.examples)


def costs_of(
    model: nn.Module,
    id_batches: list[Batch],
    ood_batches: list[Batch],
    batch_size: int = 16,
    clock: Clock = time.perf_counter,
) -> Costs:
    """The costs of searching `model`'s heads on these examples, each precision probed when first asked for."""
    examples = (sum(map(examples_in, id_batches)), sum(map(examples_in, ood_batches)))
    return Costs(prober(model, id_batches, ood_batches, batch_size, clock), examples)


def probe_path(state_path: str | os.PathLike) -> Path:
    """Where a search refused for time keeps its probe: beside its state file."""
    return Path(f"{state_path}.probe.json")


def save_probe(path: Path, costs: Costs, model_digest: str, batch_size: int) -> None:
    """Keep what the probes measured, per example (a rerun may read another number of examples), for this model,
    batch size and number of processes."""
    per_example = {precision: s / sum(costs.examples) for precision, s in costs.per_candidate.items()}
    write_json_atomic(path, _probe_identity(model_digest, batch_size) | {"per_example_s": per_example})


def reuse_probe(path: Path, costs: Costs, model_digest: str, batch_size: int) -> None:
    """Take a refused run's probe (`save_probe`) into `costs` if it was measured for this model, batch size and
    number of processes; otherwise leave `costs` to probe. Rank 0 reads it for every rank (as it probes for all)."""
    saved = json.loads(path.read_text()) if is_main() and path.exists() else None
    saved = gather_dict({"probe": saved} if is_main() else {})["probe"]
    identity = _probe_identity(model_digest, batch_size)
    if saved is None or any(saved.get(key) != value for key, value in identity.items()):
        return
    costs.per_candidate = {precision: s * sum(costs.examples) for precision, s in saved["per_example_s"].items()}
    costs.reused = str(path)


def _probe_identity(model_digest: str, batch_size: int) -> dict:
    """What a probe's timing holds for: these weights, this batch size, this many processes."""
    return {"model": model_digest, "batch_size": batch_size, "world_size": world_size()}


def prober(model, id_batches, ood_batches, batch_size: int, clock: Clock) -> Callable[[str], tuple[float, float]]:
    """probe(precision) -> (seconds per candidate evaluation, seconds the probe took): rank 0's, shared by every
    rank (each scores 1/N of the candidates, hence / N), so every rank makes the same choice."""

    def probe(precision: str) -> tuple[float, float]:
        started = clock()
        seconds = probe_seconds(model, id_batches, ood_batches, batch_size, precision, clock)
        shared = gather_dict({"probe": (seconds, clock() - started)} if is_main() else {})["probe"]
        return shared[0] / world_size(), shared[1]

    return probe


# ---- the choice ----


def ladder(costs: Costs, top: int = 8, precision: str = "fp32") -> list[Choice]:
    """The searches "auto" may run, most accurate first: the exact fast search (at `precision`), the fast search in
    bf16, then `multi` removing 2, 4 or 8 heads per step — in bf16 if it measured faster than fp32 here (bf16
    rounding moves the ranking far less than removing several heads per step; docs/circuits.md), else in fp32.
    Probes bf16 (a CPU without bf16 arithmetic can run it slower than fp32)."""
    coarse = "bf16" if costs.per("bf16") < costs.per("fp32") else "fp32"
    rungs = [Choice("fast", top, precision)]
    if precision == "fp32" and coarse == "bf16":
        rungs.append(Choice("fast", top, "bf16"))
    return rungs + [Choice("multi", k, coarse) for k in AUTO_MULTI_TOPS]


@dataclass
class Plan:
    """Method "auto"'s choice: `choice` (the first rung of `rungs` predicted to fit), its predicted seconds for
    the whole search (`predicted_s`, the probe and any earlier run's time included), the probe's seconds."""

    choice: Choice
    costs: Costs
    rungs: list[Choice]
    time_budget: float
    predicted_s: float
    probe_s: float
    resumed: bool = False

    def coarser_than(self, choice: Choice) -> list[Choice]:
        """The rungs after `choice`; the whole ladder is measured (bf16 probed) the first time it is needed."""
        if len(self.rungs) == 1:
            self.rungs = ladder(self.costs, self.rungs[0].top, self.rungs[0].precision)
        names = [rung.name for rung in self.rungs]  # by name: an exact search's `top` is not part of it
        return self.rungs[names.index(choice.name) + 1 :] if choice.name in names else []

    def note(self) -> str:
        probe = f"a {self.probe_s:.1f}-s probe, counted in the budget"
        if self.resumed:
            probe = "a saved probe (resumed)"
        elif self.costs.reused and not self.probe_s:
            probe = f"the probe of the run refused for time, {self.costs.reused}"
        return (
            f"{self.choice.name} predicted at {self.predicted_s / 60:.1f} min of the {_duration(self.time_budget)} "
            f"budget (from {probe}; the most accurate search that fits)"
        )

    def to_state(self) -> dict:
        return {
            "choice": self.choice.to_list(),
            "rungs": [rung.to_list() for rung in self.rungs],
            "per_candidate_s": self.costs.per_candidate,
            "predicted_s": self.predicted_s,
            "probe_s": self.probe_s,
        }

    @classmethod
    def from_state(cls, saved: dict, costs: Costs, time_budget: float) -> Plan:
        costs.per_candidate.update(saved["per_candidate_s"])
        rungs = [Choice(*rung) for rung in saved["rungs"]]
        return cls(Choice(*saved["choice"]), costs, rungs, time_budget, saved["predicted_s"], saved["probe_s"], True)


def plan_search(
    costs: Costs,
    candidates: int,
    budget: int,
    time_budget: float,
    elapsed: Callable[[], float],
    top: int = 8,
    precision: str = "fp32",
) -> Plan:
    """The most accurate search predicted to finish `budget` removals out of `candidates` within `time_budget`
    seconds, counting what `elapsed()` says is spent already (the probes included). Raises ValueError, before any
    step, when none fits, naming what does. bf16 is probed only when the exact search does not fit."""
    exact = Choice("fast", top, precision)
    rungs = [exact]
    predicted = costs.seconds(exact, candidates, 0, budget)  # first: it runs the probe, whose time elapsed() counts
    if elapsed() + predicted > time_budget:
        rungs = ladder(costs, top, precision)
    for rung in rungs:
        predicted = costs.seconds(rung, candidates, 0, budget)
        if elapsed() + predicted <= time_budget:
            return Plan(rung, costs, rungs, time_budget, elapsed() + predicted, costs.probe_s)
    raise ValueError(nothing_fits(costs, rungs, candidates, budget, time_budget, elapsed()))


def nothing_fits(costs: Costs, rungs: list[Choice], candidates: int, budget: int, time_budget: float, spent: float):
    """The message when no search fits: the fastest search's predicted time, and what fits instead (the exact and
    the coarsest search on a subsample, more time), as CLI flags and Python keywords."""
    fastest = rungs[-1]
    needed = spent + costs.seconds(fastest, candidates, 0, budget)
    n_id, n_ood = costs.examples
    data = f"{n_id} ID" + (f" + {n_ood} OOD" if n_ood else "") + " examples"
    offers = []
    for rung in dict.fromkeys((rungs[0], fastest)):  # the most accurate search on fewer examples, the fastest
        n = largest_subsample(costs, rung, candidates, budget, SUBSAMPLE_MARGIN * (time_budget - spent))
        if n >= MIN_SUBSAMPLE:  # `auto` stays: on n examples it plans again and keeps the budget
            minutes = costs.seconds(rung, candidates, 0, budget, costs.subsampled(n)) / 60
            offers.append(
                f"`--max-examples {n}` (max_examples={n}: {rung.name} on at most {n} ID and {n} OOD examples, "
                f"~{minutes:.1f} min)"
            )
    offers.append(f"`--time-budget {math.ceil(needed / 60)}m` (time_budget={math.ceil(needed)}: {fastest.name} on all)")
    return (
        f"no circuit search fits the time budget of {_duration(time_budget)} on {data}: the fastest, {fastest.name}, "
        f"is predicted at {needed / 60:.1f} min ({spent:.1f} s of it spent already, the probe included). What fits: "
        + "; or ".join(offers)
        + "."
    )


def auto_choice(
    model: nn.Module,
    id_batches: list[Batch],
    ood_batches: list[Batch],
    budget: int,
    time_budget: float = 1800.0,
    *,
    top: int = 8,
    precision: str = "fp32",
    batch_size: int = 16,
) -> Choice:
    """The search `extract_circuit(method="auto")` would run on these examples (probing now, as it would)."""
    started = time.perf_counter()
    costs = costs_of(model, id_batches, ood_batches, batch_size)
    candidates = sum(map(len, kept_heads(model).values()))
    elapsed = lambda: time.perf_counter() - started  # noqa: E731
    return plan_search(costs, candidates, budget, time_budget, elapsed, top, precision).choice


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def largest_subsample(costs: Costs, choice: Choice, candidates: int, budget: int, seconds: float) -> int:
    """The largest `--max-examples` n (< the larger split) with which `choice` is predicted within `seconds`; 0 if
    none."""
    low, high = 0, max(costs.examples) - 1  # invariant: n = low fits (0 trivially), n > high is not a subsample
    while low < high:
        middle = (low + high + 1) // 2
        if costs.seconds(choice, candidates, 0, budget, costs.subsampled(middle)) <= seconds:
            low = middle
        else:
            high = middle - 1
    return low


# ---- during the search ----


@dataclass
class Pace:
    """Method "auto"'s clock during the search. After each step (`step_done`), the measured seconds of the steps so
    far against their prediction give a pace (measured / predicted); `check` projects the remaining removals at
    that pace and, if they would end past the budget, returns the most accurate coarser rung that fits, with a
    warning naming measured vs predicted; if none fits, it sets `stop` (the search stops after this step, its state
    saved, rather than overrun) with a message naming the time that would finish it."""

    plan: Plan
    candidates: int
    budget: int
    measured: float = 0.0
    predicted: float = 0.0
    stop: str | None = None  # set when even the coarsest search would overrun: the search stops after this step
    said: list[str] = field(default_factory=list)
    saved: bool = True  # whether the search keeps a state (state_path) that a rerun resumes

    def step_done(self, choice: Choice, evaluations: int, seconds: float) -> None:
        self.measured += seconds
        self.predicted += self.plan.costs.per(choice.precision) * evaluations

    def check(self, choice: Choice, removed: int, elapsed: float) -> Choice | None:
        """The search to run the removals from `removed` on with, if not `choice`; `elapsed`: seconds spent so far
        (every rank passes rank 0's)."""
        if removed >= self.budget or not self.predicted or self.stop:
            return None
        pace, costs, limit = self.measured / self.predicted, self.plan.costs, self.plan.time_budget
        ends = elapsed + pace * costs.seconds(choice, self.candidates, removed, self.budget)
        if ends <= limit:
            return None
        before = costs.probe_s
        coarser = self.plan.coarser_than(choice)  # may probe bf16: its seconds count
        elapsed += costs.probe_s - before
        projected = [
            (rung, elapsed + pace * costs.seconds(rung, self.candidates, removed, self.budget)) for rung in coarser
        ]
        fitting = [(rung, end) for rung, end in projected if end <= limit]
        rung, end = fitting[0] if fitting else projected[-1] if projected else (choice, ends)
        said = (
            f"after {removed} of {self.budget} removals, {self.measured:.0f} s measured against {self.predicted:.0f} s "
            f"predicted ({pace:.2f}x): {choice.name} would end at {ends / 60:.1f} min of the {_duration(limit)} budget"
        )
        if fitting and rung != choice:
            said += f"; the remaining {self.budget - removed} removals run {rung.name} (~{end / 60:.1f} min in all)"
        if not fitting:  # the budget is a promise: stop, the state saved, rather than overrun
            minutes = math.ceil(end / 60)
            again = (
                f"The {removed} removals made are saved: run it again with a time budget of at least {minutes} min "
                "to finish them (it resumes)"
                if self.saved
                else f"Nothing was saved (no state_path): run it again with a state_path and a time budget of at "
                f"least {minutes} min"
            )
            self.stop = (
                f"circuit search stopped by its time budget: {said}, and nothing coarser fits (the coarsest would "
                f"end at {end / 60:.1f} min). {again}, or on fewer examples (--max-examples / max_examples, a new "
                "search)."
            )
            return None
        self._warn(f"circuit search: {said}.")
        return rung if rung != choice else None

    def _warn(self, message: str) -> None:
        self.said.append(message)
        if is_main():
            warnings.warn(message, RuntimeWarning, stacklevel=3)


class TimeBudgetExceeded(RuntimeError):
    """Method "auto" stopped a search that no coarser search could finish within its time budget; its state is
    saved (a state path given), so a run with a larger budget resumes it."""


# ---- fewer examples ----


def subsample(batches: Sequence[Batch], max_examples: int | None, seed: int = 0) -> list[Batch]:
    """At most `max_examples` examples of `batches`, drawn without replacement by `seed` and kept in their order,
    in batches of the first batch's size (all of `batches` when they hold no more)."""
    batches = list(batches)
    total = sum(map(examples_in, batches))
    if max_examples is None or total <= max_examples:
        return batches
    if max_examples < 1:
        raise ValueError(f"max_examples must be at least 1, got {max_examples}.")
    chosen = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:max_examples].sort().values
    pieces, start = [], 0
    for batch in batches:
        count = examples_in(batch)
        rows = chosen[(chosen >= start) & (chosen < start + count)] - start
        if len(rows):
            pieces.append({k: v[rows] if per_example(v) else v for k, v in batch.items()})
        start += count
    return regroup(pieces, examples_in(batches[0]))


def regroup(pieces: list[Batch], size: int) -> list[Batch]:
    """`pieces` concatenated and cut into batches of `size`, targets (`TARGETS`) cut alongside the inputs; token
    inputs right-padded to the longest of all pieces (masked, as `rebatch` does)."""
    inputs = rebatch(pieces, size)  # drops the targets
    carried = [key for key in TARGETS if any(p.get(key) is not None for p in pieces)]
    for key in carried:
        if any(p.get(key) is None for p in pieces):
            raise ValueError(f"some batches carry {key!r} and others do not: give every batch its {key!r}.")
    targets = {key: torch.cat([p[key] for p in pieces]) for key in carried}
    return [
        batch | {key: values[i * size : (i + 1) * size] for key, values in targets.items()}
        for i, batch in enumerate(inputs)
    ]
