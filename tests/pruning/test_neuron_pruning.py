"""Structural MLP-neuron pruning equals zeroing those neurons; it composes with head pruning, saves, reloads
and fuses (the fusion contracts hold on a neuron-pruned base)."""

import copy
import warnings

import pytest
import torch
import transformers as T
from conftest import (
    CONTRACT_MODELS,
    MODELS,
    at_trained_scale,
    fused_output,
    make_inputs,
    output,
    perturb,
    random_head_maps,
)
from tolerances import CONTRACT, DEFECT

import hydra_ensembles as he
from hydra_ensembles.adapters import get_adapter
from hydra_ensembles.pruning import neurons as neurons_module
from hydra_ensembles.pruning.heads import slice_linear

PLAN = {0: [0, 5, 36], 2: list(range(30))}  # MLP width 37 in the tiny configs


@pytest.mark.parametrize("name", CONTRACT_MODELS)
def test_pruned_neurons_equal_zeroed_neurons(name):
    model, inputs = at_trained_scale(name), make_inputs(name)
    with he.ablate_neurons(model, PLAN):
        zeroed = output(model, inputs)
    restored = output(model, inputs)
    pruned = he.prune_neurons(at_trained_scale(name), PLAN)
    assert (output(pruned, inputs) - zeroed).abs().max().item() <= CONTRACT
    assert (output(at_trained_scale(name), inputs) - restored).abs().max().item() == 0  # ablation was undone
    assert _smallest_neuron_effect(model, inputs) >= DEFECT  # one neuron pruned too many or too few would show
    width = len(he.kept_neurons(model)[1])  # 37, or 64 for DINOv2 (mlp_ratio 2)
    assert he.kept_neurons(pruned)[2] == list(range(30, width)) and he.kept_neurons(pruned)[1] == list(range(width))
    block = he.get_adapter(pruned).block(he.get_adapter(pruned).layers(pruned)[2])
    assert block.mlp_out.in_features == width - 30
    assert block.mlp_in.out_features == len(block.mlp_in_rows(torch.arange(width - 30)))  # with a gated MLP's gates


def _smallest_neuron_effect(model, inputs) -> float:
    """min over PLAN's neurons of max |output change| when that one neuron is zeroed."""
    full = output(model, inputs)
    effects = []
    for layer, neurons in PLAN.items():
        for neuron in neurons:
            with he.ablate_neurons(model, {layer: [neuron]}):
                effects.append((output(model, inputs) - full).abs().max().item())
    return min(effects)


def test_neurons_and_heads_save_reload_and_fuse(tmp_path):
    model, inputs = MODELS["vit"](), make_inputs("vit")
    he.prune_neurons(model, PLAN)
    both = he.prune_heads(copy.deepcopy(model), {1: [0, 3]})
    he.save_model(both, tmp_path / "m")
    loaded_both = he.load_model(tmp_path / "m")
    assert he.kept_neurons(loaded_both) == he.kept_neurons(both) and he.kept_heads(loaded_both) == he.kept_heads(both)
    assert torch.equal(output(loaded_both, inputs), output(both, inputs))  # same weights and shapes: bit-identical
    he.save_model(model, tmp_path / "n")
    loaded = he.load_model(tmp_path / "n")  # neurons only: the base that members prune heads from
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(loaded, random_head_maps(3, seed=7)))]
    expected = torch.stack([output(m, inputs) for m in members], dim=1)
    stacked = he.HydraEnsemble.fuse(members, mlp="stack")
    assert (fused_output(stacked, inputs) - expected).abs().max().item() <= CONTRACT  # contract 3 on an AMP base
    shared = he.build_members(loaded, random_head_maps(3, seed=8, min_heads=1))
    averaged = he.HydraEnsemble.fuse(shared, mlp="average")
    expected = torch.stack([output(m, inputs) for m in shared], dim=1)
    assert (fused_output(averaged, inputs) - expected).abs().max().item() <= CONTRACT  # contract 4
    assert averaged.layers[2].mlp_in_weight.shape[-1] == 7


