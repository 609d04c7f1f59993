"""BatchEnsemble (Wen et al., 2020): each member is the checkpoint with every wrapped weight W ∘ (s_m r_m^T), all
members in one forward pass over the batch repeated M times; with r = s = 1 every member is the checkpoint."""

import copy

import pytest
import torch
import transformers as T
from conftest import CONTRACT_MODELS, MODELS, at_trained_scale, killed_at_step, make_inputs, output
from tolerances import CONTRACT

import hydra_ensembles as he
from hydra_ensembles import training as ft
from hydra_ensembles.adapters import UnsupportedModelError
from hydra_ensembles.predictors import describe_saved, load_predictor, save_predictor, saved_kind
from hydra_ensembles.predictors.baselines import BatchEnsemble, batch_ensemble
from hydra_ensembles.predictors.baselines.batch_ensemble import BatchEnsembleLinear

# DeBERTa-v3 (share_att_key) also runs its wrapped query/key projections on the position table, one copy for all
# members: BatchEnsemble does not support it (the variants with their own position projections work).
CLASSIFIERS = [
    name
    for name in CONTRACT_MODELS
    if he.get_adapter(model := MODELS[name]()).is_classifier(model) and name != "deberta"
]


def _logits(ensemble, inputs):
    with torch.no_grad():
        return ensemble(**inputs).member_logits


def _with_member_weights(checkpoint, ensemble, member):
    """A plain copy of the checkpoint whose wrapped linears hold W ∘ (s_m r_m^T) and b_m: the definition, written
    here apart from the module's own `member`."""
    model = copy.deepcopy(checkpoint)
    with torch.no_grad():
        for path, layer in ensemble.layers():
            plain = model.get_submodule(path)
            plain.weight.copy_(layer.weight * (layer.s[member][:, None] * layer.r[member][None, :]))
            if plain.bias is not None:
                plain.bias.copy_(layer.bias[member])
    return model


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_with_unit_fast_weights_every_member_is_the_checkpoint(name):
    checkpoint, inputs = at_trained_scale(name), make_inputs(name)
    ensemble = batch_ensemble(checkpoint, members=3, init="ones")
    logits = _logits(ensemble, inputs)
    expected = output(checkpoint, inputs)
    assert logits.shape == (4, 3, expected.shape[-1])
    torch.testing.assert_close(logits, expected[:, None].expand_as(logits), atol=CONTRACT, rtol=0)


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_each_member_is_the_checkpoint_with_its_rank_one_weights(name):
    checkpoint, inputs = at_trained_scale(name), make_inputs(name)
    ensemble = batch_ensemble(checkpoint, members=3, init="normal", seed=1)
    with torch.no_grad():  # the members' own biases too, as training makes them
        for _, layer in ensemble.layers():
            if layer.bias is not None:  # ModernBERT's linears have none
                layer.bias.add_(0.1 * torch.randn_like(layer.bias))
    logits = _logits(ensemble, inputs)
    for member in range(3):
        expected = output(_with_member_weights(checkpoint, ensemble, member), inputs)
        torch.testing.assert_close(logits[:, member], expected, atol=CONTRACT, rtol=0)
        torch.testing.assert_close(output(ensemble.member(member), inputs), expected, atol=CONTRACT, rtol=0)
    assert (logits[:, 0] - logits[:, 1]).abs().max() > 1e-2  # the draws make the members differ
    assert (logits[:, 0] - output(checkpoint, inputs)).abs().max() > 1e-2


def test_it_wraps_every_attention_and_mlp_linear_and_the_head_and_leaves_the_checkpoint():
    checkpoint = MODELS["bert"]()
    before = {k: v.clone() for k, v in checkpoint.state_dict().items()}
    ensemble = batch_ensemble(checkpoint, members=2)
    per_layer = ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"]
    per_layer += ["intermediate.dense", "output.dense"]
    expected = [f"bert.encoder.layer.{i}.{name}" for i in range(3) for name in per_layer]
    assert ensemble.linears == [*expected, "bert.pooler.dense", "classifier"]
    assert all(torch.equal(before[k], v) for k, v in checkpoint.state_dict().items())
    assert not any(type(m) is torch.nn.Linear for m in ensemble.model.modules())  # no linear left plain


def test_it_costs_one_model_of_parameters_plus_the_fast_weights_and_m_forward_passes():
    checkpoint, inputs, members = MODELS["vit"](), make_inputs("vit"), 3
    ensemble = batch_ensemble(checkpoint, members=members)
    linears = [checkpoint.get_submodule(path) for path in ensemble.linears]
    fast = sum(members * (x.in_features + 2 * x.out_features) - x.out_features for x in linears)  # shared b: b_m
    assert he.count_parameters(ensemble) == he.count_parameters(checkpoint) + fast
    assert he.count_flops(ensemble, inputs) == members * he.count_flops(checkpoint, inputs)


