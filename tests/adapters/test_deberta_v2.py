"""DeBERTa-v2/v3 beyond the shared contract tests (conftest.DEBERTA runs in CONTRACT_MODELS: pruned == ablated,
neurons pruned == zeroed; the fusion contracts run on the variants without the convolution): the position
projections follow their heads, a head's position terms matter and go away when the head is ablated, Taylor scores
run, the fast circuit search (fused engine) equals the reference one, and v2-xlarge's ConvLayer after layer 0 is
fused exactly (stack and average, padded and ragged layer 0, padding, unfuse, save/load, circuit candidates,
FLOPs)."""

import copy

import pytest
import torch
import transformers as T
from conftest import (
    DEBERTA,
    HEADS,
    MODELS,
    at_trained_scale,
    fused_output,
    index_order,
    make_inputs,
    output,
    perturb,
)
from tolerances import CONTRACT, DEFECT

import hydra_ensembles as he

PLAN = {0: [1, 3], 1: [0, 1, 2, 3], 2: [2]}  # two heads, a whole layer (placeholder head), one head
SCORES = 1e-5  # a kept head's Taylor score, pruned against ablated (measured: equal)
POSITION_PROJECTIONS = ("pos_key_proj", "pos_query_proj")
HEAD_DIM = 8


def _attention(model, layer: int):
    return he.get_adapter(model).layers(model)[layer].attention.self


@pytest.mark.parametrize("name", list(DEBERTA))
def test_position_projections_lose_the_pruned_heads_rows(name):
    model = at_trained_scale(name)
    shared = _attention(model, 0).share_att_key  # positions projected by the heads' own q/k: check those rows
    assert any(hasattr(_attention(model, 0), proj) for proj in POSITION_PROJECTIONS) != shared
    projections = ("query_proj", "key_proj") if shared else POSITION_PROJECTIONS
    originals = {
        (layer, proj): getattr(_attention(model, layer), proj).weight.detach().clone()
        for layer in range(3)
        for proj in projections
        if hasattr(_attention(model, layer), proj)
    }
    assert originals
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
    with he.ablate_heads(model, PLAN):
        ablated = he.taylor_head_scores(model, batches, progress=False)
    for layer, heads in he.kept_heads(pruned).items():
        gone = [h for h in range(HEADS) if h not in heads]
        assert torch.isnan(after[layer, gone]).all() and torch.isfinite(after[layer, heads]).all()
        torch.testing.assert_close(after[layer, heads], ablated[layer, heads], rtol=SCORES, atol=0)  # head by head
    sequential = he.taylor_head_scores(model, batches, sequential_budget=1, progress=False)
    torch.testing.assert_close(sequential[0], scores[0])  # layer 0 is scored before anything is pruned


def test_fast_circuit_equals_reference():
    """The fast search scores candidates on the fused engine (position terms included): it must remove the heads
    the reference search (the HF model) removes."""
    model = at_trained_scale("deberta")
    id_batches = [make_inputs("deberta", seed=s) | {"labels": torch.tensor([0, 1, 2, 1])} for s in (1, 2)]
    ood_batches = [make_inputs("deberta", seed=s) for s in (3, 4)]
    circuit = he.extract_circuit(model, id_batches, ood_batches, "avg", budget=3, method="reference", progress=False)
    assert len(set(circuit.removed)) == 3 and he.kept_heads(model) == {i: list(range(HEADS)) for i in range(3)}
    fast = he.extract_circuit(model, id_batches, ood_batches, "avg", budget=3, method="fast", progress=False)
    assert circuit.removed != index_order(model)[:3]  # the heads decided it: a blind scorer would not agree
    assert fast.removed == circuit.removed


# ---- v2-xlarge's ConvLayer: a convolution over layer 0's input, mixed into its output (fused layer 0 holds it) ----

CONV_INPUTS = "deberta_encoder"  # make_inputs' text batch, padded (rows of 10, 7, 4 and 9 tokens)
# layer 0 ragged (1, 4 and 2 heads), layer 1 padded (2 heads each), the last layer ragged with an emptied member
RAGGED = [{0: [2], 1: [1, 2], 2: []}, {0: [0, 1, 2, 3], 1: [0, 3], 2: [0, 2]}, {0: [1, 3], 1: [0, 1], 2: [0, 1, 2, 3]}]
PADDED = [{0: [0, 1], 1: [0], 2: [1, 2]}, {0: [2, 3], 1: [0, 1, 2], 2: [3]}]  # layer 0 padded (2 heads each)


