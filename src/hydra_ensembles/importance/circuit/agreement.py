"""Is a circuit a property of the model or of its validation sample (issue 39)? Extract it on two disjoint halves
of the data (`split_halves`) and count how many of the first removals agree (`removal_agreement`), against what
two random orders would share (`chance_agreement`) and how often chance shares as much (`chance_p_value`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ...data.loaders import Batch, materialize, per_example
from ...data.loaders import batch_size as examples_in
from .budget import regroup


def removal_agreement(first: Sequence[tuple], second: Sequence[tuple], counts: Sequence[int]) -> dict[int, float]:
    """{k: the fraction of the first k heads removed in `first` that are also among the first k of `second`}.

    Formula: A(k) = |first[:k] ∩ second[:k]| / k, for removal orders (`Circuit.removed`: heads, least useful
    first). A(k) = 1: the same k heads, in whatever order; 0: none shared. Chance level, for two independent
    random orders of the same H heads, is k / H (`chance_agreement`).
    """
    longest = min(len(first), len(second))
    for k in counts:
        if not 1 <= k <= longest:
            raise ValueError(f"each count must be in 1..{longest} (the heads both orders removed), got {k}.")
    return {k: len(set(first[:k]) & set(second[:k])) / k for k in counts}


def chance_agreement(k: int, heads: int) -> float:
    """E[A(k)] for two independent uniformly random orders of `heads` heads: each of one order's first k is among
    the other's first k with probability k / heads."""
    if not 1 <= k <= heads:
        raise ValueError(f"k must be in 1..{heads} (the heads ranked), got {k}.")
    return k / heads


def chance_p_value(k: int, heads: int, agreement: float) -> float:
    """P(A(k) >= `agreement`) for two independent uniformly random orders of `heads` heads: how often chance
    agrees as much. Their first k share X heads, X hypergeometric (draw k of `heads`, k of them marked):
    P(X = x) = C(k, x) C(heads - k, k - x) / C(heads, k)."""
    if not 1 <= k <= heads:
        raise ValueError(f"k must be in 1..{heads} (the heads ranked), got {k}.")
    shared = round(agreement * k)
    total = math.comb(heads, k)
    return sum(math.comb(k, x) * math.comb(heads - k, k - x) for x in range(shared, k + 1)) / total


def split_halves(batches: Sequence[Batch], groups: Sequence[str] | None = None) -> tuple[list[Batch], list[Batch]]:
    """Two disjoint halves of `batches` by example: examples 0, 2, 4, ... (counted across batches) in the first,
    1, 3, 5, ... in the second, each half in batches of the first batch's size. With `groups` (one per example,
    e.g. the review a sentence comes from), whole groups alternate instead, in order of first appearance, so that
    no group is on both sides. Labels (and the other `TARGETS`) travel with their inputs; token inputs are
    right-padded to the half's longest (masked, as `rebatch` does)."""
    batches = materialize(batches, "batches")
    total = sum(map(examples_in, batches))
    if total < 2:
        raise ValueError(f"splitting into two halves needs at least 2 examples, got {total}: pass more data.")
    if groups is not None and len(groups) != total:
        raise ValueError(f"groups names {len(groups)} examples, the batches hold {total}: give one group each.")
    side = {group: i % 2 for i, group in enumerate(dict.fromkeys(groups))} if groups is not None else None
    half_of = torch.tensor([side[g] for g in groups]) if side is not None else torch.arange(total) % 2
    if len(set(half_of.tolist())) < 2:
        raise ValueError("the examples form one group: two halves need at least two groups.")
    halves: tuple[list[Batch], list[Batch]] = ([], [])
    start = 0
    for batch in batches:
        count = examples_in(batch)
        parity = half_of[start : start + count]  # (B,): 0 -> first half, 1 -> second
        for half, pieces in enumerate(halves):
            rows = (parity == half).nonzero().squeeze(1)
            if len(rows):
                pieces.append({k: v[rows] if per_example(v) else v for k, v in batch.items()})
        start += count
    size = examples_in(batches[0])
    return regroup(halves[0], size), regroup(halves[1], size)
