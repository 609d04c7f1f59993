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
from abc import ABC
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ...adapters import get_adapter
from ...data.loaders import Batch, materialize, rebatch
from ...data.loaders import batch_size as examples_in
from ...distributed import barrier, gather_dict, is_main, shard, world_size
from ...io import tensor_digest, weights_digest, write_json_atomic
from ...pruning import HeadMap, kept_heads
from .criteria import CRITERIA, TIE_BREAKS, CircuitCriterion
from .record import CircuitRecord, head_map_from_json, say_ties
from .scoring import CandidateScorer, FastScorer, Head, ReferenceScorer, Value

STATE_VERSION = 1
# the whole search in bf16 against fp32, measured on this project's 2-core Xeon (AMX): 1.6x on MiniLM, 2.0x on
# DINOv2-S (docs/circuits.md); the smaller, so that `auto`'s choice errs towards finishing within its budget
BF16_SPEEDUP = 1.6
# method "auto"'s approximations when the exact search does not fit, least approximate first: (method, top,
# precision, speed-up over the exact search). bf16 first: measured (docs/circuits.md), rounding moves the ranking
# far less than removing several heads per step does, and removing 8 per step costs more quality than 4.
AUTO_FALLBACKS = (
    ("fast", 8, "bf16", BF16_SPEEDUP),
    ("multi", 2, "bf16", 2 * BF16_SPEEDUP),
    ("multi", 4, "bf16", 4 * BF16_SPEEDUP),
    ("multi", 8, "bf16", 8 * BF16_SPEEDUP),
)


# ---- the result ----


@dataclass
class Circuit(CircuitRecord):
    """The outcome of a circuit extraction over one model's heads (layer, head); the fields it shares with
    `JointCircuit` are `CircuitRecord`'s.

    num_heads: heads per layer of the unpruned model.
    note: why that search (method "auto": the exact search's estimated time against the time budget).
    """

    head_order: ClassVar[str] = "(layer, head)"

    removed: list[Head]
    kept: HeadMap
    num_heads: int
    note: str = ""

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


