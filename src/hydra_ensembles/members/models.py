"""Member models: one pruned copy of the model per head map."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from torch import nn

from ..pruning import HeadMap, keep_heads, kept_heads
from .head_maps import check_distinct


def build_members(model: nn.Module, head_maps: Sequence[HeadMap], *, allow_identical: bool = False) -> list[nn.Module]:
    """One pruned copy of `model` per head map; `model` itself is left unchanged. Equal head maps would give
    identical members and are refused unless `allow_identical=True`."""
    if not head_maps:
        raise ValueError("build_members needs at least one head map.")
    if not allow_identical:  # a layer a map leaves out keeps its heads: compared as the members will be
        kept = kept_heads(model)
        full_maps = [kept | {int(layer): heads for layer, heads in head_map.items()} for head_map in head_maps]
        check_distinct(full_maps, "make them with sample_members, which draws distinct members")
    return [keep_heads(copy.deepcopy(model), head_map) for head_map in head_maps]
