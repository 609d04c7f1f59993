"""DeBERTa-v2/v3 beyond the shared contract tests (conftest.DEBERTA runs in CONTRACT_MODELS: pruned == ablated,
neurons pruned == zeroed): the position projections follow their heads, a head's position terms matter and go
away when the head is ablated, Taylor scores run, the fast circuit search (fused engine) equals the reference one,
fusion refuses the ConvLayer with its reason."""

import copy

import pytest
import torch
from conftest import DEBERTA, HEADS, MODELS, at_trained_scale, make_inputs, output, perturb
from tolerances import DEFECT

import hydra_ensembles as he

PLAN = {0: [1, 3], 1: [0, 1, 2, 3], 2: [2]}  # two heads, a whole layer (placeholder head), one head
POSITION_PROJECTIONS = ("pos_key_proj", "pos_query_proj")
HEAD_DIM = 8


def _attention(model, layer: int):
    return he.get_adapter(model).layers(model)[layer].attention.self


@pytest.mark.parametrize("name", list(DEBERTA))
def test_position_projections_lose_the_pruned_heads_rows(name):
    model = at_trained_scale(name)
    originals = {
        (layer, proj): getattr(_attention(model, layer), proj).weight.detach().clone()
        for layer in range(3)
        for proj in POSITION_PROJECTIONS
        if hasattr(_attention(model, layer), proj)
    }
    assert bool(originals) != _attention(model, 0).share_att_key  # own projections, or the shared q/k only
    he.prune_heads(model, PLAN)
    for (layer, proj), weight in originals.items():
        attention = _attention(model, layer)
        kept = he.kept_heads(model)[layer]
        pruned = getattr(attention, proj).weight  # (H'*dh, d)
        assert attention.num_attention_heads == max(len(kept), 1) and attention.all_head_size == pruned.shape[0]
        if kept:
            rows = torch.cat([torch.arange(h * HEAD_DIM, (h + 1) * HEAD_DIM) for h in kept])
            assert torch.equal(pruned, weight[rows])
        else:  # the placeholder head of an emptied layer: zero and frozen, like its q/k/v
            assert pruned.shape[0] == HEAD_DIM and not pruned.any() and not pruned.requires_grad


@pytest.mark.parametrize("name", [n for n in DEBERTA if n != "deberta"])  # "deberta" shares q/k for positions
def test_a_head_reading_another_heads_position_rows_would_show(name):
    """The contract tests can catch a position projection sliced wrong, not only one left whole (that one fails
    with a shape error): giving a kept head another head's position rows moves the output by >= DEFECT."""
    model, inputs = at_trained_scale(name), make_inputs(name)
    full = output(model, inputs)
    effects = []
    for layer in range(3):
        for proj in POSITION_PROJECTIONS:
            linear = getattr(_attention(model, layer), proj, None)
            if linear is None:
                continue
            saved = linear.weight.detach().clone()
            swapped = torch.cat([saved[HEAD_DIM : 2 * HEAD_DIM], saved[:HEAD_DIM], saved[2 * HEAD_DIM :]])
            with torch.no_grad():
                linear.weight.copy_(swapped)  # heads 0 and 1 exchange their position rows
                effects.append((output(model, inputs) - full).abs().max().item())
                linear.weight.copy_(saved)
    assert effects and min(effects) >= DEFECT


@pytest.mark.parametrize("name", list(DEBERTA))
def test_an_ablated_heads_position_terms_go_away_with_it(name):
    """Ablation zeroes the head's columns of W_o: its c2p and p2c terms only shape its own attention, so they no
    longer reach the output (whatever its position projections or, with share_att_key, its q/k rows hold)."""
    model, inputs = at_trained_scale(name), make_inputs(name)
    attention = _attention(model, 1)
    projections = [getattr(attention, p) for p in POSITION_PROJECTIONS if hasattr(attention, p)]
    projections = projections or [attention.query_proj, attention.key_proj]
    with he.ablate_heads(model, {1: [2]}):
        ablated = output(model, inputs)
        with torch.no_grad():
            for linear in projections:
                linear.weight[2 * HEAD_DIM : 3 * HEAD_DIM].normal_(0, 1)  # head 2's position (and q/k) rows
        assert (output(model, inputs) - ablated).abs().max().item() == 0
    assert (output(model, inputs) - ablated).abs().max().item() >= DEFECT  # restored W_o: the head is back


@pytest.mark.parametrize("name", ["deberta", "deberta_encoder"])
def test_pruned_deberta_saves_and_reloads(name, tmp_path):
    model, inputs = perturb(he.prune_heads(MODELS[name](), PLAN)), make_inputs(name)
    he.prune_neurons(model, {1: [0, 5]})
    he.save_model(model, tmp_path / "member")
    loaded = he.load_model(tmp_path / "member")
    assert he.kept_heads(loaded) == he.kept_heads(model) and he.kept_neurons(loaded) == he.kept_neurons(model)
    assert torch.equal(output(loaded, inputs), output(model, inputs))


def test_taylor_scores_follow_pruning():
    """Scores of a pruned model are the unpruned model's scores with the heads ablated (NaN where pruned)."""
    model, batches = at_trained_scale("deberta"), [make_inputs("deberta", seed=s) for s in (1, 2)]
    batches = [b | {"labels": torch.tensor([0, 1, 2, 1])} for b in batches]
    scores = he.taylor_head_scores(model, batches, progress=False)
    assert scores.shape == (3, HEADS) and torch.isfinite(scores).all() and (scores > 0).all()
    pruned = he.prune_heads(copy.deepcopy(model), PLAN)
    after = he.taylor_head_scores(pruned, batches, progress=False)
    for layer, heads in he.kept_heads(pruned).items():
        gone = [h for h in range(HEADS) if h not in heads]
        assert torch.isnan(after[layer, gone]).all() and torch.isfinite(after[layer, heads]).all()
    sequential = he.taylor_head_scores(model, batches, sequential_budget=1, progress=False)
    torch.testing.assert_close(sequential[0], scores[0])  # layer 0 is scored before anything is pruned


def test_fast_circuit_equals_reference_and_the_conv_refuses_fusion_with_its_reason():
    """The fast search scores candidates on the fused engine (position terms included): it must remove the heads
    the reference search (the HF model) removes. v2-xlarge's ConvLayer is not fused: a ValueError says so."""
    model = at_trained_scale("deberta")
    id_batches = [make_inputs("deberta", seed=s) | {"labels": torch.tensor([0, 1, 2, 1])} for s in (1, 2)]
    ood_batches = [make_inputs("deberta", seed=s) for s in (3, 4)]
    circuit = he.extract_circuit(model, id_batches, ood_batches, "avg", budget=3, method="reference", progress=False)
    assert len(set(circuit.removed)) == 3 and he.kept_heads(model) == {i: list(range(HEADS)) for i in range(3)}
    fast = he.extract_circuit(model, id_batches, ood_batches, "avg", budget=3, method="fast", progress=False)
    assert fast.removed == circuit.removed
    encoder = at_trained_scale("deberta_encoder")
    members = he.build_members(encoder, [{0: [0, 1]}, {0: [2, 3]}])
    with pytest.raises(ValueError, match="DebertaV2Model cannot be fused: .*convolution after layer 0"):
        he.HydraEnsemble.fuse(members)
