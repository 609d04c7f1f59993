"""Members from scores (per-layer budgets), from a circuit (global budget) and from several circuits."""

import pytest
import torch
from conftest import HEADS, LAYERS, MODELS

import hydra_ensembles as he

SCORES = torch.tensor([[0.4, 0.1, 0.3, 0.2], [0.1, 0.2, 0.3, 0.4], [0.9, 0.8, 0.7, 0.6]])


def _circuit(removed=((0, 1), (2, 3), (1, 0), (0, 3), (2, 2), (1, 1))):
    kept = {layer: list(range(HEADS)) for layer in range(LAYERS)}
    return he.Circuit("avg", list(removed), [0.5] * len(removed), 0.5, kept, HEADS)


def test_pool_equal_to_budget_prunes_the_least_useful_heads():
    maps = he.sample_members(SCORES, num_members=2, budget=[2, 1, 3], pool=[2, 1, 3], allow_identical=True)
    assert maps[0] == maps[1] == {0: [0, 2], 1: [1, 2, 3], 2: [0]}


def test_identical_members_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="only 1 distinct member.*pool larger than the budget.*allow_identical"):
        he.sample_members(SCORES, num_members=2, budget=[2, 1, 3], pool=[2, 1, 3])
    with pytest.raises(ValueError, match="only 1 distinct member"):
        he.sample_members(_circuit(), num_members=3, budget=3, pool=3)
    two_heads = torch.rand(3, 2, generator=torch.Generator().manual_seed(0))  # bert-tiny: 2 heads a layer
    with pytest.raises(ValueError, match="every budget is 0 .* give a budget of at least 1"):  # not "a larger pool"
        he.sample_members(two_heads, num_members=2)
    with pytest.raises(ValueError, match="only 2 distinct member"):  # 2 choose 1 in one layer: 2 maps for 3 members
        he.sample_members(SCORES[:1], num_members=3, budget=1, pool=2)
    with pytest.raises(ValueError, match="members 0 and 1 keep the same heads"):
        he.sample_members([_circuit(), _circuit()], budget=2)
    with pytest.raises(ValueError, match="members 0 and 2 keep the same heads"):
        he.build_members(
            MODELS["bert"](), [{0: [0], 1: [1], 2: [2]}, {0: [1], 1: [1], 2: [2]}, {0: [0], 1: [1], 2: [2]}]
        )
    with pytest.raises(ValueError, match="members 0 and 1 keep the same heads"):  # a layer left out keeps all
        he.build_members(MODELS["bert"](), [{0: [0, 1, 2, 3], 1: [1], 2: [2]}, {1: [1], 2: [2]}])
    with pytest.raises(ValueError, match="num_members is 3 but 2 circuits were given"):
        he.sample_members([_circuit(), _circuit(((1, 1), (0, 0)))], num_members=3, budget=2)


def test_circuits_ranking_fewer_heads_than_the_default_budget_are_refused_not_cut_short():
    """The default prunes a third of the heads (4 of 12); circuits that ranked 3 would silently give members
    pruning 3: refused with the fix, as members from one circuit are. Ranked 4: the default fits."""
    short = [_circuit(((0, 1), (2, 3), (1, 0))), _circuit(((1, 1), (0, 0), (2, 2)))]
    with pytest.raises(ValueError, match="default budget \\(a third of the 12 heads: 4\\) is more than the 3 heads"):
        he.sample_members(short)
    explicit = he.sample_members(short, budget=3)  # within the ranking
    assert [sum(HEADS - len(heads) for heads in m.values()) for m in explicit] == [3, 3]
    four = [_circuit(((0, 1), (2, 3), (1, 0), (0, 3))), _circuit(((1, 1), (0, 0), (2, 2), (0, 3)))]
    maps = he.sample_members(four)
    assert all(sum(HEADS - len(heads) for heads in m.values()) == 4 for m in maps)


def test_a_draw_that_repeats_a_member_is_drawn_again():
    for seed in range(20):  # 2 distinct maps exist; with redraws every pair of members differs
        first, second = he.sample_members(SCORES[:1], num_members=2, budget=1, pool=2, seed=seed)
        assert first != second


