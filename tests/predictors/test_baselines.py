"""The baselines share HydraEnsemble's interface: model(**inputs).member_logits is (B, M, C)."""

import copy

import pytest
import torch
from conftest import LAYERS, MODELS, fused_output, make_inputs, output

import hydra_ensembles as he
from hydra_ensembles import predictors as B
from hydra_ensembles.training import TEXT_RECIPE


def _train(name="bert", batches=3):
    return [make_inputs(name, seed=30 + i) | {"labels": torch.tensor([0, 1, 2, 1])} for i in range(batches)]


def test_deep_ensemble_stacks_its_models():
    models = [MODELS["bert"](seed=s) for s in range(3)]
    inputs = make_inputs("bert")
    expected = torch.stack([output(m, inputs) for m in models], 1)
    with torch.no_grad():
        assert torch.equal(B.DeepEnsemble(models)(**inputs).member_logits, expected)


def test_a_deep_ensemble_refuses_members_that_predict_different_classes():
    """Members naming their classes in another order were averaged class by class, under member 0's names."""
    model = MODELS["bert"]()
    model.config.id2label = {0: "neg", 1: "pos"}
    swapped = copy.deepcopy(model)
    swapped.config.id2label = {0: "pos", 1: "neg"}
    with pytest.raises(
        ValueError, match=r"predict different classes \(id2label: member 0 .* member 1 \['pos', 'neg'\]"
    ):
        B.DeepEnsemble([model, swapped])
    wider = copy.deepcopy(model)
    wider.config.num_labels = 3
    with pytest.raises(ValueError, match=r"num_labels = \[2, 3\]"):
        B.DeepEnsemble([model, wider])
    assert B.DeepEnsemble([model, copy.deepcopy(model)]).num_members == 2
    # the same classes, keys as strings from a hand-set json map ('10' sorts before '2'), and HF's placeholder names
    # (LABEL_i: a member given only num_labels names none): accepted
    from hydra_ensembles.adapters import class_mismatch

    twelve = [copy.deepcopy(model) for _ in range(3)]
    names = [f"c{i}" for i in range(12)]
    twelve[0].config.id2label = dict(enumerate(names))
    twelve[1].config.id2label = {str(i): name for i, name in enumerate(names)}
    twelve[2].config.id2label = {i: f"LABEL_{i}" for i in range(12)}
    assert class_mismatch(twelve) is None


def test_mc_dropout_samples_differ_are_reproducible_and_leave_eval_mode():
    model, inputs = MODELS["bert"](), make_inputs("bert")
    with torch.no_grad():
        first = B.MCDropout(model, samples=4, seed=1)(**inputs).member_logits
        again = B.MCDropout(model, samples=4, seed=1)(**inputs).member_logits
    assert first.shape == (4, 4, 3) and torch.equal(first, again)
    assert not torch.allclose(first[:, 0], first[:, 1]) and not model.training
    model.dropout.p = 0.0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    with pytest.raises(ValueError, match="no dropout"):
        B.MCDropout(model)


def test_shared_backbone_ensemble_runs_the_backbone_once():
    model, inputs = MODELS["bert"](), make_inputs("bert")
    before = copy.deepcopy(model)
    ensemble = B.shared_backbone_ensemble(model, _train(), seeds=(0, 1, 2), epochs=3, progress=False)
    assert ensemble.num_members == 3 and ensemble.trunk == LAYERS  # every layer shared: one backbone pass
    logits = fused_output(ensemble, inputs)
    assert not torch.allclose(logits[:, 0], logits[:, 1])  # the heads differ
    assert he.count_parameters(ensemble) < 1.2 * he.count_parameters(model)
    for fused, block in zip(ensemble.layers, before.bert.encoder.layer, strict=True):  # only the heads were trained
        attention = block.attention.self
        qkv = torch.cat([attention.query.weight, attention.key.weight, attention.value.weight]).T
        assert torch.equal(fused.qkv_weight[0], qkv) and torch.equal(
            fused.o_weight[0], block.attention.output.dense.weight.T
        )
        assert torch.equal(fused.mlp_in_weight[0], block.intermediate.dense.weight.T)
        assert torch.equal(fused.mlp_out_weight[0], block.output.dense.weight.T)


def test_lora_ensemble_trains_adapters_and_leaves_the_model():
    model = MODELS["bert"]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ensemble = B.lora_ensemble(
        model, _train(), TEXT_RECIPE.with_(epochs=1, lr=1e-2, patience=None), seeds=(0, 1), progress=False
    )
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    logits = fused_output(ensemble, make_inputs("bert"))
    assert logits.shape == (4, 2, 3) and not torch.allclose(logits[:, 0], logits[:, 1])
    assert he.count_parameters(model) < ensemble.stored_parameters < 1.2 * he.count_parameters(model)
    assert type(ensemble.models[0]) is type(model)  # merged back into plain HF models


