"""Every predictor kind saves and loads itself and is found by the name it declares; the formats on disk stay as
they were written before the kinds named themselves (saved predictors and benchmark caches must still load)."""

import json

import pytest
import torch
from conftest import MODELS, make_inputs, tiny_clip

import hydra_ensembles as he
from hydra_ensembles import predictors as P
from hydra_ensembles.distill import MultiHeadMLP


def _hydra(model, members=3):
    head_maps = he.sample_members(torch.rand(3, 4), num_members=members, seed=1)
    return he.HydraEnsemble.fuse(he.build_members(model, head_maps))


def test_each_kind_is_found_by_its_name_and_says_what_was_saved(tmp_path):
    model = MODELS["bert"]()
    saved = {
        "hf_model": (model, "one model (BertForSequenceClassification)"),
        "hydra_ensemble": (_hydra(model), "a fused ensemble of 3 members"),
        "deep_ensemble": (P.DeepEnsemble([model, model]), "a deep ensemble of 2 models"),
        "batch_ensemble": (P.batch_ensemble(model, members=2), "a BatchEnsemble of 2 members"),
        "packed_ensemble": (P.packed_ensemble(model), "a Packed-Ensemble of 3 members (alpha=2)"),
        "mimo": (P.mimo(MODELS["vit"]()), "a MIMO network of 3 members (rho=0.5)"),
        "calibrated": (
            P.Calibrated(_hydra(model), P.TemperatureScaling(1.5)),
            "a fused ensemble of 3 members, temperature-scaled",
        ),
        "multi_head_mlp": (MultiHeadMLP(2, 3, heads=4), "a multi-head MLP student with 4 heads"),
        "two_tower": (P.TwoTowerModel.from_clip(tiny_clip()), "a two-tower (CLIP-style) model"),
        "feature_scored": (
            P.fit_feature_scores(
                model, [make_inputs("bert", batch=8) | {"labels": torch.arange(8) % 3}], k=3, vim_dim=4
            ),
            "one model (BertForSequenceClassification), with OOD detectors (mds, rmds, knn, vim) fit on 8 inputs",
        ),
    }
    for kind, (predictor, description) in saved.items():
        path = P.save_predictor(predictor, tmp_path / kind)
        assert P.saved_kind(path) == kind and P.describe_saved(path) == description, kind
        assert type(P.load_predictor(path)) is type(predictor), kind
    earlier = {"temperature": P.Calibrated}  # formats written before a kind was renamed, read by the new kind
    assert set(P.PREDICTOR_KINDS) == {*saved, "mc_dropout", "zero_shot", *earlier}
    assert all(cls.kind == kind or earlier.get(kind) is cls for kind, cls in P.PREDICTOR_KINDS.items())


def test_the_saved_formats_are_those_written_before_the_kinds_named_themselves(tmp_path):
    model = MODELS["bert"]()
    calibrated = P.Calibrated(P.DeepEnsemble([model], stored_parameters=7), P.TemperatureScaling(2.0))
    P.save_predictor(calibrated, tmp_path / "t")
    record = json.loads((tmp_path / "t" / "predictor.json").read_text())
    assert record == {"kind": "calibrated", "map": "temperature", "state": {"temperature": 2.0}}
    earlier = tmp_path / "earlier"  # a temperature-scaled predictor saved before there were several maps
    P.save_predictor(P.DeepEnsemble([model], stored_parameters=7), earlier / "model")
    (earlier / "predictor.json").write_text(json.dumps({"kind": "temperature", "temperature": 2.0}))
    loaded = P.load_predictor(earlier)
    assert isinstance(loaded, P.Calibrated) and loaded.calibration_map.state() == {"temperature": 2.0}
    assert P.describe_saved(earlier).endswith("temperature-scaled")
    member = json.loads((tmp_path / "t" / "model" / "predictor.json").read_text())
    assert member == {"kind": "deep_ensemble", "members": 1, "stored_parameters": 7}
    assert (tmp_path / "t" / "model" / "member0" / "config.json").is_file()
    P.save_predictor(_hydra(model), tmp_path / "h")
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == ["README.md", "hydra_config.json", "model.safetensors"]
    P.save_predictor(model, tmp_path / "m")
    assert not (tmp_path / "m" / "predictor.json").exists() and (tmp_path / "m" / "config.json").is_file()
    P.save_predictor(MultiHeadMLP(2, 3, heads=2), tmp_path / "s")
    assert json.loads((tmp_path / "s" / "predictor.json").read_text())["kind"] == "multi_head_mlp"


