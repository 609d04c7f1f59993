"""Ensemble members: M head maps from importance scores or circuits, and the pruned models they describe.

Diversity comes from a pruning seed (paper 000, §B.5): each member prunes `budget` heads drawn at random from
the `pool` least useful candidates (the paper draws 48 of the 100 least useful heads, once per member), or each
member comes from a different circuit (CircAcc, CircOOD, CircAvg).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .importance.circuit import Circuit
from .pruning import HeadMap, keep_heads


def sample_members(
    source: Tensor | Circuit | Sequence[Circuit],
    *,
    num_members: int = 3,
    budget: int | Sequence[int] | None = None,
    pool: int | Sequence[int] | None = None,
    seed: int = 0,
) -> list[HeadMap]:
    """Turn importance into M head maps (kept heads per layer, original numbering).

    Three sources, three settings:
        scores (L, H) tensor, e.g. from `taylor_head_scores` (higher = more useful, NaN = already pruned):
            per-layer budgets. `budget` heads to prune in each layer (an int, or one per layer), drawn from the
            layer's `pool` least useful heads.
        a `Circuit`: a global budget. `budget` heads to prune in the whole model, drawn from the first `pool`
            heads of the circuit's removal order.
        a list of circuits: one member per circuit, each pruning its circuit's first `budget` heads
            (`num_members` and `pool` do not apply).

    `pool` defaults to twice the budget (capped at what is available); `pool == budget` makes every member
    prune exactly the least useful heads. Members are reproducible: same arguments, same seed, same maps.
    """
    if isinstance(source, Tensor):
        return _from_scores(source, num_members, budget, pool, seed)
    if isinstance(source, Circuit):
        return _from_circuit(source, num_members, budget, pool, seed)
    circuits = list(source)
    if not circuits or not all(isinstance(c, Circuit) for c in circuits):
        raise TypeError("source must be a (layers, heads) score tensor, a Circuit or a list of Circuits.")
    if pool is not None:
        raise ValueError("pool does not apply to members from different circuits: each prunes its own ranking.")
    budget = _check_global(budget, min(len(c.removed) for c in circuits))
    return [c.head_map(budget) for c in circuits]


def build_members(model: nn.Module, head_maps: Sequence[HeadMap]) -> list[nn.Module]:
    """One pruned copy of `model` per head map; `model` itself is left unchanged."""
    if not head_maps:
        raise ValueError("build_members needs at least one head map.")
    return [keep_heads(copy.deepcopy(model), head_map) for head_map in head_maps]


def _from_scores(
    scores: Tensor, num_members: int, budget: int | Sequence[int] | None, pool: int | Sequence[int] | None, seed: int
) -> list[HeadMap]:
    if scores.dim() != 2:
        raise ValueError(f"scores must be a (layers, heads) tensor, got shape {tuple(scores.shape)}.")
    _check_members(num_members)
    num_layers = scores.shape[0]
    budgets = _per_layer(budget, num_layers, "budget")
    pools = (
        [min(2 * b, n) for b, n in zip(budgets, _available(scores))]
        if pool is None
        else _per_layer(pool, num_layers, "pool")
    )
    ranked = []  # per layer: scored heads from least to most useful (ties: lower index first)
    for layer in range(num_layers):
        heads = [h for h in range(scores.shape[1]) if not math.isnan(scores[layer, h].item())]
        if budgets[layer] >= len(heads):
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
    generator = torch.Generator().manual_seed(seed)
    maps = []
    for _ in range(num_members):
        head_map = {}
        for layer, heads in enumerate(ranked):
            pruned = {heads[i] for i in _draw(pools[layer], budgets[layer], generator)}
            head_map[layer] = sorted(set(heads) - pruned)
        maps.append(head_map)
    return maps


def _from_circuit(circuit: Circuit, num_members: int, budget: int | None, pool: int | None, seed: int) -> list[HeadMap]:
    _check_members(num_members)
    budget = _check_global(budget, len(circuit.removed))
    pool = min(2 * budget, len(circuit.removed)) if pool is None else int(pool)
    if not budget <= pool <= len(circuit.removed):
        raise ValueError(
            f"pool must be between the budget {budget} and the {len(circuit.removed)} heads the circuit ranked, "
            f"got {pool}; extract the circuit with a larger budget to sample from a larger pool."
        )
    generator = torch.Generator().manual_seed(seed)
    maps = []
    for _ in range(num_members):
        pruned = {circuit.removed[i] for i in _draw(pool, budget, generator)}
        maps.append({layer: [h for h in heads if (layer, h) not in pruned] for layer, heads in circuit.kept.items()})
    return maps


def _draw(pool: int, budget: int, generator: torch.Generator) -> list[int]:
    """`budget` distinct indices out of range(pool), uniformly at random."""
    return torch.randperm(pool, generator=generator)[:budget].tolist()


def _available(scores: Tensor) -> list[int]:
    return (~scores.isnan()).sum(dim=1).tolist()


def _per_layer(value: int | Sequence[int] | None, num_layers: int, name: str) -> list[int]:
    if value is None:
        raise ValueError(f"{name} is required: the number of heads to prune in each layer (an int or one per layer).")
    values = [int(value)] * num_layers if isinstance(value, int) else [int(v) for v in value]
    if len(values) != num_layers or any(v < 0 for v in values):
        raise ValueError(f"{name} must be an int >= 0 or {num_layers} of them (one per layer), got {value!r}.")
    return values


def _check_global(budget: int | None, ranked: int) -> int:
    if budget is None or not 0 <= int(budget) <= ranked:
        raise ValueError(
            f"budget must be an int between 0 and {ranked} (the heads the circuit ranked), got {budget!r}."
        )
    return int(budget)


def _check_members(num_members: int) -> None:
    if not isinstance(num_members, int) or num_members < 1:
        raise ValueError(f"num_members must be a positive int, got {num_members!r}.")