def test_lora_and_shared_backbone_members_come_from_their_seeds_not_the_callers_generator():
    """LoRA's A matrices (peft draws them from the global generator) and the shared-backbone heads' dropout masks
    are seeded from each member's seed: the same seeds build the same ensemble whatever the caller drew before."""
    recipe = TEXT_RECIPE.with_(epochs=1, lr=1e-2, patience=None)
    builds = {
        "lora": lambda model, data: B.lora_ensemble(model, data, recipe, seeds=(0, 1), progress=False),
        "shared": lambda model, data: B.shared_backbone_ensemble(model, data, seeds=(0, 1), epochs=2, progress=False),
    }
    for name, build in builds.items():
        outputs = []
        for caller_seed in (1, 2):
            model, data, inputs = MODELS["bert"](), _train(), make_inputs("bert")  # these seed the generator too
            torch.manual_seed(caller_seed)
            outputs.append(fused_output(build(model, data), inputs))
        assert torch.equal(outputs[0], outputs[1]), name


def test_temperature_scaling_recovers_a_known_temperature():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4000, 5, generator=g) * 3
    labels = torch.multinomial((logits / 2.5).softmax(-1), 1, generator=g)[:, 0]  # truth: T = 2.5
    temperature = B.fit_temperature(logits[:, None], labels)
    assert temperature == pytest.approx(2.5, rel=0.1)
    with pytest.warns(UserWarning, match="no minimum"):  # all right: T -> 0 without limit
        sharp = B.fit_temperature(logits[:100, None], logits[:100].argmax(-1))
    assert sharp < 0.5
    scaled = B.Calibrated(MODELS["bert"](), B.TemperatureScaling(2.0))
    inputs = make_inputs("bert")
    assert torch.allclose(fused_output(scaled, inputs)[:, 0], output(scaled.model, inputs) / 2.0)


def test_every_predictor_saves_and_loads_back_equal(tmp_path):
    inputs = make_inputs("bert")
    model = MODELS["bert"]()
    pruned = he.build_members(model, [{0: [0, 1], 1: [2], 2: [0, 3]}])[0]
    dropout = copy.deepcopy(model)
    for module in dropout.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.1
    kinds = {
        "hf": model,
        "pruned": pruned,
        "hydra": he.HydraEnsemble.fuse(he.build_members(model, he.sample_members(torch.rand(3, 4), seed=1))),
        "deep": B.DeepEnsemble([model, pruned], stored_parameters=123),
        "temperature": B.Calibrated(B.DeepEnsemble([model, pruned]), B.TemperatureScaling(1.7)),
        "mc_dropout": B.MCDropout(dropout, samples=3, seed=5),
    }
    for name, predictor in kinds.items():
        B.save_predictor(predictor, tmp_path / name)
        loaded = B.load_predictor(tmp_path / name)
        assert type(loaded) is type(predictor), name
        expected, got = he.collect_member_logits(predictor, [inputs]), he.collect_member_logits(loaded, [inputs])
        if name == "mc_dropout":  # the masks follow the seed and a call counter: a fresh copy starts again
            expected = he.collect_member_logits(B.MCDropout(dropout, samples=3, seed=5), [inputs])
        assert torch.equal(got, expected), name  # the same weights and operations: bit-identical
    assert B.load_predictor(tmp_path / "deep").stored_parameters == 123
    with pytest.raises(FileNotFoundError, match="holds no saved predictor"):
        B.load_predictor(tmp_path)


def test_seeded_draws_leave_the_callers_random_state_as_it_was():
    """MC dropout, Packed and MIMO seed their draws inside `seeding.seeded`; torch.manual_seed also seeds every
    CUDA device, which `fork_rng(devices=[])` did not put back (the CUDA half is not testable on this CPU)."""
    from hydra_ensembles.seeding import seeded

    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    with seeded(5):
        inside = torch.rand(2)
    assert torch.equal(torch.rand(3), expected)
    with seeded(5):
        assert torch.equal(torch.rand(2), inside)
    forked = []  # a CPU model forks the CPU generator alone: no CUDA device is started or reseeded
    real = torch.random.fork_rng
    torch.random.fork_rng = lambda devices: forked.append(list(devices)) or real(devices=devices)
    try:
        with seeded(5, "cpu"):
            pass
    finally:
        torch.random.fork_rng = real
    assert forked == [[]]
