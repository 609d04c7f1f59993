"""`hydra-ens calibrate`: a calibration map (temperature by default; vector, dirichlet, histogram, isotonic) fitted
on a validation file, saved as a predictor that `load_predictor`, `predict` and `evaluate` take."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from cli_support import TOPICS, hydra_ens, refused, text_encoder, text_files

from hydra_ensembles import metrics
from hydra_ensembles.cli.step import RECORD
from hydra_ensembles.data.files import read_encoded
from hydra_ensembles.outputs import collect_member_logits, labels_of
from hydra_ensembles.predictors import (
    CALIBRATION_MAPS,
    Calibrated,
    load_classifier,
    load_predictor,
    load_preprocessor,
    model_config,
)
from hydra_ensembles.uncertainty import ensemble_probs


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, text_encoder):
    """A tiny, overconfident BERT classifier (random weights, classifier scaled up) over the test topics, saved
    with its tokenizer: temperature scaling has something to fix."""
    root = tmp_path_factory.mktemp("calibrate") / "classifier"
    classes = sorted(TOPICS)
    config = T.BertConfig.from_pretrained(text_encoder, num_labels=3, id2label=dict(enumerate(classes)))
    config.label2id = {c: i for i, c in enumerate(classes)}
    torch.manual_seed(2)
    model = T.BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.mul_(30)
    model.save_pretrained(root)
    T.BertTokenizer.from_pretrained(text_encoder).save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory, classifier, text_files):
    out = tmp_path_factory.mktemp("calibrated") / "out"
    shown = hydra_ens("calibrate", "--model", str(classifier), "--val", str(text_files["val"]), "--out", str(out))
    return out, shown.stdout


def _val_nll(model_dir, val) -> float:
    """The validation NLL of the predictor saved at `model_dir`, computed in-process."""
    model = load_classifier(model_dir)
    kind, tokenizer = load_preprocessor(model_dir)
    batches = read_encoded(val, kind, tokenizer, model_config(model), labelled=True).batches
    return metrics.nll(ensemble_probs(collect_member_logits(model, batches).double()), labels_of(batches))


def test_calibrate_writes_a_temperature_scaled_predictor(calibrated, classifier, text_files):
    out, shown = calibrated
    record = json.loads((out / RECORD).read_text())
    assert record["finished"] and record["results"]["model_dir"] == "model"
    predictor = load_predictor(out / "model")
    assert isinstance(predictor, Calibrated) and predictor.calibration_map.name == "temperature"
    temperature = record["results"]["temperature"]
    assert predictor.calibration_map.temperature == pytest.approx(temperature)
    assert temperature > 1  # softens an overconfident model
    assert f"temperature {temperature:.4f}" in shown and "validation NLL" in shown and "ECE" in shown
    before, after = _val_nll(classifier, text_files["val"]), _val_nll(out / "model", text_files["val"])
    assert after < before
    assert record["results"]["before"]["nll"] == pytest.approx(before, abs=1e-6)
    assert record["results"]["after"]["nll"] == pytest.approx(after, abs=1e-6)


@pytest.mark.parametrize("method", sorted(set(CALIBRATION_MAPS) - {"temperature"}))
def test_each_method_prints_the_validation_nll_and_ece_before_and_after(tmp_path, classifier, text_files, method):
    out = tmp_path / "out"
    shown = hydra_ens(
        "calibrate", "--model", str(classifier), "--val", str(text_files["val"]), "--out", str(out), "--method", method
    ).stdout  # fmt: skip
    results = json.loads((out / RECORD).read_text())["results"]
    before, after = results["before"], results["after"]
    assert f"fitted {method} calibration on {results['examples']} validation examples" in shown
    nll, ece = (
        f"NLL {before['nll']:.4f} -> {after['nll']:.4f}",
        f"ECE {100 * before['ece']:.2f} -> {100 * after['ece']:.2f} %",
    )
    assert f"validation {nll}, {ece}" in shown
    assert after["nll"] < before["nll"]  # every map lowers the NLL of the data it is fitted on
    assert after["nll"] == pytest.approx(_val_nll(out / "model", text_files["val"]), abs=1e-6)  # as saved
    predictor = load_predictor(out / "model")
    assert isinstance(predictor, Calibrated) and predictor.calibration_map.name == method
    keeps_members = CALIBRATION_MAPS[method].on_members
    assert after["members"] == (before["members"] if keeps_members else 1)
    assert ("mutual information and member disagreement are lost" in shown) is not keeps_members


def test_predict_runs_on_the_calibrated_predictor(calibrated, classifier, text_files):
    out, _ = calibrated

    def rows(model) -> list[dict]:
        shown = hydra_ens(
            "predict", "--model", str(model), "--inputs", str(text_files["new"]), "--threshold", "0.5",
            "--format", "jsonl",
        ).stdout  # fmt: skip
        return [json.loads(line) for line in shown.splitlines()]

    plain, scaled = rows(classifier), rows(out)  # the output directory stands for the predictor in it
    assert [r["prediction"] for r in scaled] == [r["prediction"] for r in plain]  # T never changes the class
    assert all(s["probability"] <= p["probability"] for s, p in zip(scaled, plain, strict=True))
    assert any(s["probability"] < p["probability"] for s, p in zip(scaled, plain, strict=True))
    short = hydra_ens(
        "predict", "--model", str(classifier), "--inputs", str(text_files["new"]), "--threshold", "0.5",
        "--format", "jsonl", "--max-length", "4",
    )  # fmt: skip
    assert "were cut there (raise --max-length" in short.stderr  # said on stderr: stdout holds the JSON lines alone
    assert [json.loads(line)["prediction"] for line in short.stdout.splitlines()]


def test_an_unknown_method_is_refused_by_name(tmp_path, classifier, text_files):
    result = refused(
        "calibrate", "--model", str(classifier), "--val", str(text_files["val"]), "--out", str(tmp_path / "o"),
        "--method", "platt"
    )  # fmt: skip
    assert result.returncode == 2
    assert "invalid choice: 'platt'" in result.stderr and "temperature" in result.stderr and "isotonic" in result.stderr
    assert not (tmp_path / "o").exists()


def test_conformal_sets_are_refused_on_the_data_the_calibration_map_was_fitted_on(calibrated, text_files):
    """Split conformal needs calibration inputs the model was not fitted on; the OOD threshold alone may use them."""
    out, _ = calibrated
    same = refused(
        "predict", "--model", str(out), "--inputs", str(text_files["new"]), "--calibration", str(text_files["val"]),
        "--conformal", "0.3",
    )  # fmt: skip
    assert same.returncode == 2 and "is the data --model" in same.stderr and "Split the labelled data" in same.stderr
    inner = refused(  # the model directory inside the step's output: the same model, the same refusal
        "predict", "--model", str(out / "model"), "--inputs", str(text_files["new"]), "--calibration",
        str(text_files["val"]), "--conformal", "0.3",
    )  # fmt: skip
    assert inner.returncode == 2 and "is the data --model" in inner.stderr
    other = refused(
        "predict", "--model", str(out), "--inputs", str(text_files["new"]), "--calibration", str(text_files["test"]),
        "--text-column", "review", "--conformal", "0.3",
    )  # fmt: skip
    assert other.returncode == 0 and "Conformal sets:" in other.stdout and "probability 70%" in other.stdout
