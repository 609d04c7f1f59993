"""Ensemble members: M head maps from importance scores or circuits, and the pruned models they describe.

Diversity comes from a pruning seed (paper 000, §B.5): each member prunes `budget` heads drawn at random from
the `pool` least useful candidates (the paper draws 48 of the 100 least useful heads of a ViT-B/16's 144, once
per member), or each member comes from a different circuit (CircAcc, CircOOD, CircAvg).

Defaults follow the paper's proportions: a member prunes a third of the heads (48 of 144), drawn from twice as
many of the least useful (96; the paper's 100 is about twice, rounded), capped at what was ranked. Members are
always distinct: a draw that repeats an earlier member is drawn again, and settings that cannot give M distinct
members are refused (unless `allow_identical=True`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..importance.circuit import Circuit, JointCircuit
from ..pruning import HeadMap, per_layer


def sample_members(
    source: Tensor | Circuit | JointCircuit | Sequence[Circuit],
    *,
    num_members: int | None = None,
    budget: int | Sequence[int] | None = None,
    pool: int | Sequence[int] | None = None,
    seed: int = 0,
    allow_identical: bool = False,
    trunk: int = 0,
) -> list[HeadMap] | list[dict[str, HeadMap]]:
    """Turn importance into M head maps (kept heads per layer, original numbering).

    Three sources, three settings:
        scores (L, H) tensor, e.g. from `taylor_head_scores` (higher = more useful, NaN = already pruned):
            per-layer budgets. `budget` heads to prune in each layer (an int, or one per layer), drawn from the
            layer's `pool` least useful heads.
        a `Circuit`: a global budget. `budget` heads to prune in the whole model, drawn from the first `pool`
            heads of the circuit's removal order. A `JointCircuit` (two towers) likewise, over both towers'
            heads: each member is then {"image": HeadMap, "text": HeadMap}.
        a list of circuits: one member per circuit, each pruning its circuit's first `budget` heads
            (`pool` does not apply; `num_members`, if given, must be the number of circuits).

    `budget` defaults to a third of the heads (of each layer's with scores, of the model's with a circuit: the
    paper's 48 of 144; a tenth of the ranked towers' heads with a joint circuit, §D.3's 24 of CLIP's 240, from the
    fifth `extract_joint_circuit` ranks by default); `pool` to twice the budget, capped at what is available.
    Members are reproducible (same arguments, same seed, same maps) and distinct: a draw equal to an earlier member
    is drawn again, and when fewer than M distinct members exist (e.g. `pool == budget`) a ValueError says what to
    change.
    `allow_identical=True` skips both, for a deliberate ensemble of equal members.

    `trunk` (a `Circuit` only): members identical in their first `trunk` layers, so that the fused ensemble runs
    those layers once (`HydraEnsemble.trunk`; keep them equal by fine-tuning after fusing,
    `training.finetune_fused`). There every member keeps the heads one model pruned by the circuit's first `budget`
    heads keeps (CircAvg's); in the later layers each member prunes the rest of its `budget`, drawn from those of
    the circuit's first `pool` heads that lie in them. Every member prunes `budget` heads either way.
    """
    if trunk and not isinstance(source, Circuit):
        raise ValueError(
            f"trunk applies to members drawn from one Circuit (their shared first layers follow its ranking); got "
            f"{type(source).__name__}: sample from a circuit, or share no layers (trunk=0)."
        )
    if not isinstance(source, Tensor | Circuit | JointCircuit):  # a list of circuits: one member each
        return _from_circuits(source, num_members, budget, pool, allow_identical)
    num_members = 3 if num_members is None else num_members
    if isinstance(source, Tensor):
        return _from_scores(source, num_members, budget, pool, seed, allow_identical)
    if trunk:  # a Circuit, checked above
        return _with_trunk(source, trunk, num_members, budget, pool, seed, allow_identical)
    return _from_circuit(source, num_members, budget, pool, seed, allow_identical)


def _from_circuits(
    source: Sequence[Circuit], num_members: int | None, budget: int | None, pool: int | None, allow_identical: bool
) -> list[HeadMap]:
    circuits = list(source) if isinstance(source, Sequence) else []
    if not circuits or not all(isinstance(c, Circuit) for c in circuits):
        raise TypeError("source must be a (layers, heads) score tensor, a Circuit or a list of Circuits.")
    if num_members is not None and num_members != len(circuits):
        raise ValueError(
            f"num_members is {num_members} but {len(circuits)} circuits were given: members from a list of "
            "circuits are one per circuit (leave num_members out)."
        )
    if pool is not None:
        raise ValueError("pool does not apply to members from different circuits: each prunes its own ranking.")
    ranked, default = min(len(c.removed) for c in circuits), _default_budget(circuits[0])
    if budget is None and default > ranked:  # as _budget_and_pool: a default that does not fit is said
        raise ValueError(
            f"the default budget ({_default_said(circuits[0])}) is more than the {ranked} heads the circuits "
            f"ranked; extract them with a budget of at least {default}, or pass a budget of at most {ranked}."
        )
    budget = _check_global(default if budget is None else budget, ranked)
    head_maps = [c.head_map(budget) for c in circuits]
    if not allow_identical:
        check_distinct(
            head_maps,
            "the circuits prune the same heads within this budget: use circuits of other criteria or a larger budget",
        )
    return head_maps


def check_distinct(head_maps: Sequence[HeadMap], fix: str) -> None:
    """Raise ValueError naming the first two equal head maps (identical members add no diversity)."""
    seen: dict[str, int] = {}
    for index, head_map in enumerate(head_maps):
        key = repr(sorted((int(layer), sorted(heads)) for layer, heads in head_map.items()))
        if key in seen:
            raise ValueError(
                f"members {seen[key]} and {index} keep the same heads, so they would be identical members of the "
                f"ensemble: {fix} (or pass allow_identical=True if identical members are what you want)."
            )
        seen[key] = index


def _from_scores(
    scores: Tensor,
    num_members: int,
    budget: int | Sequence[int] | None,
    pool: int | Sequence[int] | None,
    seed: int,
    allow_identical: bool,
) -> list[HeadMap]:
    if scores.dim() != 2:
        raise ValueError(f"scores must be a (layers, heads) tensor, got shape {tuple(scores.shape)}.")
    if scores.isnan().all():  # NaN marks a pruned head: all NaN is a scoring pass that diverged, not a model
        raise ValueError("every score is NaN (NaN marks a pruned head): the scoring diverged; score the heads again.")
    _check_members(num_members)
    num_layers = scores.shape[0]
    budgets = [n // 3 for n in _available(scores)] if budget is None else per_layer(budget, num_layers, "budget")
    pools = (
        [min(2 * b, n) for b, n in zip(budgets, _available(scores))]
        if pool is None
        else per_layer(pool, num_layers, "pool")
    )
    ranked = []  # per layer: scored heads from least to most useful (ties: lower index first)
    for layer in range(num_layers):
        heads = [h for h in range(scores.shape[1]) if not math.isnan(scores[layer, h].item())]
        if budgets[layer] and budgets[layer] >= len(heads):  # budget 0 passes a layer emptied before scoring
            raise ValueError(
                f"budget {budgets[layer]} for layer {layer} is not below its {len(heads)} heads: "
                "per-layer budgets must leave at least one head in each layer."
            )
        if not budgets[layer] <= pools[layer] <= len(heads):
            raise ValueError(
                f"pool for layer {layer} must be between its budget {budgets[layer]} and {len(heads)}, "
                f"got {pools[layer]}."
            )
        ranked.append(sorted(heads, key=lambda h: (scores[layer, h].item(), h)))
    distinct = math.prod(math.comb(p, b) for p, b in zip(pools, budgets))
    if not allow_identical:
        _check_enough(distinct, num_members, f"per-layer budgets {budgets} and pools {pools}", not any(budgets))

    def draw(generator: torch.Generator) -> HeadMap:
        head_map = {}
        for layer, heads in enumerate(ranked):
            pruned = {heads[i] for i in _draw(pools[layer], budgets[layer], generator)}
            head_map[layer] = sorted(set(heads) - pruned)
        return head_map

    return _draw_members(draw, num_members, seed, allow_identical)


def _from_circuit(
    circuit: Circuit | JointCircuit,
    num_members: int,
    budget: int | None,
    pool: int | None,
    seed: int,
    allow_identical: bool,
) -> list[HeadMap]:
    _check_members(num_members)
    budget, pool = _budget_and_pool(circuit, budget, pool)
    if not allow_identical:
        _check_enough(math.comb(pool, budget), num_members, f"budget {budget} and pool {pool}", budget == 0)

    def draw(generator: torch.Generator) -> HeadMap:
        return circuit.without(circuit.removed[i] for i in _draw(pool, budget, generator))

    return _draw_members(draw, num_members, seed, allow_identical)


def _budget_and_pool(circuit: Circuit | JointCircuit, budget: int | None, pool: int | None) -> tuple[int, int]:
    """A global budget and pool of `circuit`'s ranking, the defaults filled in (`_default_budget`, twice that),
    refused when they do not fit what the circuit ranked."""
    ranked, default = len(circuit.removed), _default_budget(circuit)
    if budget is None and default >= ranked:
        raise ValueError(
            f"the default budget ({_default_said(circuit)}) needs a pool of more heads than the {ranked} the "
            f"circuit ranked; extract the circuit with a budget of at least {default + 1} (2 x {default} gives the "
            f"default pool), or pass a budget below {ranked}."
        )
    budget = _check_global(default if budget is None else budget, ranked)
    pool = min(2 * budget, ranked) if pool is None else int(pool)
    if not budget <= pool <= ranked:
        raise ValueError(
            f"pool must be between the budget {budget} and the {ranked} heads the circuit ranked, "
            f"got {pool}; extract the circuit with a larger budget to sample from a larger pool."
        )
    return budget, pool


def _with_trunk(
    circuit: Circuit, trunk: int, num_members: int, budget: int | None, pool: int | None, seed: int, allow: bool
) -> list[HeadMap]:
    """`_from_circuit` on the circuit's ranking of layers `trunk`.. alone, starting from the heads CircAvg keeps in
    layers ..`trunk` - 1: budget and pool count the whole ranking's heads, as without a trunk."""
    layers = len(circuit.kept)
    if not isinstance(trunk, int) or not 0 < trunk < layers:
        raise ValueError(
            f"trunk must be a number of leading layers between 1 and {layers - 1} (the model has {layers}; members "
            f"identical in every layer are one model), got {trunk!r}."
        )
    budget, pool = _budget_and_pool(circuit, budget, pool)
    shared = [head for head in circuit.first_removed(budget) if head[0] < trunk]
    later = [step for step, head in enumerate(circuit.removed) if head[0] >= trunk]
    rest = dataclasses.replace(
        circuit,
        removed=[circuit.removed[step] for step in later],
        scores=[circuit.scores[step] for step in later],
        ties=[circuit.ties[step] for step in later] if circuit.ties else [],
        kept=circuit.without(shared),
    )
    in_pool = sum(1 for head in circuit.first_removed(pool) if head[0] >= trunk)
    if not allow and math.comb(in_pool, budget - len(shared)) < num_members:
        raise ValueError(
            f"a trunk of {trunk} layers leaves {num_members} members too little to differ in: {len(shared)} of the "
            f"budget's {budget} heads lie in the trunk, and the circuit's first {pool} heads hold {in_pool} in layers "
            f"{trunk}.. to draw the other {budget - len(shared)} from (only {math.comb(in_pool, budget - len(shared))} "
            "distinct member(s)): share fewer layers, or draw from a larger pool (extract the circuit further)."
        )
    return _from_circuit(rest, num_members, budget - len(shared), in_pool, seed, allow)


def _draw_members(draw, num_members: int, seed: int, allow_identical: bool) -> list[HeadMap]:
    """M head maps from `draw(generator)`; a map equal to an earlier one is drawn again (unless allowed)."""
    generator = torch.Generator().manual_seed(seed)
    maps: list[HeadMap] = []
    while len(maps) < num_members:
        head_map = draw(generator)
        if allow_identical or head_map not in maps:
            maps.append(head_map)
    return maps


def _check_enough(distinct: int, num_members: int, settings: str, no_budget: bool) -> None:
    """`no_budget`: every budget is 0, so every member keeps every head whatever the pool."""
    if distinct < num_members:
        fix = (
            "every budget is 0 (the default, a third of a layer's heads, is 0 below 3 heads), so every member keeps "
            "every head: give a budget of at least 1"
            if no_budget
            else "use a pool larger than the budget (the default is twice the budget)"
        )
        raise ValueError(
            f"{settings} allow only {distinct} distinct member(s), fewer than the {num_members} asked for, so "
            f"members would be identical: {fix}, or pass allow_identical=True if identical members are what you "
            "want."
        )


def _draw(pool: int, budget: int, generator: torch.Generator) -> list[int]:
    """`budget` distinct indices out of range(pool), uniformly at random."""
    return torch.randperm(pool, generator=generator)[:budget].tolist()


def _heads(circuit: Circuit | JointCircuit) -> int:
    """Heads the model had when the circuit was extracted (a joint circuit's: those of the towers it ranked)."""
    if isinstance(circuit, JointCircuit):
        ranked = {tower for tower, _, _ in circuit.removed}
        kept = [tower_kept for tower, tower_kept in circuit.kept.items() if tower in ranked]
    else:
        kept = [circuit.kept]
    return sum(len(heads) for tower in kept for heads in tower.values())


def _default_budget(circuit: Circuit | JointCircuit) -> int:
    """The default global budget: a third of the model's heads (the paper prunes 48 of a ViT-B/16's 144); of a
    joint circuit's, a tenth (§D.3: 24 of CLIP's 240), from the fifth it ranks by default."""
    return max(1, _heads(circuit) // 10) if isinstance(circuit, JointCircuit) else _heads(circuit) // 3


def _default_said(circuit: Circuit | JointCircuit) -> str:
    """The default budget in words, for messages."""
    share = "a tenth" if isinstance(circuit, JointCircuit) else "a third"
    return f"{share} of the {_heads(circuit)} heads: {_default_budget(circuit)}"


def _available(scores: Tensor) -> list[int]:
    return (~scores.isnan()).sum(dim=1).tolist()


def _check_global(budget: int | None, ranked: int) -> int:
    if budget is None or not 0 <= int(budget) <= ranked:
        raise ValueError(
            f"budget must be an int between 0 and {ranked} (the heads the circuit ranked), got {budget!r}."
        )
    return int(budget)


def _check_members(num_members: int) -> None:
    if not isinstance(num_members, int) or num_members < 1:
        raise ValueError(f"num_members must be a positive int, got {num_members!r}.")