def _conv_classifier(layers: int = 3) -> torch.nn.Module:
    """v2-xlarge's layout (ConvLayer after layer 0, kernel 3; own position projections, c2p and p2c) as a 3-class
    classifier: conftest's "deberta_encoder" at a trained scale with `layers` layers, its convolution's kernel
    scaled as the linears are (x5), so that a convolution misplaced moves the logits by >= DEFECT."""
    encoder = at_trained_scale("deberta_encoder")
    config = copy.deepcopy(encoder.config)
    config.num_hidden_layers, config.num_labels = layers, 3
    torch.manual_seed(0)
    model = T.DebertaV2ForSequenceClassification(config).eval()
    model.deberta.load_state_dict(encoder.state_dict(), strict=False)  # the layers past `layers` are left out
    with torch.no_grad():
        for weight in (model.deberta.encoder.conv.conv.weight, model.pooler.dense.weight, model.classifier.weight):
            weight.mul_(5.0)
    return model


def _conv_effect(model: torch.nn.Module, inputs: dict) -> float:
    """max |logit change| without the convolution: what a fusion that lost or misplaced it would move."""
    encoder, full = model.deberta.encoder, output(model, inputs)
    conv, encoder.conv = encoder.conv, None
    try:
        return (output(model, inputs) - full).abs().max().item()
    finally:
        encoder.conv = conv


@pytest.mark.parametrize("maps", [RAGGED, PADDED], ids=["ragged", "padded"])
def test_the_conv_fuses_exactly(maps):
    """Fused members (stack: every weight their own, the convolution's too; average: members that share all but
    their heads) equal the members run one by one, with padding in the batch."""
    model, inputs = _conv_classifier(), make_inputs(CONV_INPUTS)
    zero_shot = he.build_members(model, maps)
    tuned = [perturb(m, seed=i) for i, m in enumerate(he.build_members(model, maps))]
    for members, mlp, copies in ((tuned, "stack", len(maps)), (zero_shot, "average", 1)):
        ensemble = he.HydraEnsemble.fuse(members, mlp=mlp)
        assert ensemble.layers[0].conv_weight.shape == (copies, 32, 32, 3) and ensemble.layers[1].conv_weight is None
        assert ensemble.layers[0].ragged == (maps is RAGGED) and not ensemble.averaged
        expected = torch.stack([output(m, inputs) for m in members], dim=1)  # (B, M, C)
        assert (fused_output(ensemble, inputs) - expected).abs().max().item() <= CONTRACT
    assert min(_conv_effect(m, inputs) for m in tuned) >= DEFECT


def test_the_conv_of_a_last_layer_reads_every_input_row_and_zeroes_padding():
    """In a one-layer model layer 0 is the last: computing only the [CLS] row, its convolution still reads the
    rows beside it; and its output, the last hidden state, is zero at padded tokens (HF's mask multiply)."""
    model, inputs = _conv_classifier(layers=1), make_inputs(CONV_INPUTS)
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(model, [{0: [0]}, {0: [1, 2, 3]}]))]
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
    expected = torch.stack([output(m, inputs) for m in members], dim=1)
    assert (fused_output(ensemble, inputs) - expected).abs().max().item() <= CONTRACT  # the [CLS] row alone
    with torch.no_grad():
        hidden = ensemble(output_hidden_states=True, **inputs).member_hidden_states  # (B, M, T, d)
        states = torch.stack([m(**inputs, output_hidden_states=True).hidden_states[-1] for m in members], dim=1)
    padding = inputs["attention_mask"] == 0  # (B, T)
    assert padding.any() and not states.transpose(1, 2)[padding].any()  # HF zeroes them
    assert (hidden - states).abs().max().item() <= CONTRACT  # every row, padded ones included


def test_the_conv_unfuses_saves_reloads_and_stays_in_layer_0(tmp_path):
    """unfuse writes each member's convolution back (after the fused one moved, as training moves it); a saved
    ensemble reloads equal; the convolution is layer 0's for training (and decays as an HF model's would), and
    the modules around the fused layers do not hold a second copy of it."""
    model, inputs = _conv_classifier(), make_inputs(CONV_INPUTS)
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(model, RAGGED))]
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
    with torch.no_grad():
        for name in ("conv_weight", "conv_bias", "conv_norm_weight", "conv_norm_bias"):
            getattr(ensemble.layers[0], name).add_(0.1)
    fused = fused_output(ensemble, inputs)
    unfused = torch.stack([output(m, inputs) for m in ensemble.unfuse(members)], dim=1)
    assert (fused - unfused).abs().max().item() <= CONTRACT
    assert (fused - torch.stack([output(m, inputs) for m in members], dim=1)).abs().max().item() >= DEFECT
    loaded = he.HydraEnsemble.from_pretrained(ensemble.save_pretrained(tmp_path / "fused"))
    assert torch.equal(fused_output(loaded, inputs), fused)
    conv = {n for n, _ in ensemble.named_parameters() if "conv" in n}
    assert conv == {f"layers.0.conv_{name}" for name in ("weight", "bias", "norm_weight", "norm_bias")}
    assert {ensemble.locate(n) for n in conv} == {("layer", 0)}
    assert ensemble.no_weight_decay() & conv == conv - {"layers.0.conv_weight"}
    adapter = he.get_adapter(model)
    assert {adapter.locate(model, n) for n, _ in model.named_parameters() if ".conv." in n} == {("layer", 0)}


