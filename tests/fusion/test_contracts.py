"""The fusion contracts of DESIGN.md (fp32, max abs difference <= 1e-5) on every supported family.

Each test also asserts that the defects the contract guards against (one head wrongly kept or dropped, one member
given another member's MLP) would move the output by at least DEFECT = 100x the bound, so that passing means
something: the models are built at a trained model's scale (conftest.at_trained_scale).
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    FUSED_MODELS,
    MODELS,
    MORE_CLASSES,
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


@pytest.mark.parametrize("name", FUSED_MODELS)
def test_contract1_one_unpruned_member_equals_the_original(name):
    model, inputs = at_trained_scale(name), make_inputs(name)
    ensemble = he.HydraEnsemble.fuse([model])
    got = fused_output(ensemble, inputs)
    assert got.shape[1] == 1
    assert (got[:, 0] - output(model, inputs)).abs().max().item() <= TOL
    assert smallest_head_effect(model, inputs) >= DEFECT  # a head lost in fusion would show


@pytest.mark.parametrize("num_members", [1, 2, 3, 5])
@pytest.mark.parametrize("name", [*FUSED_MODELS, *MORE_CLASSES])
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
@pytest.mark.parametrize("name", FUSED_MODELS)
def test_contract4_average_is_exact_for_members_sharing_their_mlps(name, num_members):
    """Zero-shot members differ only in their heads (and their classifiers): averaging changes nothing."""
    model, inputs = at_trained_scale(name), make_inputs(name)
    members = he.build_members(model, random_head_maps(num_members, seed=5))
    # MPNet's relative position bias and DeBERTa's distance-table norm are shared by all layers, so not the
    # classifier's: a shift would hide
    shared = ("layer", "embeddings", "pre_layrnorm", "relative_attention_bias", "encoder.LayerNorm")
    for i, member in enumerate(members[1:], start=1):  # own classifiers, shared everything else
        head = [p for n, p in member.named_parameters() if not any(k in n for k in shared)]
        with torch.no_grad():
            for p in head:
                p.add_(0.05 * i)
    ensemble = he.HydraEnsemble.fuse(members, mlp="average")
    expected = torch.stack([output(m, inputs) for m in members], dim=1)
    assert (fused_output(ensemble, inputs) - expected).abs().max().item() <= TOL
    assert smallest_head_effect(members[-1], inputs) >= DEFECT


# Heads per layer as circuit members keep them (ragged): in layer 0 one member keeps a single head, one all four
# and one two; layer 1 has equal counts (the padded layout, padding nothing); in the last layer (which computes
# only the rows the head reads) one member keeps no head and one keeps all.
RAGGED_MAPS = [
    {0: [2], 1: [1, 2], 2: []},
    {0: [0, 1, 2, 3], 1: [0, 3], 2: [0, 2]},
    {0: [1, 3], 1: [0, 1], 2: [0, 1, 2, 3]},
]


@pytest.mark.parametrize(("mlp", "layout"), [("average", "auto"), ("stack", "auto"), ("stack", "padded")])
@pytest.mark.parametrize("name", FUSED_MODELS)
def test_ragged_layers_equal_members_run_one_by_one(name, mlp, layout):
    """Members keeping different numbers of heads in a layer run without padded heads, exactly: separately tuned
    members (stack; MPNet then holds one relative position bias per member) and zero-shot ones (average); and
    padded to the widest member, as on a GPU (each family's position scores, rotary tables, layer scale)."""
    model, inputs = at_trained_scale(name), make_inputs(name)
    members = he.build_members(model, RAGGED_MAPS)
    if mlp == "stack":
        members = [perturb(m, seed=i) for i, m in enumerate(members)]
    ensemble = he.HydraEnsemble.fuse(members, mlp=mlp).set_layout(layout)
    assert [layer.ragged for layer in ensemble.layers] == ([True, False, True] if layout == "auto" else [False] * 3)
    expected = torch.stack([output(m, inputs) for m in members], dim=1)  # (B, M, C)
    assert (fused_output(ensemble, inputs) - expected).abs().max().item() <= TOL
    assert min(smallest_head_effect(m, inputs) for m in members[1:]) >= DEFECT  # a head misplaced would show


@pytest.mark.parametrize("name", ["bert", "mpnet", "distilbert", "vit", "dinov2"])
def test_ragged_gradients_equal_the_members_gradients(name):
    """Fine-tuning and distilling a fused ensemble trains each member as if alone: the gradient of the members'
    summed losses, taken through the ragged layers and mapped back to each member (`unfuse`), is each member's."""
    model, inputs = at_trained_scale(name), make_inputs(name)
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(model, RAGGED_MAPS))]
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")  # every tensor per member: nothing summed over members
    adapter = he.get_adapter(model)
    logits = ensemble(**inputs).member_logits  # (B, M, C)
    labels = torch.arange(logits.shape[0]) % logits.shape[-1]
    sum(F.cross_entropy(logits[:, m], labels) for m in range(len(members))).backward()
    for member in members:
        F.cross_entropy(adapter.output(member, inputs), labels).backward()
    as_weights = copy.deepcopy(ensemble)  # the fused gradients in place of the weights, to unfuse them
    with torch.no_grad():
        for (_, p), (_, g) in zip(as_weights.named_parameters(), ensemble.named_parameters(), strict=True):
            p.copy_(g.grad if g.grad is not None else torch.zeros_like(p))
    for member, fused_grads in zip(members, as_weights.unfuse(members), strict=True):
        compared = 0
        for (key, p), (_, fused) in zip(member.named_parameters(), fused_grads.named_parameters(), strict=True):
            if p.grad is not None:
                torch.testing.assert_close(fused, p.grad, atol=1e-5, rtol=1e-4, msg=key)
                compared += p.grad.abs().max().item() > 0
        assert compared > 10


@pytest.mark.parametrize("layout", ["auto", "padded"])
def test_a_bias_the_members_lack_is_not_trained_in_the_fused_ensemble(layout):
    """DINOv3's key projection has no bias; the fused layer stores a zero in its place, which with rotary
    positions would get a gradient and move the scores, and unfusing could not give it back to the members.
    After a training step on the fused ensemble the unfused members still equal it; the zeros count as no
    parameters."""
    model, inputs = at_trained_scale("dinov3_encoder"), make_inputs("dinov3_encoder")
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(model, RAGGED_MAPS))]
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack").set_layout(layout)
    if layout == "auto":  # no padded heads: every stored number not counted is a key bias no member has
        zeros = sum(sum(layer.head_counts) * layer.head_dim for layer in ensemble.layers)
        assert sum(p.numel() for p in ensemble.parameters()) - he.count_parameters(ensemble) == zeros > 0
    before = fused_output(ensemble, inputs)
    ensemble(**inputs).member_pooled.pow(2).sum().backward()
    with torch.no_grad():
        for p in ensemble.parameters():
            p -= 0.1 * p.grad if p.grad is not None else 0
    trained = ensemble.unfuse(members)
    expected = torch.stack([output(m, inputs) for m in trained], dim=1)  # (B, M, D)
    assert (fused_output(ensemble, inputs) - expected).abs().max().item() <= TOL
    assert (fused_output(ensemble, inputs) - before).abs().max().item() > DEFECT  # the step trained it


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
