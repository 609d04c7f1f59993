"""Taylor head scores (§D.1.1) against a literal computation of the formula."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import HEADS, LAYERS, MODELS, make_inputs
from tolerances import U32, reordered_sum

import hydra_ensembles as he

# Scores are means of |W * dL/dW| whose gradients both computations sum in another order: over <= 8 examples x 10
# tokens, and through 3 layers of ~6 reductions of width <= 37. Relative to the score, float32 rounding is at most
# that of a sum of 8 * 10 + 3 * 6 * 37 = 746 terms (the worst case, 9e-5).
TAYLOR_RTOL = reordered_sum(8 * 10 + 3 * 6 * 37, 1.0, U32)


def _loader(name, batches=2, batch=4, labels=True):
    out = []
    for i in range(batches):
        inputs = make_inputs(name, batch=batch, seed=10 + i)
        if labels:
            inputs["labels"] = torch.arange(batch) % 3
        out.append(inputs)
    return out


def _literal_scores(model, loss_of_output, batches):
    """The paper's formula, written out: one backward pass over all data concatenated."""
    model = copy.deepcopy(model)
    adapter = he.get_adapter(model)
    inputs = {k: torch.cat([b[k] for b in batches]) for k in batches[0] if k != "labels"}
    labels = torch.cat([b["labels"] for b in batches]) if "labels" in batches[0] else None
    loss_of_output(adapter.output(model, inputs), labels).backward()
    scores = torch.zeros(LAYERS, HEADS)
    for layer in range(LAYERS):
        block = adapter.block(adapter.layers(model)[layer])
        for linear in (block.query, block.key, block.value):
            W, G = linear.weight, linear.weight.grad  # (H*dh, D)
            d_h, D = W.shape[0] // HEADS, W.shape[1]
            for h in range(HEADS):
                rows = slice(h * d_h, (h + 1) * d_h)
                scores[layer, h] += (W[rows] * G[rows]).abs().sum() / (d_h * D) / 3
    return scores


def test_cross_entropy_scores_follow_the_formula_and_ignore_batching():
    model, batches = MODELS["bert"](), _loader("bert")
    expected = _literal_scores(model, F.cross_entropy, batches)
    got = he.taylor_head_scores(model, batches, progress=False)
    assert got.shape == (LAYERS, HEADS)
    torch.testing.assert_close(got, expected, rtol=TAYLOR_RTOL, atol=0)
    rebatched = [{k: v[i : i + 2] for k, v in b.items()} for b in batches for i in (0, 2)]
    torch.testing.assert_close(he.taylor_head_scores(model, rebatched, progress=False), got, rtol=TAYLOR_RTOL, atol=0)


def test_every_gradient_score_works_inside_a_callers_no_grad():
    """Taylor scores, the circuit screen's first-order estimates and OBA's raised "element 0 of tensors does not
    require grad" under an inference-mode caller's `torch.no_grad()` (neuron scores did not: they enabled grad)."""
    from hydra_ensembles.importance.circuit.criteria import CRITERIA
    from hydra_ensembles.importance.circuit.scoring import FastScorer
    from hydra_ensembles.importance.oba import oba_scores

    model, batches = MODELS["bert"](), _loader("bert")
    outside = he.taylor_head_scores(model, batches, progress=False)
    unlabelled = [{k: v for k, v in b.items() if k != "labels"} for b in batches]
    estimates = FastScorer(model, batches, unlabelled, CRITERIA["acc"]).first_order([])
    oba = oba_scores(model, batches[:1], progress=False)
    with torch.no_grad():
        torch.testing.assert_close(he.taylor_head_scores(model, batches, progress=False), outside, rtol=0, atol=0)
        assert FastScorer(model, batches, unlabelled, CRITERIA["acc"]).first_order([]) == estimates
        inside = oba_scores(model, batches[:1], progress=False)
    assert inside.keys() == oba.keys() and all(torch.equal(inside[k], oba[k]) for k in oba)


def test_label_free_entropy_for_a_classifier():
    model, batches = MODELS["vit"](), _loader("vit", batches=1, labels=False)

    def entropy(logits, _):
        p = logits.softmax(-1)
        return -(p * p.log()).sum(-1).mean()

    torch.testing.assert_close(
        he.taylor_head_scores(model, batches, progress=False),
        _literal_scores(model, entropy, batches),
        rtol=TAYLOR_RTOL,
        atol=0,
    )


def test_label_free_similarity_entropy_for_an_encoder():
    """Paper 002 Eq. 5-7: softmax over in-batch cosine similarities of pooled embeddings, tau = 1/15."""
    model, batches = MODELS["clip_vision"](), _loader("clip_vision", batches=1, batch=6, labels=False)

    def similarity_entropy(z, _):
        z = F.normalize(z, dim=-1)
        p = (z @ z.T * 15).softmax(-1)
        return -(p * p.log()).sum(-1).mean()

    torch.testing.assert_close(
        he.taylor_head_scores(model, batches, progress=False),
        _literal_scores(model, similarity_entropy, batches),
        rtol=TAYLOR_RTOL,
        atol=0,
    )


def test_sequential_mode_rescores_after_pruning_each_layer():
    model, batches = MODELS["bert"](), _loader("bert")
    sequential = he.taylor_head_scores(model, batches, sequential_budget=[2, 1, 1], progress=False)
    one_shot = he.taylor_head_scores(model, batches, progress=False)
    torch.testing.assert_close(sequential[0], one_shot[0])  # nothing pruned yet when layer 0 is scored
    lowest = sorted(range(HEADS), key=lambda h: one_shot[0, h].item())[:2]
    pruned = he.prune_heads(copy.deepcopy(model), {0: lowest})
    torch.testing.assert_close(sequential[1], he.taylor_head_scores(pruned, batches, progress=False)[1])
    assert not torch.allclose(sequential[1], one_shot[1], rtol=TAYLOR_RTOL, atol=0)  # differ beyond rounding