def test_it_saves_and_loads_back_equal_on_a_pruned_checkpoint(tmp_path):
    inputs, checkpoint = make_inputs("dinov2"), at_trained_scale("dinov2")
    he.prune_heads(checkpoint, {0: [1, 3], 2: [0]})  # a structure the saved model must replay
    he.prune_neurons(checkpoint, {1: list(range(10))})
    ensemble = batch_ensemble(checkpoint, members=3, init="sign", seed=2).eval()
    with torch.no_grad():
        for _, layer in ensemble.layers():
            layer.bias.add_(torch.randn_like(layer.bias))
    save_predictor(ensemble, tmp_path / "be")
    loaded = load_predictor(tmp_path / "be")
    assert isinstance(loaded, BatchEnsemble) and saved_kind(tmp_path / "be") == "batch_ensemble"
    assert describe_saved(tmp_path / "be") == "a BatchEnsemble of 3 members"
    assert torch.equal(_logits(loaded, inputs), _logits(ensemble, inputs))
    assert all(isinstance(layer, BatchEnsembleLinear) for _, layer in ensemble.layers())  # saving put them back


def test_fine_tuning_trains_the_members_seeded_resumable_with_the_embeddings_frozen(tmp_path):
    data = [make_inputs("bert", seed=5 + i) | {"labels": torch.arange(4) % 3} for i in range(3)]
    config = ft.TEXT_RECIPE.with_(epochs=3, lr=1e-2, patience=None, freeze_embeddings=True)

    def tuned(**kwargs):
        ensemble = batch_ensemble(MODELS["bert"](), members=2, seed=0)
        return ft.finetune_fused(ensemble, data, config, progress=False, **kwargs)

    before = batch_ensemble(MODELS["bert"](), members=2, seed=0).state_dict()
    uninterrupted = tuned().state_dict()
    for key, value in uninterrupted.items():
        frozen = ".embeddings." in key
        assert torch.equal(before[key], value) == frozen, key  # embeddings kept, everything else trained
    with killed_at_step(8):  # 3 steps per epoch: the 2nd step of epoch 3
        tuned(checkpoint_dir=tmp_path)
    resumed = tuned(checkpoint_dir=tmp_path).state_dict()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


def test_clear_errors():
    with pytest.raises(ValueError, match="members >= 2"):
        batch_ensemble(MODELS["bert"](), members=1)
    with pytest.raises(ValueError, match="needs a classifier"):
        batch_ensemble(MODELS["bert_encoder"](), members=2)
    with pytest.raises(ValueError, match="init must be one of"):
        batch_ensemble(MODELS["bert"](), members=2, init="orthogonal")
    gpt2 = T.GPT2ForSequenceClassification(T.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=99, num_labels=2))
    with pytest.raises(UnsupportedModelError, match="no adapter for GPT2ForSequenceClassification"):
        batch_ensemble(gpt2, members=2)
    with pytest.raises(ValueError, match="share_att_key=True .DeBERTa-v3.*share_att_key=False"):
        batch_ensemble(MODELS["deberta"](), members=2)  # a DeBERTa-v3 is refused when built, not at its first call


def test_an_input_shared_by_the_batch_is_not_repeated_per_member():
    """position_ids (1, T) broadcast over the batch: tiled to (M, T) they would not match the M·B rows."""
    checkpoint, inputs = at_trained_scale("bert"), make_inputs("bert")
    ensemble = batch_ensemble(checkpoint, members=3, init="ones")
    positions = {"position_ids": torch.arange(inputs["input_ids"].shape[1])[None]}  # (1, T)
    torch.testing.assert_close(_logits(ensemble, inputs | positions), _logits(ensemble, inputs), atol=CONTRACT, rtol=0)


def test_the_model_inside_run_alone_is_member_0_as_a_deep_ensembles_base():
    ensemble, inputs = batch_ensemble(at_trained_scale("vit"), members=3, seed=3), make_inputs("vit")
    torch.testing.assert_close(output(ensemble.base, inputs), _logits(ensemble, inputs)[:, 0], atol=CONTRACT, rtol=0)
    assert he.count_flops(ensemble.base, inputs) * 3 == he.count_flops(ensemble, inputs)


def test_weight_decay_moves_the_shared_weights_not_the_fast_weights_or_biases():
    """One AdamW step of a zero loss is the weight decay alone: a BatchEnsemble with unit fast weights must move as
    its checkpoint does alone (W shrinks by 1 - lr * wd; biases and r, s, one vector per member, stay)."""
    checkpoint = at_trained_scale("bert")
    ensemble = batch_ensemble(checkpoint, members=2, init="ones")
    batches = [make_inputs("bert", seed=3) | {"labels": torch.arange(4) % 3}]
    recipe = ft.TEXT_RECIPE.with_(epochs=1, lr=1e-2, warmup=0.0, weight_decay=0.5, clip=None, patience=None)
    nothing = lambda output, batch: 0 * getattr(output, "member_logits", output).sum()  # noqa: E731
    ft.train(ensemble, batches, recipe, loss=nothing, progress=False)
    alone = ft.train(copy.deepcopy(checkpoint), batches, recipe, loss=nothing, progress=False)
    for _, layer in ensemble.layers():
        assert torch.equal(layer.r, torch.ones_like(layer.r)) and torch.equal(layer.s, torch.ones_like(layer.s))
    inputs = make_inputs("bert", seed=4)
    expected = output(alone, inputs)
    for member in range(2):
        torch.testing.assert_close(_logits(ensemble, inputs)[:, member], expected, rtol=0, atol=CONTRACT)
