"""Greedy circuit extraction under a head budget (paper 000, §D.1.2, Algorithm 1).

At each step every remaining head is ablated in turn (its column block of W_o zeroed), the model is evaluated
on the ID validation set (and the OOD validation set), and the head whose removal leaves the highest score S is
removed for good. After B steps the removal order ranks the heads from least to most useful for S.

    S_acc = ID accuracy        S_ood = AUROC of MSP, ID vs OOD        S_avg = (S_acc + S_ood) / 2

S counts examples, so on small or easy validation data many candidates can leave exactly the same S (on a
fine-tuned MPNet-base on BBC News all 144 first-step candidates leave S = 1.0). Under the default tie rule
`tie_break="score"` candidates are compared by (S, the criterion's continuous secondary score: minus the ID NLL,
the mean MSP gap ID - OOD, or their mean; `criteria.py`); `tie_break="order"` compares S alone, the literal
`S > best` of Algorithm 1. What is still equal goes to the candidate first in (layer, head) order. The search
records, for each removal, how many other candidates tied with it under the rule used (`Circuit.ties`: removals
the data could not decide), and says how many removals that order decided.

`method="reference"` is the literal loop (the whole model once per candidate per step); the default
`method="fast"` computes the same scores with prefix caching and batched candidates (see `scoring.py`). The
ranking is saved after every step (`state_path`), so a killed run resumed with the same arguments ends with
the same ranking.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ...adapters import get_adapter
from ...data.loaders import Batch, materialize
from ...distributed import barrier, check_same_on_every_rank, gather_dict, is_main, shard, world_size
from ...io import batches_digest, weights_digest, write_json_atomic
from ...pruning import HeadMap, kept_heads
from .budget import (
    Clock,
    Pace,
    Plan,
    TimeBudgetExceeded,
    costs_of,
    plan_search,
    probe_path,
    probe_seconds,
    reuse_probe,
    save_probe,
    subsample,
)
from .criteria import CRITERIA, TIE_BREAKS, CircuitCriterion
from .methods import METHODS, Choice
from .record import CircuitRecord, head_map_from_json, say_ties
from .scoring import CandidateScorer, Head, Value

STATE_VERSION = 1


# ---- the result ----


@dataclass
class Circuit(CircuitRecord):
    """The outcome of a circuit extraction over one model's heads (layer, head); the fields it shares with
    `JointCircuit` are `CircuitRecord`'s.

    num_heads: heads per layer of the unpruned model.
    note: why that search (method "auto": its predicted time against the time budget, and any fallback).
    timing: seconds: "measured_s" (the extraction's wall time, its probe and earlier runs' steps included); under
        method "auto" also "chose" (the search it started with), "predicted_s", "probe_s", "time_budget_s",
        "per_candidate_s" (the measured seconds of one candidate evaluation, per precision) and "switched" (the
        removals from which a coarser search ran: [[removal, search], ...]). Empty in files saved before.
    """

    head_order: ClassVar[str] = "(layer, head)"

    removed: list[Head]
    kept: HeadMap
    num_heads: int
    note: str = ""
    timing: dict = field(default_factory=dict)

    def head_map(self, budget: int | None = None) -> HeadMap:
        """Kept heads after removing the first `budget` heads of the ranking (all of it by default)."""
        return self.without(self.first_removed(budget))

    def without(self, removed: Iterable[Head]) -> HeadMap:
        gone = set(removed)
        return {layer: [h for h in heads if (layer, h) not in gone] for layer, heads in self.kept.items()}

    def removal_steps(self) -> Tensor:
        """(L, H): the step at which each head was removed (1 = first); heads never removed get len(removed) + 1
        (the most useful), heads pruned before extraction likewise."""
        steps = torch.full((len(self.kept), self.num_heads), float(len(self.removed) + 1))
        for step, (layer, head) in enumerate(self.removed, start=1):
            steps[layer, head] = step
        return steps

    @staticmethod
    def _head(values: list) -> Head:
        layer, head = values
        return int(layer), int(head)

    @staticmethod
    def _kept(data: dict) -> HeadMap:
        return head_map_from_json(data)


# ---- the extraction ----


def extract_circuit(
    model: nn.Module,
    id_loader: Iterable[Batch],
    ood_loader: Iterable[Batch] | None = None,
    criterion: str = "avg",
    budget: int | None = None,
    *,
    method: str = "auto",
    time_budget: float = 1800.0,
    max_examples: int | None = None,
    sample_seed: int = 0,
    batch_size: int = 16,
    top: int = 8,
    precision: str = "fp32",
    tie_break: str = "score",
    state_path: str | os.PathLike | None = None,
    progress: bool = True,
    clock: Clock = time.perf_counter,
) -> Circuit:
    """Rank heads by greedy removal (Algorithm 1); the model is left unchanged.

    Args:
        model: a supported HF classifier, pruned or not.
        id_loader: labelled ID validation batches.
        ood_loader: OOD validation batches (labels unused); required for "ood" and "avg".
        criterion: "acc", "ood", "avg", or a name added with `register_criterion`.
        budget: number of heads to remove, 1 <= budget < number of heads (default: two thirds of the model's heads,
            the pool `sample_members` draws members from; the paper's §B.5 draws ViT-B/16's members from a pool of 100
            of its 144).
        method: "auto" (default): a short timed probe measures one candidate evaluation on this data (its seconds
            count against `time_budget`), each search's time is predicted from it (`importance.circuit.budget`),
            and the most accurate that fits runs: "fast" (exact), else the fast search in bf16, else "multi"
            removing 2, 4 or 8 heads per step. When none fits, a ValueError says so before any step and names what
            fits (`max_examples`, the coarsest search, more time); for a family the fused engine refuses
            (`Adapter.fusion_unsupported`), "reference". During the search the clock is checked after
            every step: if the remaining removals would overrun at the measured pace, they run the most accurate
            coarser search that fits, with a warning naming measured vs predicted seconds (the removals made so
            far keep their meaning; `Circuit.search`, `note` and `timing` say from which removal).
            "fast" (exact: prefix caching and batched candidates, see `importance.circuit.scoring`),
            "reference" (the literal loop, one full evaluation per candidate), or one of two approximate modes
            that score exactly only `top` candidates per step: "lazy" (the best-scoring so far; every head is
            scored at the first step) or "screen" (the best by a first-order estimate of the change in a smooth
            surrogate of S, from one backward pass per step). See docs/circuits.md for how far they agree.
        time_budget: seconds the whole extraction may take under method "auto", the probe included.
        max_examples: score on at most this many ID and this many OOD examples, each drawn without replacement by
            `sample_seed` (deterministic) and kept in their order; None: all.
        batch_size: examples per batch for the fast scorer (the candidates of a layer multiply it).
        top: candidates scored exactly per step by "lazy" and "screen"; heads removed per step by "multi" (every
            candidate scored exactly, then the `top` best removed at once: `top` times fewer steps).
        precision: "fp32" (exact) or "bf16" (candidates scored under bfloat16 autocast: 1.6-2.0x faster end to end on
            a Xeon with AMX, an approximation: near-ties between candidates can resolve differently).
        tie_break: how candidates that leave the same S are ordered: "score" (default: by the criterion's
            continuous secondary score, e.g. minus the ID NLL for "acc"; a criterion without one falls back to
            "order" and says so) or "order" (Algorithm 1's literal `S > best`: (layer, head) order). Every
            method applies it; `Circuit.tie_break` records the rule used and `Circuit.ties` what it left undecided.
        state_path: a JSON file updated after every step; if it exists and was written for this model, data,
            criterion, search and tie rule, extraction resumes from it ("fast" and "reference" states are
            interchangeable; under "auto", with the search, probe and fallbacks it saved).
        progress: show a progress bar over all the candidate evaluations of the extraction (its total is known
            from the start, so the time estimate covers the whole run; it moves within a step, a batch of
            candidates at a time, and its postfix names the removal being searched).
        clock: seconds, for the time budget (tests pass a fake one).

    Under `torchrun --nproc-per-node N` (a torch.distributed group), each rank scores a round-robin share of
    the candidates and the scores are gathered, so every rank removes the same head; "auto" uses rank 0's probe
    and clock divided by N, and every rank makes the same choices.
    """
    started = clock()
    adapter = get_adapter(model)
    if criterion not in CRITERIA:
        raise ValueError(f"unknown criterion {criterion!r}; choose from {sorted(CRITERIA)}.")
    if method not in METHODS and method != "auto":
        raise ValueError(f"unknown method {method!r}; choose from {sorted(METHODS) + ['auto']}.")
    score_fn = CRITERIA[criterion]
    tie_break, tie_said = tie_rule(tie_break, score_fn, criterion)
    if not adapter.is_classifier(model):
        raise ValueError(
            f"circuit extraction scores accuracy and MSP, which needs a classifier; {type(model).__name__} has none."
        )
    id_batches = subsample(materialize(id_loader, "id_loader"), max_examples, sample_seed)
    if any(batch.get("labels") is None for batch in id_batches):
        raise ValueError("id_loader batches need 'labels' (circuit scores use ID accuracy / MSP on labelled data).")
    ood_batches = (
        subsample(materialize(ood_loader, "ood_loader"), max_examples, sample_seed) if score_fn.needs_ood else []
    )
    kept = kept_heads(model)
    candidates = [(layer, h) for layer, heads in kept.items() for h in heads]
    budget = 2 * (len(candidates) // 3) if budget is None else budget
    if not 1 <= budget < len(candidates):
        raise ValueError(
            f"budget must be between 1 and {len(candidates) - 1} (the model has {len(candidates)} heads and a "
            f"circuit keeps at least one), got {budget}."
        )
    if tie_said and progress and is_main():
        tqdm.write(f"circuit search: {tie_said}")
    base = _identity(model, id_batches, ood_batches, criterion) | {"tie_break": tie_break}
    saved = _load_state(state_path, base)
    spent = float(saved.get("elapsed_s", 0.0))  # earlier runs' seconds (states saved before timing: none)

    def elapsed() -> float:
        return spent + clock() - started

    def elapsed_shared() -> float:  # rank 0's, so that every rank makes the same choice
        return gather_dict({"elapsed": elapsed()} if is_main() else {})["elapsed"]

    plan, unpaced = None, ""
    if method == "auto" and (why := adapter.fusion_unsupported(model)):  # the others score on the fused engine
        method = "reference"
        unpaced = (
            f"auto ran the literal search, the one that runs this model ({why}); it has no time estimate, so the "
            f"time budget of {time_budget / 60:.1f} min is not enforced"
        )
        if is_main():
            warnings.warn(f"circuit search: {unpaced}.", RuntimeWarning, stacklevel=2)
    if method == "auto":  # a resumed search keeps the plan it saved: no new probe, the same search
        if progress and is_main() and "plan" not in saved:
            tqdm.write(f"circuit search: timing one step's candidates on {batch_size} examples to plan the search")
        costs = costs_of(model, id_batches, ood_batches, batch_size, clock)
        plan = (
            Plan.from_state(saved["plan"], costs, time_budget)
            if "plan" in saved
            else _plan(
                costs,
                len(candidates),
                budget,
                time_budget,
                elapsed_shared,
                top,
                precision,
                state_path,
                base["model"],
                batch_size,
            )
        )
        if progress and is_main():
            tqdm.write(f"circuit search: {plan.note()}")
    first = plan.choice if plan else Choice(method, top, precision)
    METHODS[first.method].check(score_fn, criterion)
    options = {"batch_size": batch_size, "tie_break": tie_break}

    def scorer_for(choice: Choice) -> CandidateScorer:
        return METHODS[choice.method].scorer(
            model, id_batches, ood_batches, score_fn, precision=choice.precision, **options
        )

    pace = Pace(plan, len(candidates), budget, saved=state_path is not None) if plan else None
    ranking = greedy_removal(
        candidates,
        scorer_for,
        budget,
        first,
        base | {"search": first.name},
        state_path,
        progress,
        f"circuit ({criterion}",
        pace=pace,
        elapsed=elapsed,
        extra_state=(lambda: {"plan": plan.to_state()}) if plan else None,
        clock=clock,
    )
    timing = {"measured_s": elapsed()} | (_auto_timing(plan, ranking) if plan else {})
    if plan and timing["measured_s"] > time_budget:  # a step too long to be checked in time (e.g. the only one)
        over = (
            f"the search ran {timing['measured_s'] / 60:.1f} min, over its time budget of "
            f"{time_budget / 60:.1f} min: its last step could not be checked before it ended"
        )
        pace.said.append(over)
        if is_main():
            warnings.warn(f"circuit search: {over}.", RuntimeWarning, stacklevel=2)
    notes = [plan.note() if plan else unpaced, *(pace.said if pace else []), tie_said]
    circuit = Circuit(
        criterion=criterion,
        removed=list(ranking.removed),
        scores=ranking.scores,
        baseline=ranking.baseline,
        kept=kept,
        num_heads=adapter.num_heads(model),
        search=ranking.search_name(),
        tie_break=tie_break,
        note="; ".join(filter(None, notes)),
        ties=ranking.ties,
        timing=timing,
    )
    if progress:
        say_ties(circuit)
    return circuit


def _auto_timing(plan: Plan, ranking: Ranking) -> dict:
    return {
        "chose": plan.choice.name,
        "predicted_s": plan.predicted_s,
        "probe_s": plan.probe_s,
        "time_budget_s": plan.time_budget,
        "per_candidate_s": dict(plan.costs.per_candidate),
        "switched": [[start, choice.name] for start, choice in ranking.segments[1:]],
    }


def estimate_exact_seconds(
    model: nn.Module, id_batches: list[Batch], ood_batches: list[Batch], budget: int, batch_size: int = 16
) -> float:
    """Predicted seconds of the exact search (`method="fast"`) removing `budget` heads (`budget.probe_seconds`
    times its candidate evaluations)."""
    candidates = sum(map(len, kept_heads(model).values()))
    per_candidate = probe_seconds(model, id_batches, ood_batches, batch_size)
    return per_candidate * Choice("fast").evaluations(candidates, 0, budget)


def tie_rule(tie_break: str, criterion: CircuitCriterion, name: str) -> tuple[str, str]:
    """(the tie rule to use, a note when it is not the one asked for): "score" falls back to "order" for a
    criterion without a secondary score."""
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {sorted(TIE_BREAKS)}, got {tie_break!r}.")
    if TIE_BREAKS[tie_break].applies_to(criterion):
        return tie_break, ""
    return "order", (
        f"criterion {name!r} has no secondary score (CircuitCriterion.secondary): ties on S fall to candidate order "
        '(tie_break "order")'
    )


@dataclass
class Ranking:
    """What `greedy_removal` leaves: the removal order, S after each removal and before any, the ties of each
    removal (as `Circuit.ties`), and the searches that ran: [(first removal, search), ...]."""

    removed: list[tuple]
    scores: list[float]
    baseline: float
    ties: list[int | None]
    segments: list[tuple[int, Choice]]

    def search_name(self) -> str:
        """ "exact", an approximation's name, or e.g. "exact, then multi-2-bf16 from removal 5" after a fallback."""
        first, *later = self.segments
        return first[1].name + "".join(f", then {choice.name} from removal {start + 1}" for start, choice in later)


def greedy_removal(
    candidates: list[tuple],
    scorer_for: Callable[[Choice], CandidateScorer],
    budget: int,
    choice: Choice,
    identity: dict,
    state_path: str | os.PathLike | None,
    progress: bool,
    desc: str,
    *,
    pace: Pace | None = None,
    elapsed: Callable[[], float] | None = None,
    extra_state: Callable[[], dict] | None = None,
    clock: Clock = time.perf_counter,
) -> Ranking:
    """Algorithm 1's loop over any candidates (tuples of ints, or e.g. (tower, layer, head)), with the scorer
    `scorer_for(choice)` gives: it has `score(removed, candidates, progress)` (each candidate's (S, ...), compared
    as tuples, greatest first, then by candidate order) and `baseline(removed)`. Resumes from and saves to
    `state_path` (checked against `identity`; `extra_state()` is saved alongside). With `pace`, the clock is checked
    after every step and the remaining removals may switch to a coarser search (`budget.Pace`); `elapsed()`: the
    seconds spent so far, saved with the state."""
    _check_every_rank_agrees(identity)
    state = _load_state(state_path, identity)
    clock_started = clock()
    elapsed = elapsed or (lambda: float(state.get("elapsed_s", 0.0)) + clock() - clock_started)
    removed: list[tuple] = [tuple(x) for x in state.get("removed", [])][:budget]
    scores: list[float] = state.get("scores", [])[: len(removed)]
    ties: list[int | None] = state.get("ties", [])[: len(removed)]
    ties += [None] * (len(removed) - len(ties))  # states saved before ties were recorded
    known = dict(map(_known_entry, state.get("known", [])))  # latest (S, ...) of each head
    segments = _segments(state, choice, budget)  # states saved before fallbacks: one search
    _check_extension(state, segments, budget, state_path)
    if pace is None and len(removed) < budget and segments[-1][1].name != choice.name:
        raise ValueError(  # the identity holds the first search only: a fallback would go on under another name
            f"the state at {str(state_path)!r} continues a {segments[-1][1].name} search (its time budget's "
            f"fallback from removal {segments[-1][0] + 1}), not the {choice.name} search asked for: resume it with "
            "method='auto' (the CLI's --method auto) and its time budget, or delete the state to search afresh."
        )
    scorers: dict[tuple, CandidateScorer] = {}

    def scorer_of(search: Choice) -> CandidateScorer:  # one scorer per scorer class and precision, kept
        key = (METHODS[search.method].scorer, search.precision)
        if key not in scorers:
            scorers.clear()  # a fallback: the earlier scorer (a copy of the model) is not needed again
            scorers[key] = scorer_for(search)
        return scorers[key]

    baseline = state["baseline"] if "baseline" in state else scorer_of(segments[-1][1]).baseline([])
    said: dict[str, str] = {}  # the last removal, for the bar's postfix
    order = {head: i for i, head in enumerate(candidates)}
    with tqdm(
        total=_evaluations(segments, len(candidates), budget),  # the whole extraction, known in advance
        initial=_evaluations(segments, len(candidates), budget, done=len(removed)),  # steps done before a resume
        desc=f"{desc}, {budget} removals)",
        unit="cand",
        smoothing=0,  # the time estimate from the average rate: candidates cost alike, ticks come unevenly
        disable=not progress or not is_main(),
    ) as bar:
        while len(removed) < budget:
            step, search = len(removed), segments[-1][1]
            method, per_step = METHODS[search.method], METHODS[search.method].removals(search.top)
            scorer = scorer_of(search)
            last = min(step + per_step, budget)
            removal = f"{step + 1}/{budget}" if last == step + 1 else f"{step + 1}-{last}/{budget}"
            bar.set_postfix({"removal": removal, "search": search.name} | said)
            started = clock()
            remaining = [head for head in candidates if head not in removed]  # in candidate order
            remaining = method.shortlist(remaining, step, known, scorer, removed, search.top)  # sorts are stable
            remaining.sort(key=order.__getitem__)
            # each rank scores a share; the gathered values carry the secondary score too
            ticked = _StepTicks(bar, len(remaining))  # rank 0's share, scaled to the step: never past its end
            values = gather_dict(scorer.score(removed, shard(remaining), ticked))
            ticked.finish()
            ranked = sorted(remaining, key=values.__getitem__, reverse=True)  # best first; stable: equal values
            known.update(values)  # keep candidate order
            for best in ranked[: last - step]:
                removed.append(best)
                scores.append(values[best][0])
                ties.append(sum(values[head] == values[best] for head in ranked if head != best))
            said = {"removed": f"{best}", "S": f"{values[best][0]:.4f}"}
            if pace is not None:
                switch = _paced(pace, search, len(remaining), clock() - started, len(removed), elapsed)
                if switch is not None:
                    segments.append((len(removed), switch))
                    bar.total = bar.n + _evaluations(segments, len(candidates), budget, start=len(removed))
                    bar.refresh()
            if state_path is not None and is_main():
                ranking = Ranking(removed, scores, baseline, ties, segments)
                written = identity | (extra_state() if extra_state else {})
                _save_state(state_path, written, ranking, known, elapsed(), budget)
            barrier()
            if pace is not None and pace.stop:  # after the state is saved: a larger budget resumes from here
                raise TimeBudgetExceeded(pace.stop)
    return Ranking(removed, scores, baseline, ties, segments)


def _check_every_rank_agrees(identity: dict) -> None:
    """Under torchrun, refuse ranks whose model or data differ from rank 0's: each scores its share of the
    candidates on its own batches, and the gathered S values are compared as if from one data set."""
    check_same_on_every_rank(
        {"model weights": identity.get("model"), "validation data": identity.get("data")},
        "every rank must pass the same model and the same ID and OOD batches (no DistributedSampler; the search "
        "shards the candidates, not the data).",
    )


def _save_state(path, identity: dict, ranking: Ranking, known: dict, elapsed: float, budget: int) -> None:
    """The search so far, as `greedy_removal` resumes it (older states lack "segments" and "elapsed_s")."""
    write_json_atomic(
        path,
        identity
        | {
            "removed": [list(x) for x in ranking.removed],
            "scores": ranking.scores,
            "ties": ranking.ties,
            "baseline": ranking.baseline,
            "known": [[list(head), list(value)] for head, value in sorted(known.items())],
            "segments": [[start, *choice.to_list()] for start, choice in ranking.segments],
            "elapsed_s": elapsed,
            "budget": budget,
        },
    )


def _check_extension(state: dict, segments: list[tuple[int, Choice]], budget: int, path) -> None:
    """A "multi" search's last step removes min(top, left) heads, so a ranking saved for a smaller budget ends on a
    short step that a run to `budget` would not have taken: extending it would give another ranking. Refused."""
    saved = state.get("budget")
    multi = any(METHODS[c.method].removals(c.top) > 1 for _, c in segments)
    if saved is not None and saved < budget and multi:
        raise ValueError(
            f"the circuit state at {str(path)!r} holds a {segments[-1][1].name} search to {saved} removals: a multi "
            f"search's last step depends on its budget, so extending it to {budget} would not give the ranking a "
            f"run to {budget} gives. Run with budget {saved}, or delete the state to search again."
        )


def _paced(pace: Pace, search: Choice, evaluations: int, seconds: float, removed: int, elapsed) -> Choice | None:
    """`pace`'s decision after a step, from rank 0's clock (so every rank decides alike)."""
    clocks = gather_dict({"clocks": (seconds, elapsed())} if is_main() else {})["clocks"]
    pace.step_done(search, evaluations, clocks[0])
    return pace.check(search, removed, clocks[1])


def _segments(state: dict, choice: Choice, budget: int) -> list[tuple[int, Choice]]:
    """[(first removal, search), ...] as saved (only those before `budget`), or [(0, choice)]."""
    saved = [
        (int(start), Choice(method, int(top), precision)) for start, method, top, precision in state.get("segments", [])
    ]
    return [(start, c) for start, c in saved if start < budget] or [(0, choice)]


def _evaluations(segments: list[tuple[int, Choice]], candidates: int, budget: int, start: int = 0, done=None) -> int:
    """Candidate evaluations of the steps from `start` removals (the progress bar's unit) under `segments`, all
    of them or (`done`) only the steps before `done` removals."""
    ends = [s for s, _ in segments[1:]] + [budget]
    total = 0
    for (first, choice), end in zip(segments, ends):
        method = METHODS[choice.method]
        for step in choice.steps(first, end):
            if step >= start and (done is None or step < done):
                total += method.evaluations(candidates - step, step, choice.top)
    return total


def _identity(model: nn.Module, id_batches: list[Batch], ood_batches: list[Batch], criterion: str) -> dict:
    """What a saved state must match to be resumed: the criterion, the model's weights and the data."""
    return {
        "version": STATE_VERSION,
        "criterion": criterion,
        "model": weights_digest(model),
        "data": batches_digest(id_batches + ood_batches),
    }


def _plan(
    costs, candidates, budget, time_budget, elapsed, top, precision, state_path, model_digest, batch_size
) -> Plan:
    """`plan_search`, from the probe a refused run kept beside `state_path` if there is one for these weights
    (`model_digest`, the state identity's: hashed once); when nothing fits, the probe is kept there for the rerun
    (the message says so)."""
    probe_file = probe_path(state_path) if state_path is not None else None
    if probe_file is not None:
        reuse_probe(probe_file, costs, model_digest, batch_size)
    try:
        return plan_search(costs, candidates, budget, time_budget, elapsed, top, precision)
    except ValueError as refused:
        if probe_file is None:
            raise
        if is_main():
            save_probe(probe_file, costs, model_digest, batch_size)
        raise ValueError(
            f"{refused} The probe's timing is kept in {str(probe_file)!r}: a rerun with this state_path "
            "(the CLI: the same --out) plans from it."
        ) from None


def _known_entry(entry: list) -> tuple[tuple, Value]:
    """A head's latest value as saved: [head, value], or [*head, S] (states saved before tie rules)."""
    if isinstance(entry[0], list):
        return tuple(entry[0]), tuple(entry[1])
    return tuple(entry[:-1]), (entry[-1],)


def _load_state(path: str | os.PathLike | None, identity: dict) -> dict:
    if path is None or not Path(path).exists():
        return {}
    state = {"tie_break": "order"} | json.loads(Path(path).read_text())  # states saved before tie rules: "order"
    mismatched = [key for key in identity if state.get(key) != identity[key]]
    if mismatched:
        raise ValueError(
            f"the circuit state at {str(path)!r} was written for a different {', '.join(mismatched)} "
            "(criterion, search, tie rule, model weights or validation data); delete it or pass another state_path."
        )
    return state


class _StepTicks:
    """The bar's ticks for one step of `size` candidates: rank 0 scores about 1/world of them and ticks for all
    ranks (n x world), capped at the step's size; `finish` adds what the cap or the uneven share left out."""

    def __init__(self, bar, size: int):
        self.bar, self.size, self.done = bar, size, 0

    def __call__(self, n: int) -> None:
        n = min(n * world_size(), self.size - self.done)
        self.done += n
        self.bar.update(n)

    def finish(self) -> None:
        if self.done < self.size:
            self.bar.update(self.size - self.done)
            self.done = self.size