def test_scores_of_a_pruned_model_are_nan_for_pruned_heads_and_the_model_is_untouched():
    model = he.prune_heads(MODELS["bert"](), {1: [0, 2]})
    model.train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]
    scores = he.taylor_head_scores(model, _loader("bert"), progress=False)
    assert scores[1].isnan().tolist() == [True, False, True, False] and not scores[[0, 2]].isnan().any()
    unpruned = MODELS["bert"]()
    with he.ablate_heads(unpruned, {1: [0, 2]}):  # pruned == ablated: the kept heads' scores, head by head
        ablated = he.taylor_head_scores(unpruned, _loader("bert"), progress=False)
    torch.testing.assert_close(scores[1, [1, 3]], ablated[1, [1, 3]], rtol=TAYLOR_RTOL, atol=0)
    torch.testing.assert_close(scores[[0, 2]], ablated[[0, 2]], rtol=TAYLOR_RTOL, atol=0)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert [p.requires_grad for p in model.parameters()] == flags and model.training


def test_a_model_with_an_emptied_layer_is_scored_and_sampled():
    model, batches = he.prune_heads(MODELS["bert"](), {1: list(range(HEADS))}), _loader("bert")
    scores = he.taylor_head_scores(model, batches, progress=False)
    sequential = he.taylor_head_scores(model, batches, sequential_budget=[1, 0, 1], progress=False)
    assert scores[1].isnan().all() and sequential[1].isnan().all() and not sequential[[0, 2]].isnan().any()
    maps = he.sample_members(scores, num_members=2)  # default budgets [1, 0, 1]: the empty layer stays empty
    assert all(head_map[1] == [] and len(head_map[0]) == HEADS - 1 for head_map in maps)
    he.build_members(model, maps)


def test_bad_input_is_rejected():
    model = MODELS["bert"]()
    with pytest.raises(ValueError, match="calibration loader is empty"):
        he.taylor_head_scores(model, [], progress=False)
    with pytest.raises(ValueError, match="needs a classifier and batches with 'labels'"):
        he.taylor_head_scores(model, _loader("bert", labels=False), loss="cross_entropy", progress=False)
    with pytest.raises(ValueError, match="layer 0 is 4 but the layer has 4 heads"):
        he.taylor_head_scores(model, _loader("bert"), sequential_budget=HEADS, progress=False)
    passes = []
    model.register_forward_hook(lambda module, args, output: passes.append(1))
    with pytest.raises(ValueError, match="layer 2 is 4 but the layer has 4 heads"):  # refused before any scoring
        he.taylor_head_scores(model, _loader("bert"), sequential_budget=[1, 1, HEADS], progress=False)
    assert not passes
    with pytest.raises(TypeError, match="dict batches"):
        he.taylor_head_scores(model, [torch.zeros(2, 3)], progress=False)
    encoder = MODELS["bert_encoder"]()  # the similarity loss reads [CLS] features, not a readout's input
    with pytest.raises(ValueError, match="reads the last layer's .CLS. features, which a readout"):
        he.taylor_head_scores(encoder, _loader("bert"), loss="similarity", readout=lambda x: x, progress=False)


class _Margin(he.importance.TaylorLoss):
    """A loss a user might add: the mean gap between the two largest logits (label-free)."""

    needs_labels = False

    def __call__(self, output, labels, *, classifier, temperature):
        top_two = output.float().topk(2, dim=-1).values  # (B, 2)
        return (top_two[:, 0] - top_two[:, 1]).mean()


def test_a_registered_loss_reaches_head_and_neuron_scores_and_the_cli(monkeypatch):
    from hydra_ensembles.cli import build_parser
    from hydra_ensembles.importance import losses

    monkeypatch.setitem(losses.TAYLOR_LOSSES, "margin", _Margin())
    model, batches = MODELS["bert"](), _loader("bert", labels=False)
    scores = he.taylor_head_scores(model, batches, loss="margin", progress=False)
    expected = _literal_scores(
        model, lambda output, labels: _Margin()(output, labels, classifier=True, temperature=1), batches
    )
    torch.testing.assert_close(scores, expected, rtol=TAYLOR_RTOL, atol=0)
    assert len(he.neuron_scores(model, batches, loss="margin", progress=False)) == LAYERS
    parser = build_parser()  # the choices are read from the registry when the parser is built
    for command in (
        ["scores", "--model", "m", "--data", "d"],
        ["amp", "--model", "m", "--data", "d", "--delta-e", "1"],
    ):
        assert parser.parse_args([*command, "--out", "o", "--loss", "margin"]).loss == "margin"
    assert losses.needs_labels("margin") is False and losses.needs_labels("auto") is None


def test_labels_outside_the_classes_are_refused_naming_the_fix():
    """Labels numbered 1..C: torch's cross-entropy said only "Target 3 is out of bounds"."""
    batches = _loader("bert")
    batches[0]["labels"] = batches[0]["labels"] + 1
    one_off = r"loss='cross_entropy' needs integer class ids in \[0, 3\) as labels.*labels 1..C are one off"
    with pytest.raises(ValueError, match=one_off):
        he.taylor_head_scores(MODELS["bert"](), batches, progress=False)