def extract_circuit(
    model: nn.Module,
    id_loader: Iterable[Batch],
    ood_loader: Iterable[Batch] | None = None,
    criterion: str = "avg",
    budget: int | None = None,
    *,
    method: str = "auto",
    time_budget: float = 1800.0,
    batch_size: int = 16,
    top: int = 8,
    precision: str = "fp32",
    tie_break: str = "score",
    state_path: str | os.PathLike | None = None,
    progress: bool = True,
) -> Circuit:
    """Rank heads by greedy removal (Algorithm 1); the model is left unchanged.

    Args:
        model: a supported HF classifier, pruned or not.
        id_loader: labelled ID validation batches.
        ood_loader: OOD validation batches (labels unused); required for "ood" and "avg".
        criterion: "acc", "ood", "avg", or a name added with `register_criterion`.
        budget: number of heads to remove, 1 <= budget < number of heads (default: two thirds of the model's heads,
            the pool `sample_members` draws members from; the paper ranks 100 of BERT's 144).
        method: "auto" (default): "fast" if its estimated time (its first step on the first batch of examples, timed)
            is within `time_budget` seconds, else the least approximate of `AUTO_FALLBACKS` that fits: the fast
            search in bf16, then "multi" (bf16) removing 2, 4 or 8 heads per step; `Circuit.search` and
            `Circuit.note` say which ran and why.
            "fast" (exact: prefix caching and batched candidates, see `importance.circuit.scoring`),
            "reference" (the literal loop, one full evaluation per candidate), or one of two approximate modes
            that score exactly only `top` candidates per step: "lazy" (the best-scoring so far; every head is
            scored at the first step) or "screen" (the best by a first-order estimate of the change in a smooth
            surrogate of S, from one backward pass per step). See docs/circuits.md for how far they agree.
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
            interchangeable).
        progress: show a progress bar over all the candidate evaluations of the extraction (its total is known
            from the start, so the time estimate covers the whole run).

    Under `torchrun --nproc-per-node N` (a torch.distributed group), each rank scores a round-robin share of
    the candidates and the scores are gathered, so every rank removes the same head; "auto" divides rank 0's estimate
    by N, and every rank makes the same choice.
    """
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
    id_batches = materialize(id_loader, "id_loader")
    if any(batch.get("labels") is None for batch in id_batches):
        raise ValueError("id_loader batches need 'labels' (circuit scores use ID accuracy / MSP on labelled data).")
    ood_batches = materialize(ood_loader, "ood_loader") if score_fn.needs_ood else []
    kept = kept_heads(model)
    candidates = [(layer, h) for layer, heads in kept.items() for h in heads]
    budget = 2 * (len(candidates) // 3) if budget is None else budget
    if not 1 <= budget < len(candidates):
        raise ValueError(
            f"budget must be between 1 and {len(candidates) - 1} (the model has {len(candidates)} heads and a "
            f"circuit keeps at least one), got {budget}."
        )
    note = tie_said
    if tie_said and progress and is_main():
        tqdm.write(f"circuit search: {tie_said}")
    if method == "auto":
        estimate = estimate_exact_seconds(model, id_batches, ood_batches, budget, batch_size)
        # every rank must choose the same search: rank 0's estimate, shared by the ranks' shards of each step
        exact_seconds = gather_dict({"seconds": estimate} if is_main() else {})["seconds"] / world_size()
        method, top, precision, chose = auto_choice(exact_seconds, time_budget, top, precision)
        note = "; ".join(filter(None, (chose, tie_said)))
        if progress and is_main():
            tqdm.write(f"circuit search: {chose}")
    search_method = METHODS[method]
    search_method.check(score_fn, criterion)
    search = search_name(method, top, precision)
    identity = _identity(model, id_batches, ood_batches, criterion) | {"search": search, "tie_break": tie_break}
    options = {"batch_size": batch_size, "precision": precision, "tie_break": tie_break}
    scorer = search_method.scorer(model, id_batches, ood_batches, score_fn, **options)
    removed, scores, baseline, ties = greedy_removal(
        candidates,
        scorer,
        budget,
        search_method,
        top,
        identity,
        state_path,
        progress,
        f"circuit ({criterion}, {method}",
    )
    circuit = Circuit(
        criterion=criterion,
        removed=list(removed),
        scores=scores,
        baseline=baseline,
        kept=kept,
        num_heads=adapter.num_heads(model),
        search=search,
        tie_break=tie_break,
        note=note,
        ties=ties,
    )
    if progress:
        say_ties(circuit)
    return circuit


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


def estimate_exact_seconds(
    model: nn.Module, id_batches: list[Batch], ood_batches: list[Batch], budget: int, batch_size: int = 16
) -> float:
    """Estimated seconds of the exact search (`method="fast"`) removing `budget` heads: its first step (every
    candidate, so the batch shapes are the search's own) timed on the first batch of examples, scaled to all
    examples, then by the candidates left at every step. Within 7 % of the measured time on DINOv2-S, up to 1.5x
    high on MiniLM (later steps run a pruned, cheaper model; docs/circuits.md)."""
    candidates = [(layer, h) for layer, heads in kept_heads(model).items() for h in heads]
    chunks = rebatch(id_batches + ood_batches, batch_size)
    scorer = FastScorer(model, chunks[:1], [], None, batch_size=batch_size)  # outputs only
    started = time.perf_counter()
    scorer.outputs([], candidates, lambda n: None)
    first_step = (time.perf_counter() - started) * sum(map(examples_in, chunks)) / examples_in(chunks[0])
    return first_step * sum(len(candidates) - step for step in range(budget)) / len(candidates)


def auto_choice(exact: float, time_budget: float, top: int = 8, precision: str = "fp32") -> tuple[str, int, str, str]:
    """(method, top, precision, note) for method "auto", given the exact search's estimated seconds: the fast
    search (at the `precision` asked for) if it fits `time_budget`, else the least approximate of
    `AUTO_FALLBACKS` that fits (the last one if none does)."""
    minutes = f"exact search estimated at {exact / 60:.1f} min"
    if exact <= time_budget:
        return "fast", top, precision, f"{minutes} (budget {time_budget / 60:g} min): fast, {precision}"
    fits = (o for o in AUTO_FALLBACKS if exact / o[3] <= time_budget)
    method, top, precision, speedup = next(fits, AUTO_FALLBACKS[-1])
    note = f"{minutes} > budget {time_budget / 60:g} min: approximate {search_name(method, top, precision)}"
    return method, top, precision, note + f" (~{exact / speedup / 60:.0f} min; how far it agrees: docs/circuits.md)"


def search_name(method: str, top: int, precision: str) -> str:
    """ "exact" for Algorithm 1's own ranking, else the approximation: method, `top` (for the methods that use
    it), precision — e.g. "multi-4-bf16", or "fast-bf16" (every candidate scored, in bfloat16)."""
    if METHODS[method].exact and precision == "fp32":
        return "exact"
    name = method if METHODS[method].exact else f"{method}-{top}"
    return name + ("" if precision == "fp32" else f"-{precision}")


def greedy_removal(
    candidates: list[tuple],
    scorer: CandidateScorer,
    budget: int,
    search_method: SearchMethod,
    top: int,
    identity: dict,
    state_path: str | os.PathLike | None,
    progress: bool,
    desc: str,
) -> tuple[list[tuple], list[float], float, list[int | None]]:
    """Algorithm 1's loop over any candidates (tuples of ints, or e.g. (tower, layer, head)), with any scorer
    that has `score(removed, candidates, progress)` (each candidate's (S, ...), compared as tuples, greatest
    first, then by candidate order) and `baseline(removed)`: (removal order, S after each removal, S before any,
    ties of each removal as `Circuit.ties`). Resumes from and saves to `state_path` (checked against `identity`)."""
    state = _load_state(state_path, identity)
    removed: list[tuple] = [tuple(x) for x in state.get("removed", [])][:budget]
    scores: list[float] = state.get("scores", [])[: len(removed)]
    ties: list[int | None] = state.get("ties", [])[: len(removed)]
    ties += [None] * (len(removed) - len(ties))  # states saved before ties were recorded
    known = dict(map(_known_entry, state.get("known", [])))  # latest (S, ...) of each head
    baseline = state["baseline"] if "baseline" in state else scorer.baseline([])
    order = {head: i for i, head in enumerate(candidates)}

    def evaluations(step: int) -> int:  # candidates scored at `step`: the progress bar's unit
        return search_method.evaluations(len(candidates) - step, step, top)

    per_step = search_method.removals(top)
    if per_step < 1:
        raise ValueError(f"this method removes `top` heads per step: top must be >= 1, got {top}.")
    steps = list(range(0, budget, per_step))  # heads removed before each step
    with tqdm(
        total=sum(evaluations(step) for step in steps),  # the whole extraction, known in advance
        initial=sum(evaluations(step) for step in steps if step < len(removed)),  # steps done before a resume
        desc=f"{desc}, {budget} steps)",
        unit="cand",
        disable=not progress or not is_main(),
    ) as bar:
        while len(removed) < budget:
            step = len(removed)
            remaining = [head for head in candidates if head not in removed]  # in candidate order
            remaining = search_method.shortlist(remaining, step, known, scorer, removed, top)  # sorts are stable
            remaining.sort(key=order.__getitem__)
            # each rank scores a share; the gathered values carry the secondary score too
            values = gather_dict(scorer.score(removed, shard(remaining), lambda n: bar.update(n * world_size())))
            ranked = sorted(remaining, key=values.__getitem__, reverse=True)  # best first; stable: equal values
            known.update(values)  # keep candidate order
            chosen = ranked[: min(per_step, budget - step)]
            for best in chosen:
                removed.append(best)
                scores.append(values[best][0])
                ties.append(sum(values[head] == values[best] for head in ranked if head != best))
            bar.set_postfix(step=f"{len(removed)}/{budget}", removed=f"{best}", S=f"{values[best][0]:.4f}")
            if state_path is not None and is_main():
                write_json_atomic(
                    state_path,
                    identity
                    | {
                        "removed": [list(x) for x in removed],
                        "scores": scores,
                        "ties": ties,
                        "baseline": baseline,
                        "known": [[list(head), list(value)] for head, value in sorted(known.items())],
                    },
                )
            barrier()
    return removed, scores, baseline, ties


def _identity(model: nn.Module, id_batches: list[Batch], ood_batches: list[Batch], criterion: str) -> dict:
    """What a saved state must match to be resumed: the criterion, the model's weights and the data."""
    return {
        "version": STATE_VERSION,
        "criterion": criterion,
        "model": weights_digest(model),
        "data": tensor_digest(
            v for batch in id_batches + ood_batches for _, v in sorted(batch.items()) if isinstance(v, Tensor)
        ),
    }


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