def test_defaults_prune_a_third_from_a_pool_of_twice_as_many_least_useful_heads():
    maps = he.sample_members(SCORES, seed=0)  # 4 heads per layer: budget 4 // 3 = 1, pool 2
    assert len(maps) == 3 and len({str(m) for m in maps}) == 3
    least_useful_two = [{1, 3}, {0, 1}, {2, 3}]
    for head_map in maps:
        for layer, heads in head_map.items():
            pruned = set(range(HEADS)) - set(heads)
            assert len(pruned) == 1 and pruned <= least_useful_two[layer]
    circuit = _circuit()  # 12 heads, 6 ranked: budget 12 // 3 = 4, pool min(8, 6) = 6
    maps = he.sample_members(circuit, seed=0)
    assert len({str(m) for m in maps}) == 3
    for head_map in maps:
        pruned = {(layer, h) for layer in range(LAYERS) for h in range(HEADS) if h not in head_map[layer]}
        assert len(pruned) == 4 and pruned <= set(circuit.removed)


def test_a_circuit_too_short_for_the_default_budget_says_how_to_extract_it():
    with pytest.raises(ValueError, match="extract the circuit with a budget of at least 5"):
        he.sample_members(_circuit(((0, 1), (2, 3), (1, 0))))


def test_members_differ_by_seed_and_are_reproducible():
    maps = he.sample_members(SCORES, num_members=3, budget=1, pool=4, seed=0)
    assert all(len(heads) == HEADS - 1 for m in maps for heads in m.values())
    assert len({str(m) for m in maps}) > 1
    assert maps == he.sample_members(SCORES, num_members=3, budget=1, pool=4, seed=0)
    assert maps != he.sample_members(SCORES, num_members=3, budget=1, pool=4, seed=1)


def test_sampled_heads_come_from_the_pool_of_least_useful():
    for seed in range(20):
        (head_map,) = he.sample_members(SCORES, num_members=1, budget=1, pool=2, seed=seed)
        assert set(range(HEADS)) - set(head_map[0]) <= {1, 3}  # the two lowest scores of layer 0
        assert set(range(HEADS)) - set(head_map[2]) <= {2, 3}


def test_already_pruned_heads_stay_pruned():
    scores = SCORES.clone()
    scores[0, 0] = float("nan")
    (head_map,) = he.sample_members(scores, num_members=1, budget=1, pool=1)
    assert head_map[0] == [2, 3]


def test_circuit_members_sample_the_global_budget_from_the_ranking():
    circuit = _circuit()
    maps = he.sample_members(circuit, num_members=3, budget=2, pool=4, seed=0)
    for head_map in maps:
        pruned = {(layer, h) for layer in range(LAYERS) for h in range(HEADS) if h not in head_map[layer]}
        assert len(pruned) == 2 and pruned <= set(circuit.removed[:4])
    (exact,) = he.sample_members(circuit, num_members=1, budget=3, pool=3)
    assert exact == circuit.head_map(3)


def test_one_member_per_circuit():
    circuits = [_circuit(), _circuit(((1, 1), (0, 0))), _circuit(((2, 0), (2, 1)))]
    maps = he.sample_members(circuits, budget=2)
    assert maps == [c.head_map(2) for c in circuits]


def test_build_members_prunes_copies():
    model = MODELS["bert"]()
    maps = he.sample_members(SCORES, num_members=2, budget=1, pool=3)
    members = he.build_members(model, maps)
    assert [he.kept_heads(m) for m in members] == maps
    assert he.kept_heads(model) == {layer: list(range(HEADS)) for layer in range(LAYERS)}


