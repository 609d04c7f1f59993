"""How much M members share: the overlap of the heads they prune. Jaccard, not the fraction shared: members that
each draw 48 of the same 100 heads at random (paper 000, §B.5) share 48 x 48 / 100 = 23 heads on average, 48 % of
what each prunes, a Jaccard index of 23 / (96 - 23) = 0.32."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import NamedTuple

import torch
from torch import Tensor

from ..pruning.heads import index_set, is_one_count, layer_keys, per_layer


class HeadOverlap(NamedTuple):
    """`mean`: the mean over the M (M - 1) / 2 member pairs; `pairwise`: (M, M) Jaccard indices, 1 on the
    diagonal."""

    mean: float
    pairwise: Tensor


def head_map_overlap(
    head_maps: Sequence[Mapping[int | str, Sequence[int]]], num_heads_per_layer: int | Sequence[int]
) -> HeadOverlap:
    """Mean pairwise Jaccard index of the members' PRUNED head sets.

    Formula: P_m = {(l, h) : 0 <= h < H_l, h not kept by member m in layer l}; J(m, m') = |P_m ∩ P_m'| / |P_m ∪ P_m'|
    (1 when both prune nothing); overlap = (2 / (M (M - 1))) sum_{m < m'} J(m, m'). 1: identical members; 0: no head
    pruned by two members. P_m is measured against the unpruned model: heads a base had already pruned before the
    members were drawn count as pruned by every member, and raise the overlap (give the heads of the base's
    original model, and read the overlap as that of the whole pruning).
    Shape: head_maps, M >= 2 maps {layer: kept heads} (original numbering; JSON's string layers accepted; a layer
    absent from a map keeps all its heads); num_heads_per_layer, H_l: one int for every layer or one per layer, L
    layers.
    Reference: Jaccard, "The distribution of the flora in the alpine zone", 1912.
    """
    if len(head_maps) < 2:
        raise ValueError(f"overlap needs at least two members' head maps, got {len(head_maps)}.")
    heads = _heads_per_layer(head_maps, num_heads_per_layer)
    pruned = [_pruned(head_map, heads) for head_map in head_maps]
    pairwise = torch.eye(len(pruned), dtype=torch.float64)
    for a, b in combinations(range(len(pruned)), 2):
        pairwise[a, b] = pairwise[b, a] = _jaccard(pruned[a], pruned[b])
    pairs = torch.triu_indices(len(pruned), len(pruned), offset=1)
    return HeadOverlap(pairwise[pairs[0], pairs[1]].mean().item(), pairwise)


def _heads_per_layer(head_maps: Sequence[Mapping], num_heads_per_layer: int | Sequence[int]) -> list[int]:
    """H_l for every layer: an int (numpy's and 0-d tensors too) repeats over the layers the maps name (0..max
    layer); a sequence gives each layer's."""
    if is_one_count(num_heads_per_layer):
        layers = 1 + max((layer for head_map in head_maps for layer in layer_keys(head_map, "a head map")), default=-1)
        return per_layer(num_heads_per_layer, layers, "num_heads_per_layer")
    counts = list(num_heads_per_layer)  # a generator too
    return per_layer(counts, len(counts), "num_heads_per_layer")


def _pruned(head_map: Mapping[int | str, Sequence[int]], heads: list[int]) -> set[tuple[int, int]]:
    kept = {
        layer: index_set(layer_heads, "head", layer)
        for layer, layer_heads in layer_keys(head_map, "a head map").items()
    }
    for layer, layer_heads in kept.items():
        if not 0 <= layer < len(heads) or any(not 0 <= h < heads[layer] for h in layer_heads):
            raise ValueError(
                f"head map {dict(head_map)!r} keeps heads outside the {len(heads)} layers of {heads} heads given by "
                "num_heads_per_layer: pass the heads per layer of the model the members were pruned from."
            )
    return {
        (layer, h) for layer, count in enumerate(heads) for h in range(count) if h not in kept.get(layer, range(count))
    }


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0