def test_the_conv_candidates_of_the_fast_circuit_search_equal_the_reference():
    """The fast search scores each candidate of layer 0 from one input through the convolution: its outputs equal
    the HF model's with that head ablated, for every head, before and after a removal; and it removes the heads
    the reference search removes."""
    from hydra_ensembles.importance.circuit.criteria import CRITERIA
    from hydra_ensembles.importance.circuit.scoring import FastScorer, ReferenceScorer

    model = _conv_classifier()
    id_batches = [make_inputs(CONV_INPUTS, seed=s) | {"labels": torch.tensor([0, 1, 2, 1])} for s in (1, 2)]
    ood_batches = [make_inputs(CONV_INPUTS, seed=s) for s in (3, 4)]
    heads = [(layer, h) for layer in range(3) for h in range(HEADS)]
    scorers = [cls(model, id_batches, ood_batches, CRITERIA["avg"]) for cls in (FastScorer, ReferenceScorer)]
    for removed in ([], [(1, 2)]):
        candidates = [head for head in heads if head not in removed]
        fast, reference = (scorer.outputs(removed, candidates, lambda _: None) for scorer in scorers)
        assert max((fast[h] - reference[h]).abs().max().item() for h in candidates) <= CONTRACT
    circuit = he.extract_circuit(model, id_batches, ood_batches, "avg", budget=3, method="reference", progress=False)
    fast = he.extract_circuit(model, id_batches, ood_batches, "avg", budget=3, method="fast", progress=False)
    assert circuit.removed != index_order(model)[:3]  # the heads decided it: a blind scorer would not agree
    assert fast.removed == circuit.removed


def test_fused_flops_are_the_members_flops_the_conv_and_position_projections_included():
    """Over every token a fused DeBERTa ensemble computes what its members compute: the distance table projected
    only through the blocks its scores read, the c2p/p2c products, the convolution per member (members without
    an emptied layer, where an HF member computes a zero placeholder head). The convolution costs 2*B*T*d*(d/g)*k
    FLOPs, counted in the HF model."""
    model, inputs = _conv_classifier(), make_inputs(CONV_INPUTS, batch=2)
    every_token = {**inputs, "output_hidden_states": True}
    for name, source in (("conv", model), ("shared q/k", MODELS["deberta"]())):
        members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(source, PADDED))]  # no emptied layer
        ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
        assert he.count_flops(ensemble, every_token) == sum(he.count_flops(m, inputs) for m in members), name
    (batch, tokens), d, kernel = inputs["input_ids"].shape, 32, 3
    with_conv, encoder = he.count_flops(model, inputs), model.deberta.encoder
    encoder.conv = None
    assert with_conv - he.count_flops(model, inputs) == 2 * batch * tokens * d * d * kernel


def test_the_conv_exports_to_onnx_runtime(tmp_path):
    """The fused convolution (one grouped Conv1d over the members' channels) in an ONNX graph: ONNX Runtime gives
    PyTorch's member logits at a batch size and length other than the example's (bound: test_export.py)."""
    ort = pytest.importorskip("onnxruntime", reason="pip install '.[export]'")
    members = he.build_members(_conv_classifier(layers=2), [{0: [0, 1], 1: [2]}, {0: [3], 1: [0, 1]}])
    ensemble = he.HydraEnsemble.fuse([perturb(m, scale=0.05, seed=i) for i, m in enumerate(members)], mlp="stack")
    path = ensemble.export_onnx(tmp_path / "conv.onnx", make_inputs(CONV_INPUTS))
    inputs = {k: v[:, :7] for k, v in make_inputs(CONV_INPUTS, batch=5, seed=3).items()}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {k: v.numpy() for k, v in inputs.items()})[0])
    with torch.no_grad():
        assert (got - ensemble(**inputs).member_logits).abs().max() <= CONTRACT