@pytest.mark.parametrize(
    "source, kwargs, message",
    [
        (SCORES, dict(budget=HEADS), "budget 4 for layer 0 is not below its 4 heads"),
        (SCORES, dict(budget=2, pool=5), "pool for layer 0 must be between"),
        (SCORES, dict(budget=[1, 1]), "one per layer"),
        (SCORES, dict(budget=1, num_members=0), "num_members must be a positive int"),
        (SCORES[0], dict(budget=1), "must be a \\(layers, heads\\) tensor"),
        (torch.full((LAYERS, HEADS), float("nan")), dict(budget=1), "every score is NaN .* the scoring diverged"),
        (_circuit(), dict(budget=7), "budget must be an int between 0 and 6"),
        (_circuit(), dict(budget=4, pool=8), "pool must be between the budget 4 and the 6 heads"),
        ([_circuit()], dict(budget=1, pool=3), "pool does not apply"),
        ([], dict(budget=1), "must be a"),
    ],
)
def test_bad_arguments(source, kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        he.sample_members(source, **kwargs)


def test_head_maps_that_do_not_fit_the_model_are_rejected():
    with pytest.raises(ValueError, match="out of range"):
        he.build_members(MODELS["bert"](), [{0: [0, 1], 5: [1]}])
    with pytest.raises(ValueError, match="keeps heads the model no longer has"):
        he.build_members(he.prune_heads(MODELS["bert"](), {0: [1]}), [{0: [1, 2]}])


LONG_RANKING = ((0, 1), (2, 3), (1, 0), (0, 3), (2, 2), (1, 1), (2, 0), (1, 3), (0, 0), (2, 1))


@pytest.mark.parametrize("trunk", [1, 2])
def test_a_trunk_keeps_circavgs_heads_in_the_first_layers_and_draws_the_rest_from_the_pool(trunk):
    circuit, budget, pool = _circuit(LONG_RANKING), 4, 8
    circavg = circuit.head_map(budget)  # one model pruned by the circuit's first 4 heads
    later_pool = {head for head in circuit.removed[:pool] if head[0] >= trunk}
    for seed in range(10):
        maps = he.sample_members(circuit, num_members=3, budget=budget, pool=pool, seed=seed, trunk=trunk)
        assert len({str(m) for m in maps}) == 3
        for head_map in maps:
            assert all(head_map[layer] == circavg[layer] for layer in range(trunk))
            pruned = {(layer, h) for layer in range(LAYERS) for h in range(HEADS) if h not in head_map[layer]}
            assert len(pruned) == budget  # as many heads as a member without a trunk
            assert {head for head in pruned if head[0] >= trunk} <= later_pool
    # fused, the trunk runs once; the members stay exact
    members = he.build_members(MODELS["bert"](), maps)
    assert he.HydraEnsemble.fuse(members).trunk == trunk


def test_a_trunk_is_refused_where_it_cannot_apply():
    with pytest.raises(ValueError, match=f"between 1 and {LAYERS - 1}.*got {LAYERS}"):
        he.sample_members(_circuit(LONG_RANKING), budget=4, trunk=LAYERS)
    with pytest.raises(ValueError, match="trunk applies to members drawn from one Circuit.*got Tensor"):
        he.sample_members(SCORES, trunk=1)
    with pytest.raises(
        ValueError,
        match="a trunk of 2 layers.*2 of the budget's 3 heads lie in the trunk.*first 3 heads hold 1 in layers 2"
        ".*share fewer layers",
    ):
        he.sample_members(_circuit(LONG_RANKING), budget=3, pool=3, trunk=2)


def test_members_of_a_joint_circuit_default_to_a_tenth_of_the_towers_it_ranked():
    """extract_joint_circuit ranks a fifth of its candidate heads by default (the paper's pool of 2 x 10 %, §D.3):
    members then prune a tenth, counted over the towers ranked (the image tower's 40 heads here, not the text
    tower's 20 too), so that the defaults work together."""
    from hydra_ensembles.importance import JointCircuit

    kept = {"image": {layer: list(range(10)) for layer in range(4)}, "text": {0: list(range(20))}}
    removed = [("image", layer, head) for head in range(2) for layer in range(4)]  # 8 = a fifth of 40
    circuit = JointCircuit("avg", removed, [0.5] * 8, 0.5, kept)
    members = he.sample_members(circuit, seed=0)  # budget 4 of the 8 ranked; pool 8
    for member in members:
        assert sum(10 - len(heads) for heads in member["image"].values()) == 4 and member["text"] == kept["text"]
