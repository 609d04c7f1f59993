"""The fusion contracts of DESIGN.md (fp32, max abs difference <= 1e-5) on every supported family.

Each test also asserts that the defects the contract guards against (one head wrongly kept or dropped, one member
given another member's MLP) would move the output by at least DEFECT = 100x the bound, so that passing means
something: the models are built at a trained model's scale (conftest.at_trained_scale).
"""

import copy

import pytest
import torch
from conftest import (
    CONTRACT_MODELS,
    MODELS,
    at_trained_scale,
    fused_output,
    make_inputs,
    output,
    perturb,
    random_head_maps,
    smallest_head_effect,
    smallest_mlp_swap_effect,
)
from tolerances import CONTRACT, DEFECT

import hydra_ensembles as he

TOL = CONTRACT  # fp32, DESIGN.md; tests/tolerances.py says why it holds on any CPU


@pytest.mark.parametrize("name", CONTRACT_MODELS)
def test_contract1_one_unpruned_member_equals_the_original(name):
    model, inputs = at_trained_scale(name), make_inputs(name)
    ensemble = he.HydraEnsemble.fuse([model])
    got = fused_output(ensemble, inputs)
    assert got.shape[1] == 1
    assert (got[:, 0] - output(model, inputs)).abs().max().item() <= TOL
    assert smallest_head_effect(model, inputs) >= DEFECT  # a head lost in fusion would show


@pytest.mark.parametrize("num_members", [1, 2, 3, 5])
@pytest.mark.parametrize("name", CONTRACT_MODELS)
def test_contract3_stack_equals_members_run_one_by_one(name, num_members):
    """Separately 'fine-tuned' members (every weight differs, embeddings and heads included), unequal head
    counts per member and per layer, a layer with one head, an emptied layer, padded batches."""
    model, inputs = at_trained_scale(name), make_inputs(name)
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(model, random_head_maps(num_members, seed=3)))]
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
    expected = torch.stack([output(m, inputs) for m in members], dim=1)  # (B, M, C)
    got = fused_output(ensemble, inputs)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= TOL
    assert smallest_head_effect(members[-1], inputs) >= DEFECT  # one head of one member wrongly kept or dropped
    if num_members > 1:
        assert smallest_mlp_swap_effect(members, inputs) >= DEFECT  # member 0 given member 1's MLP in one layer
    if ensemble.is_classifier:
        member_probs = expected.softmax(-1).mean(1)
        assert (ensemble(**inputs).probs - member_probs).abs().max().item() <= TOL


@pytest.mark.parametrize("num_members", [2, 3, 5])
@pytest.mark.parametrize("name", CONTRACT_MODELS)
def test_contract4_average_is_exact_for_members_sharing_their_mlps(name, num_members):
    """Zero-shot members differ only in their heads (and their classifiers): averaging changes nothing."""
    model, inputs = at_trained_scale(name), make_inputs(name)
    members = he.build_members(model, random_head_maps(num_members, seed=5))
    for i, member in enumerate(members[1:], start=1):  # own classifiers, shared everything else
        head = [
            p
            for n, p in member.named_parameters()
            if not any(k in n for k in ("layer", "embeddings", "pre_layrnorm", "relative_attention_bias"))
        ]  # MPNet's relative position bias is shared by all layers, so not the classifier's: a shift would hide
        with torch.no_grad():
            for p in head:
                p.add_(0.05 * i)
    ensemble = he.HydraEnsemble.fuse(members, mlp="average")
    expected = torch.stack([output(m, inputs) for m in members], dim=1)
    assert (fused_output(ensemble, inputs) - expected).abs().max().item() <= TOL
    assert smallest_head_effect(members[-1], inputs) >= DEFECT


def test_average_mode_runs_each_member_with_the_averaged_mlp():
    """mlp='average' is the paper's merged MLP: member m's stream uses mean_m(MLP weights) (and mean norms)."""
    model, inputs = MODELS["vit"](), make_inputs("vit")
    members = [
        perturb(m, seed=i) for i, m in enumerate(he.build_members(model, random_head_maps(3, seed=2, min_heads=1)))
    ]
    ensemble = he.HydraEnsemble.fuse(members, mlp="average")
    averaged = [copy.deepcopy(m) for m in members]
    shared = [n for n, _ in members[0].named_parameters() if any(k in n for k in ("mlp.", "layernorm_", "embeddings"))]
    with torch.no_grad():
        for name in shared:
            mean = torch.stack([m.get_parameter(name) for m in members]).mean(0)
            for m in averaged:
                m.get_parameter(name).copy_(mean)
    expected = torch.stack([output(m, inputs) for m in averaged], dim=1)
    assert (fused_output(ensemble, inputs) - expected).abs().max().item() <= TOL
    separate = torch.stack([output(m, inputs) for m in members], dim=1)
    assert (fused_output(ensemble, inputs) - separate).abs().max().item() > DEFECT  # it is an approximation


def test_identical_tensors_are_stored_once():
    model = MODELS["bert"]()
    members = he.build_members(model, random_head_maps(3, seed=1))
    stacked = he.HydraEnsemble.fuse(members, mlp="stack")
    assert stacked.layers[0].mlp_in_weight.shape[0] == 1  # zero-shot members share their MLPs
    assert not stacked.outer.embeddings_per_member
    tuned = he.HydraEnsemble.fuse([perturb(m, seed=i) for i, m in enumerate(members)], mlp="stack")
    assert tuned.layers[0].mlp_in_weight.shape[0] == 3 and tuned.outer.embeddings_per_member


def test_encoder_outputs_pooled_and_hidden_states():
    model, inputs = MODELS["bert_encoder"](), make_inputs("bert_encoder")
    members = he.build_members(model, random_head_maps(2, seed=4, min_heads=1))
    out = he.HydraEnsemble.fuse(members)(output_hidden_states=True, **inputs)
    assert out.member_logits is None and out.member_pooled.shape == (4, 2, 32)
    assert out.member_hidden_states.shape == (4, 2, 10, 32)
    with pytest.raises(ValueError, match="no classifier"):
        _ = out.probs