def test_bad_neuron_plans_are_refused():
    model = MODELS["bert"]()
    with pytest.raises(ValueError, match="without MLP neurons"):
        he.prune_neurons(model, {0: range(37)})
    with pytest.raises(ValueError, match="layer 1 without MLP neurons"):  # refused before layer 0 is cut
        he.prune_neurons(model, {0: [1], 1: range(37)})
    assert (
        he.kept_neurons(model)[0] == list(range(37))
        and get_adapter(model).block(model.bert.encoder.layer[0]).mlp_out.in_features == 37
    )
    with pytest.raises(ValueError, match="out of range"):
        he.prune_neurons(model, {5: [0]})
    he.prune_neurons(model, {0: [1]})
    with pytest.raises(ValueError, match="original numbering"):
        he.prune_neurons(model, {0: [1]})


def test_a_neuron_record_that_disagrees_with_the_weights_is_refused_not_cut_at_the_wrong_neurons(tmp_path):
    """Two ways a record and the MLP widths part: a pruned save loaded at full width by from_pretrained(...,
    ignore_mismatched_sizes=True), and two models built from one config object (HF v5 shares it), one pruned.
    Either way positions read from the record cut or zeroed the wrong neurons, silently."""
    he.save_model(he.prune_neurons(MODELS["bert"](), {0: range(10)}), tmp_path / "member")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = T.BertForSequenceClassification.from_pretrained(tmp_path / "member", ignore_mismatched_sizes=True)
    with pytest.raises(ValueError, match="layer 0 of this BertForSequenceClassification has 37 MLP neurons, and its"):
        he.prune_neurons(loaded, {0: [36]})
    first = MODELS["bert"]()
    second = type(first)(first.config)
    assert second.config is first.config  # the sharing this test is about
    he.prune_neurons(first, {1: [3]})
    with pytest.raises(ValueError, match=r"one config object.*copy\.deepcopy\(config\)"):
        with he.ablate_neurons(second, {1: [4]}):
            pass
    with pytest.raises(ValueError, match=r"has 37 MLP neurons.*one config object.*copy\.deepcopy\(config\)"):
        he.save_model(second, tmp_path / "second")  # was saved under the sibling's record, refused only on load
    pruned = MODELS["bert"]()
    shared = type(pruned)(pruned.config)
    he.prune_heads(pruned, {1: [2]})  # a head record of the sibling's alike
    with pytest.raises(ValueError, match=r"has 4 heads, and its config records 3 kept.*copy\.deepcopy\(config\)"):
        he.save_model(shared, tmp_path / "shared")
    assert not (tmp_path / "second").exists() and not (tmp_path / "shared").exists()


def test_a_neuron_pruning_that_fails_midway_leaves_the_record_true_to_the_layers_it_cut(monkeypatch):
    model = MODELS["bert"]()
    calls = []

    def failing(linear, index, dim):
        calls.append(dim)
        if len(calls) > 2:  # layer 0's two linears are cut, layer 1 fails
            raise RuntimeError("out of memory")
        return slice_linear(linear, index, dim)

    monkeypatch.setattr(neurons_module, "slice_linear", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        he.prune_neurons(model, {0: [1, 2], 1: [3]})
    monkeypatch.undo()
    assert he.kept_neurons(model)[0] == [k for k in range(37) if k not in (1, 2)]
    assert he.kept_neurons(model)[1] == list(range(37))


def test_pruning_draws_nothing_from_the_global_random_stream_and_keeps_dtypes():
    """HF's prune_linear_layer builds each sliced layer by initialising a float32 nn.Linear: every prune moved the
    caller's random stream on."""
    model = MODELS["bert"]().to(torch.bfloat16)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    he.prune_heads(model, {0: [1]})
    he.prune_neurons(model, {1: [0, 4]})
    assert torch.equal(torch.rand(3), expected)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
