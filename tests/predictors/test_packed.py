"""Packed-Ensembles: M narrow transformers trained from scratch, run as one fused module."""

import copy

import pytest
import torch
from conftest import MODELS, killed_at_step, labelled_batches, make_inputs, output
from tolerances import CONTRACT

import hydra_ensembles as he
from hydra_ensembles.predictors import PackedEnsemble, load_predictor, packed_ensemble, save_predictor, train_packed
from hydra_ensembles.predictors.baselines.packed import packed_config
from hydra_ensembles.training import IMAGE_RECIPE

RECIPE = IMAGE_RECIPE.with_(epochs=2, lr=1e-3, optimizer="adamw", patience=None)


def _narrow_members(model, members: int, alpha: float, seed: int) -> list[torch.nn.Module]:
    """The members as `packed_ensemble` documents them, built here on their own: each a fresh model of the narrow
    config, one after another from `seed`."""
    config = packed_config(model.config, members, alpha)
    torch.manual_seed(seed)
    return [type(model)(copy.deepcopy(config)).eval() for _ in range(members)]


def test_the_narrow_config_rounds_heads_and_mlp_width_half_up():
    config = MODELS["vit"]().config.__class__(hidden_size=128, num_attention_heads=8, intermediate_size=256)
    narrow = packed_config(config, members=3, alpha=2)  # 16/3 = 5.33 heads of 16, 512/3 = 170.67
    assert (narrow.num_attention_heads, narrow.hidden_size, narrow.intermediate_size) == (5, 80, 171)
    assert config.hidden_size == 128  # the model's config is left alone
    with pytest.raises(ValueError, match="0 heads"):
        packed_config(config, members=40, alpha=1)
    with pytest.raises(ValueError, match="intermediate_size"):
        packed_config(MODELS["distilbert"]().config, members=3, alpha=2)


def test_one_member_at_alpha_one_is_the_plain_transformer():
    model, inputs = MODELS["vit"](seed=0), make_inputs("vit")
    packed = packed_ensemble(model, members=1, alpha=1.0, seed=0)
    plain = MODELS["vit"](seed=0)  # the same width, initialised from the same seed: the same weights
    with torch.no_grad():
        got = packed(**inputs).member_logits
    assert got.shape == (4, 1, 5)
    assert (got[:, 0] - output(plain, inputs)).abs().max() <= CONTRACT
    assert he.count_parameters(packed) == he.count_parameters(plain)


def test_three_members_equal_their_narrow_transformers_run_one_by_one():
    model, inputs = MODELS["vit"](), make_inputs("vit")
    packed = packed_ensemble(model, members=3, alpha=2.0, seed=4)
    members = _narrow_members(model, 3, 2.0, seed=4)
    assert members[0].config.hidden_size == 24 and members[0].config.intermediate_size == 25  # 3 heads of 8
    with torch.no_grad():
        got = packed(**inputs).member_logits  # (B, M, C)
    expected = torch.stack([output(m, inputs) for m in members], dim=1)
    assert (got - expected).abs().max() <= CONTRACT
    assert not torch.allclose(got[:, 0], got[:, 1])  # freshly initialised apart
    assert he.count_parameters(packed) == sum(he.count_parameters(m) for m in members)
    # FLOPs: every token through every layer, as the HF models run it, counts exactly M narrow models (the grouped
    # matmuls and the vmapped embeddings included); a plain forward computes only [CLS] in the last layer: fewer
    narrow_flops = sum(he.count_flops(m, inputs) for m in members)
    assert he.count_flops(packed.fused, inputs | {"output_hidden_states": True}) == narrow_flops
    assert he.count_flops(packed, inputs) < narrow_flops


def test_members_do_not_leak_into_each_other():
    """Every tensor is a member's own (a leading member axis, no tensor stored once for all), a member's loss
    reaches its own slices only, and changing one member's weights changes no other member's output."""
    model, inputs = MODELS["vit"](), make_inputs("vit")
    packed = packed_ensemble(model, members=3, alpha=2.0, seed=0)
    parameters = dict(packed.named_parameters())
    assert all(p.shape[0] == 3 for p in parameters.values()), {n: p.shape for n, p in parameters.items()}
    packed.train()
    packed(**inputs).member_logits[:, 0].sum().backward()
    for name, p in parameters.items():
        assert p.grad is None or not p.grad[1:].any(), f"member 0's loss reaches other members' {name}"
    before = packed.eval()(**inputs).member_logits.detach()
    with torch.no_grad():
        for p in parameters.values():
            p[1].add_(0.5)
    after = packed(**inputs).member_logits.detach()
    assert torch.equal(after[:, [0, 2]], before[:, [0, 2]]) and not torch.allclose(after[:, 1], before[:, 1])


def test_training_is_seeded_resumes_after_a_kill_and_stays_its_members(tmp_path):
    model, inputs = MODELS["vit"](), make_inputs("vit")

    def trained(**kwargs):
        return train_packed(packed_ensemble(model, seed=0), labelled_batches(), RECIPE, progress=False, **kwargs)

    runs = [trained(), trained()]
    with killed_at_step(5):  # 3 steps per epoch: the 2nd step of epoch 2
        trained(checkpoint_dir=tmp_path)
    runs.append(trained(checkpoint_dir=tmp_path))
    first = runs[0]
    for a, b, c in zip(*(run.state_dict().values() for run in runs)):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert len(first.training_history) == 2 and first.kept_epoch == 2
    members = first.fused.unfuse(_narrow_members(model, 3, 2.0, seed=0))  # trained: still its members exactly
    with torch.no_grad():
        got = first(**inputs).member_logits
    assert (got - torch.stack([output(m, inputs) for m in members], 1)).abs().max() <= CONTRACT


def test_saves_and_loads_as_its_own_kind(tmp_path):
    model, inputs = MODELS["vit"](), make_inputs("vit")
    packed = packed_ensemble(model, members=3, alpha=2.0, seed=0)
    save_predictor(packed, tmp_path / "packed")
    loaded = load_predictor(tmp_path / "packed")
    assert isinstance(loaded, PackedEnsemble) and loaded.alpha == 2.0 and loaded.num_members == 3
    assert he.predictors.describe_saved(tmp_path / "packed") == "a Packed-Ensemble of 3 members (alpha=2)"
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).member_logits, packed(**inputs).member_logits)
    assert he.count_parameters(loaded) == he.count_parameters(packed)


def test_gamma_above_one_is_refused():
    with pytest.raises(ValueError, match="gamma=1"):
        packed_ensemble(MODELS["vit"](), gamma=2)
