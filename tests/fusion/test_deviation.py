"""Identical members are refused, and the merged MLP's approximation is recorded and measured (fusion_deviation)."""

import copy

import pytest
import torch
from conftest import MODELS, make_inputs, output, perturb, random_head_maps
from tolerances import CONTRACT

import hydra_ensembles as he

ROUNDING = CONTRACT  # fused vs members computed in another order: rounding only (tests/tolerances.py)


def members(model: torch.nn.Module, tuned: bool) -> list[torch.nn.Module]:
    pruned = he.build_members(model, random_head_maps(3, seed=1, min_heads=1))
    return [perturb(m, seed=i) for i, m in enumerate(pruned)] if tuned else pruned


def test_identical_members_are_refused_unless_asked_for():
    model = MODELS["bert"]()
    with pytest.raises(ValueError, match="members 0 and 1 are identical.*allow_identical=True"):
        he.HydraEnsemble.fuse([model, copy.deepcopy(model)])
    ensemble = he.HydraEnsemble.fuse([model, copy.deepcopy(model)], allow_identical=True)
    assert ensemble.num_members == 2
    same_heads = he.build_members(model, [{0: [0, 1], 1: [0], 2: [3]}] * 2, allow_identical=True)
    he.HydraEnsemble.fuse([same_heads[0], perturb(same_heads[1])])  # same heads, other weights: distinct


def test_averaging_members_fine_tuned_apart_is_recorded_and_measured():
    model, inputs = MODELS["bert"](), make_inputs("bert")
    tuned = members(model, tuned=True)
    averaged = he.HydraEnsemble.fuse(tuned, mlp="average")
    assert averaged.averaged and all("attention" not in name for name in averaged.averaged)
    one_by_one = torch.stack([output(m, inputs) for m in tuned], dim=1)  # (B, M, C)
    with torch.no_grad():
        fused = averaged(**inputs).member_logits
    deviation = he.fusion_deviation(averaged, tuned, [inputs | {"labels": torch.zeros(4, dtype=torch.long)}])
    assert deviation["examples"] == 4
    assert deviation["logits"] == pytest.approx((fused - one_by_one).abs().max().item())
    expected_probs = (he.ensemble_probs(fused.double()) - he.ensemble_probs(one_by_one.double())).abs().max()
    assert deviation["probs"] == pytest.approx(expected_probs.item())
    assert deviation["logits"] > 10 * ROUNDING  # a real approximation, far above rounding

    stacked = he.HydraEnsemble.fuse(tuned, mlp="stack")
    assert stacked.averaged == []
    assert he.fusion_deviation(stacked, tuned, [inputs])["logits"] <= ROUNDING


def test_members_that_share_their_mlps_average_exactly(tmp_path):
    model, inputs = MODELS["vit"](), make_inputs("vit")
    shared = members(model, tuned=False)
    ensemble = he.HydraEnsemble.fuse(shared, mlp="average")
    assert ensemble.averaged == []
    assert he.fusion_deviation(ensemble, shared, [inputs])["logits"] <= ROUNDING
    tuned = he.HydraEnsemble.fuse(members(model, tuned=True))
    tuned.save_pretrained(tmp_path / "e")
    assert he.HydraEnsemble.from_pretrained(tmp_path / "e").averaged == tuned.averaged


def test_deviation_needs_data_and_the_right_members():
    model = MODELS["bert"]()
    shared = members(model, tuned=False)
    ensemble = he.HydraEnsemble.fuse(shared)
    with pytest.raises(ValueError, match="loader is empty"):
        he.fusion_deviation(ensemble, shared, [])
    with pytest.raises(ValueError, match="has 3 members, got 2"):
        he.fusion_deviation(ensemble, shared[:2], [make_inputs("bert")])


def test_members_given_in_another_order_are_refused():
    """An exact ensemble compared with its members swapped reads as an approximation (its ensemble probabilities,
    a mean over members, would not show it)."""
    model, inputs = MODELS["bert"](), make_inputs("bert")
    tuned = members(model, tuned=True)
    stacked = he.HydraEnsemble.fuse(tuned, mlp="stack")
    with pytest.raises(ValueError, match="model 0 keeps other heads than the ensemble's member 0.*order"):
        he.fusion_deviation(stacked, tuned[::-1], [inputs])


def test_members_that_keep_different_neurons_are_stacked_not_averaged():
    """Averaging neuron k of one member with neuron k of another is meaningless when they are different neurons
    of the original MLP (equal widths, other neurons kept)."""
    model, inputs = MODELS["vit"](), make_inputs("vit")
    pruned = he.build_members(model, random_head_maps(2, seed=1, min_heads=1))
    he.prune_neurons(pruned[0], {0: range(10)})
    he.prune_neurons(pruned[1], {0: range(20, 30)})
    with pytest.raises(ValueError, match="members 0 and 1 keep different MLP neurons \\(layer 0\\).*mlp='stack'"):
        he.HydraEnsemble.fuse(pruned, mlp="average")
    stacked = he.HydraEnsemble.fuse(pruned, mlp="stack")
    assert he.fusion_deviation(stacked, pruned, [inputs])["logits"] <= ROUNDING
    he.prune_neurons(pruned[1], {0: range(30, 32)})  # other widths: "stack" cannot fuse them either, not advised
    with pytest.raises(ValueError, match=r"\(layer 0\).*Fusion needs equal MLP widths \(27 and 25 neurons") as said:
        he.HydraEnsemble.fuse(pruned, mlp="average")
    assert "stack" not in str(said.value)