def test_a_folder_of_two_saves_and_a_kinds_own_loader_given_another_kind_are_refused(tmp_path):
    """An HF save_pretrained into an ensemble's folder (it adds files, ours replace the folder) left both configs:
    load_predictor read the stale ensemble. MCDropout.from_pretrained of a calibrated folder: KeyError 'samples'."""
    model = MODELS["bert"]()
    P.save_predictor(_hydra(model), tmp_path / "h")
    model.save_pretrained(tmp_path / "h")
    with pytest.raises(ValueError, match="holds files of two saves .hydra_config.json and config.json"):
        P.load_predictor(tmp_path / "h")
    P.save_predictor(_hydra(model), tmp_path / "h")  # saved again: the folder is replaced whole
    assert isinstance(P.load_predictor(tmp_path / "h"), he.HydraEnsemble)
    P.save_predictor(P.Calibrated(model, P.TemperatureScaling(2.0)), tmp_path / "c")
    for kind in (P.MCDropout, P.DeepEnsemble, P.BatchEnsemble, P.PackedEnsemble, P.MIMO):
        with pytest.raises(ValueError, match=f"holds a 'calibrated' predictor, not a '{kind.kind}': load it with"):
            kind.from_pretrained(tmp_path / "c")
    with pytest.raises(ValueError, match="holds a 'hydra_ensemble' predictor, not a 'calibrated'"):
        P.Calibrated.from_pretrained(tmp_path / "h")


def test_an_unknown_kind_names_the_known_ones_and_register_predictor_adds_one(tmp_path):
    (tmp_path / "predictor.json").write_text(json.dumps({"kind": "bayes_by_backprop"}))
    with pytest.raises(ValueError, match="unknown kind 'bayes_by_backprop'.*'deep_ensemble'.*'hydra_ensemble'"):
        P.load_predictor(tmp_path)
    with pytest.raises(TypeError, match="no saved kind for a Linear"):
        P.save_predictor(torch.nn.Linear(2, 2), tmp_path / "linear")

    class Constant(torch.nn.Module):
        kind = "constant"

        @classmethod
        def from_pretrained(cls, path):
            return cls()

    P.register_predictor(Constant)
    try:
        (tmp_path / "predictor.json").write_text(json.dumps({"kind": "constant"}))
        assert isinstance(P.load_predictor(tmp_path), Constant)
    finally:
        del P.PREDICTOR_KINDS["constant"]


def test_a_wrapper_declares_the_model_it_is_built_on():
    model, hydra = MODELS["bert"](), _hydra(MODELS["bert"]())
    scaled = P.Calibrated(hydra, P.TemperatureScaling(2.0))
    assert P.base_model(P.Calibrated(P.DeepEnsemble([model]), P.TemperatureScaling(2.0))) is model
    assert P.base_model(scaled) is hydra and P.base_model(hydra) is hydra
    assert P.num_members(scaled) == 3 and P.num_members(model) == 1
    assert P.class_names(scaled) == [str(model.config.id2label[i]) for i in range(3)]


def test_an_encoder_where_a_classifier_is_needed_is_told_what_to_do(tmp_path):
    """A BERT encoder can be given a head (`finetune`); DINOv3 cannot: transformers has no classifier class for it,
    so the message does not send the user to `finetune`, which would fail."""
    for name, fix in (
        ("bert_encoder", "fine-tune it first"),
        ("dinov3_encoder", "transformers has no classification class for 'dinov3_vit'"),
    ):
        he.save_model(MODELS[name](), tmp_path / name)
        with pytest.raises(ValueError, match=f"which has no classifier; {fix}"):
            P.load_classifier(tmp_path / name)
