"""ModernBERT: fused Wqkv, rotary positions, global and local (sliding-window) layers, gated MLP.

The contracts of tests/pruning (pruned == ablated heads and neurons) run on it through CONTRACT_MODELS, padded and
under SDPA (the CPU default). Here: the same contracts under eager attention and without padding, the shapes of
the fused tensors after pruning, save/reload, Taylor scores read from the fused projection. Fusion's contracts
(tests/fusion) and the fast circuit search on the fused engine (tests/importance/test_circuit.py) cover it too.
"""

import copy

import pytest
import torch
from conftest import HEADS, LAYERS, at_trained_scale, make_inputs, output
from tolerances import CONTRACT, DEFECT

import hydra_ensembles as he
from hydra_ensembles.importance.neurons import magnitude_neuron_scores

HEAD_PLAN = {0: [0, 1, 3], 1: [0, 1, 2, 3], 2: [2]}  # layer 1 (local) emptied; global layers 0 and 2 keep 1 and 3
NEURON_PLAN = {0: [0, 5, 36], 1: list(range(20)), 2: list(range(30))}  # MLP width 37


def _inputs(padded: bool) -> dict:
    inputs = make_inputs("modernbert")
    return inputs if padded else {"input_ids": inputs["input_ids"]}


def test_the_tiny_config_has_global_and_local_layers_and_the_window_matters():
    model = at_trained_scale("modernbert")
    assert model.config.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    inputs = _inputs(padded=False)
    wide = copy.deepcopy(model)
    wide.config.sliding_window = 100  # the local layer's mask is built from the config: now it sees everything
    assert (output(wide, inputs) - output(model, inputs)).abs().max().item() >= DEFECT


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ["modernbert", "modernbert_encoder"])
def test_pruned_heads_and_neurons_equal_ablated_ones(name, attention, padded):
    model, inputs = at_trained_scale(name), _inputs(padded)
    model.set_attn_implementation(attention)
    with he.ablate_heads(model, HEAD_PLAN), he.ablate_neurons(model, NEURON_PLAN):
        ablated = output(model, inputs)
    assert (output(model, inputs) - ablated).abs().max().item() >= DEFECT  # the plans change the output
    pruned = he.prune_neurons(he.prune_heads(copy.deepcopy(model), HEAD_PLAN), NEURON_PLAN)
    assert (output(pruned, inputs) - ablated).abs().max().item() <= CONTRACT


def test_pruning_resizes_the_fused_projection_and_the_gated_mlp_and_reloads(tmp_path):
    model = at_trained_scale("modernbert")
    pruned = he.prune_neurons(he.prune_heads(copy.deepcopy(model), HEAD_PLAN), NEURON_PLAN)
    head_dim = 32 // HEADS
    for index, layer in enumerate(pruned.model.layers):
        heads = max(HEADS - len(HEAD_PLAN[index]), 1)  # an emptied layer keeps a zero placeholder head
        neurons = 37 - len(NEURON_PLAN[index])
        assert layer.attn.Wqkv.weight.shape == (3 * heads * head_dim, 32)  # [q | k | v] of the kept heads
        assert layer.attn.Wo.weight.shape == (32, heads * head_dim)
        assert layer.mlp.Wi.weight.shape == (2 * neurons, 32)  # [input | gate] of the kept neurons
        assert layer.mlp.Wo.weight.shape == (32, neurons)
    assert he.kept_heads(pruned) == {0: [2], 1: [], 2: [0, 1, 3]}
    # the kept rows are the original rows of those heads and neurons, in each of the fused blocks
    original, kept = model.model.layers[2], pruned.model.layers[2]
    rows = torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in (0, 1, 3)])
    assert torch.equal(kept.attn.Wqkv.weight, original.attn.Wqkv.weight[torch.cat([rows, rows + 32, rows + 64])])
    assert torch.equal(
        kept.mlp.Wi.weight, original.mlp.Wi.weight[torch.cat([torch.arange(30, 37), torch.arange(67, 74)])]
    )
    he.save_model(pruned, tmp_path / "m")
    loaded = he.load_model(tmp_path / "m")
    inputs = _inputs(padded=True)
    assert torch.equal(output(loaded, inputs), output(pruned, inputs))


def test_taylor_scores_read_the_q_k_v_blocks_of_the_fused_projection():
    """s_h = mean over q, k, v of mean |W * dL/dW| over head h's rows, the blocks cut from Wqkv by hand."""
    model = at_trained_scale("modernbert")
    batches = [make_inputs("modernbert", seed=s) | {"labels": torch.tensor([0, 1, 2, 1])} for s in (1, 2)]
    scores = he.taylor_head_scores(model, batches, loss="cross_entropy", progress=False)
    weights = [layer.attn.Wqkv.weight for layer in model.model.layers]
    model.zero_grad()
    for batch in batches:  # two batches of 4: the mean loss is the mean of the two batch means
        (model(**batch).loss / len(batches)).backward()
    head_dim = 32 // HEADS
    for layer, weight in enumerate(weights):
        saliency = (weight.detach() * weight.grad).abs().view(3, HEADS, head_dim, 32)  # ([q, k, v], H, dh, d)
        expected = saliency.mean(dim=(2, 3)).mean(dim=0)  # (H,)
        torch.testing.assert_close(scores[layer], expected, rtol=1e-4, atol=0)
    assert scores.shape == (LAYERS, HEADS) and scores.std() > 0


def test_taylor_scores_of_a_pruned_model_are_nan_for_its_pruned_heads():
    model = he.prune_heads(at_trained_scale("modernbert"), {1: [0, 2]})
    batches = [make_inputs("modernbert") | {"labels": torch.tensor([0, 1, 2, 1])}]
    scores = he.taylor_head_scores(model, batches, progress=False)
    assert scores[1].isnan().tolist() == [True, False, True, False] and not scores[[0, 2]].isnan().any()
    unpruned = at_trained_scale("modernbert")
    with he.ablate_heads(unpruned, {1: [0, 2]}):  # pruned == ablated: the kept heads' scores, head by head
        ablated = he.taylor_head_scores(unpruned, batches, progress=False)
    torch.testing.assert_close(scores[1, [1, 3]], ablated[1, [1, 3]], rtol=1e-5, atol=0)
    torch.testing.assert_close(scores[[0, 2]], ablated[[0, 2]], rtol=1e-5, atol=0)


def test_neuron_scores_are_one_per_gated_unit():
    model = at_trained_scale("modernbert")
    batches = [make_inputs("modernbert") | {"labels": torch.tensor([0, 1, 2, 1])}]
    magnitudes = magnitude_neuron_scores(model)
    for scores in (he.neuron_scores(model, batches, progress=False), magnitudes):
        assert [s.shape for s in scores] == [(37,)] * LAYERS and all(s.min() > 0 for s in scores)
    mlp = model.model.layers[1].mlp  # neuron k: its input row k, its gate row 37 + k, its output column k
    expected = torch.cat([mlp.Wi.weight[:37], mlp.Wi.weight[37:], mlp.Wo.weight.T], dim=1).norm(dim=1)
    torch.testing.assert_close(magnitudes[1], expected.detach())
