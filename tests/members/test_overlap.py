"""Overlap of members' pruned heads: hand-computed Jaccard indices, identical and disjoint members, bad maps."""

import numpy as np
import pytest
import torch

from hydra_ensembles.members import head_map_overlap


def test_identical_members_overlap_fully_and_disjoint_pruned_sets_not_at_all():
    same = {0: [0, 1], 1: [2, 3]}
    assert head_map_overlap([same, dict(same), dict(same)], 4).mean == 1.0
    # pruned {(0,2),(0,3),(1,0),(1,1)} against {(0,0),(0,1),(1,2),(1,3)}: nothing in common
    disjoint = head_map_overlap([{0: [0, 1], 1: [2, 3]}, {0: [2, 3], 1: [0, 1]}], 4)
    assert disjoint.mean == 0.0 and disjoint.pairwise.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_three_members_by_hand():
    maps = [
        {0: [0, 1], 1: [0, 1, 2, 3]},  # prunes (0,2) (0,3)
        {"0": [0, 2], "1": [0, 1, 2]},  # as JSON holds it; prunes (0,1) (0,3) (1,3)
        {1: [0, 1]},  # layer 0 absent: keeps all its heads; prunes (1,2) (1,3)
    ]
    overlap = head_map_overlap(maps, [4, 4])
    # J01 = |{(0,3)}| / |{(0,1),(0,2),(0,3),(1,3)}| = 1/4; J02 = 0 / 4; J12 = |{(1,3)}| / 4 = 1/4
    expected = torch.tensor([[1.0, 0.25, 0.0], [0.25, 1.0, 0.25], [0.0, 0.25, 1.0]], dtype=torch.float64)
    assert torch.equal(overlap.pairwise, expected)
    assert overlap.mean == pytest.approx(1 / 6, abs=1e-15)


def test_layers_of_different_widths_and_members_that_prune_nothing():
    # layer 1 has 2 heads: member 0 prunes (0,2) (1,1); member 1 prunes (1,1)
    assert head_map_overlap([{0: [0, 1], 1: [0]}, {0: [0, 1, 2], 1: [0]}], [3, 2]).mean == 0.5
    assert head_map_overlap([{0: [0, 1], 1: [0]}, {0: [0, 1, 2], 1: [0]}], (h for h in (3, 2))).mean == 0.5
    assert head_map_overlap([{0: [0, 1]}, {0: [0, 1]}], 2).mean == 1.0  # both prune nothing: identical
    maps = [{0: [0, 1], 1: [0]}, {0: [0, 1, 2], 1: [0]}]
    for heads in (np.int64(3), torch.tensor(3)):  # a head count as numpy or torch gives it: one int
        assert head_map_overlap(maps, heads).mean == head_map_overlap(maps, 3).mean == pytest.approx(2 / 3)


def test_bad_inputs_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="at least two members"):
        head_map_overlap([{0: [0]}], 2)
    with pytest.raises(ValueError, match="outside the 1 layers.*num_heads_per_layer"):
        head_map_overlap([{0: [0, 3]}, {0: [1]}], 2)
    with pytest.raises(ValueError, match="outside the 1 layers"):
        head_map_overlap([{0: [0]}, {1: [1]}], [2])
