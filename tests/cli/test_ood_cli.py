"""`hydra-ens ood`: feature-space detectors fit on a training file and saved with the classifier; `predict --score`
and `evaluate --score` use them, and say how to fit them when a model has none."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from cli_support import TOPICS, hydra_ens, refused, text_encoder, text_files

from hydra_ensembles.cli.step import RECORD
from hydra_ensembles.data.files import read_encoded
from hydra_ensembles.evaluation.report import separation_metrics
from hydra_ensembles.evaluation.scores import collect_scores
from hydra_ensembles.predictors import FeatureScored, load_classifier, load_predictor, load_preprocessor, model_config


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, text_encoder):
    """A tiny BERT classifier over the test topics, saved with its tokenizer."""
    root = tmp_path_factory.mktemp("ood") / "classifier"
    classes = sorted(TOPICS)
    config = T.BertConfig.from_pretrained(text_encoder, num_labels=3, id2label=dict(enumerate(classes)))
    config.label2id = {c: i for i, c in enumerate(classes)}
    torch.manual_seed(3)
    T.BertForSequenceClassification(config).save_pretrained(root)
    T.BertTokenizer.from_pretrained(text_encoder).save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, classifier, text_files):
    out = tmp_path_factory.mktemp("ood-fitted") / "out"
    shown = hydra_ens("ood", "--model", str(classifier), "--data", str(text_files["train"]), "--out", str(out))
    return out, shown.stdout


def test_ood_saves_the_classifier_with_its_detectors(fitted, classifier, text_files):
    out, shown = fitted
    record = json.loads((out / RECORD).read_text())["results"]
    assert record["scores"] == ["mds", "rmds", "knn", "vim"] and record["examples"] == 72
    assert record["k"] == 50 and record["vim_dim"] == 16  # 32 features: half
    assert "fitted mds, rmds, knn, vim on the features of 72 training inputs" in shown
    loaded = load_predictor(out / "model")
    assert isinstance(loaded, FeatureScored)
    kind, tokenizer = load_preprocessor(out / "model")  # the tokenizer travels with it
    test = read_encoded(text_files["val"], kind, tokenizer, model_config(loaded), labelled=True).batches
    logits, _ = collect_scores(loaded, test, "vim")
    plain, _ = collect_scores(load_classifier(classifier), test, "msp")
    torch.testing.assert_close(logits, plain, rtol=0, atol=0)  # it predicts as the classifier does


def test_predict_and_evaluate_take_a_feature_score(fitted, tmp_path, text_files):
    out, _ = fitted
    shown = hydra_ens(
        "predict", "--model", str(out), "--inputs", str(text_files["new"]), "--calibration", str(text_files["val"]),
        "--score", "knn_concat", "--format", "jsonl",
    )  # fmt: skip
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert len(rows) == 4 and all(row["score"] == "knn_concat" for row in rows)
    loaded = load_classifier(out / "model")
    kind, tokenizer = load_preprocessor(out / "model")
    new = read_encoded(text_files["new"], kind, tokenizer, model_config(loaded), labelled=False).batches
    knn = collect_scores(loaded, new, "knn_concat")[1]  # the score asked for, computed here
    assert [row["ood_score"] for row in rows] == pytest.approx(knn.tolist(), rel=1e-5)
    assert knn.tolist() != pytest.approx(collect_scores(loaded, new, "msp")[1].tolist(), abs=1e-3)
    report = tmp_path / "report"
    hydra_ens(
        "evaluate", "--model", f"scored={out}", "--data", str(text_files["val"]), "--far", str(text_files["ood"]),
        "--score", "mds", "--latency-repeats", "0", "--out", str(report),
    )  # fmt: skip
    metrics = json.loads((report / "metrics.json").read_text())["results"]["scored"]["metrics"]
    read = {
        name: read_encoded(text_files[name], kind, tokenizer, model_config(loaded)).batches for name in ("val", "ood")
    }
    scores = {name: collect_scores(loaded, batches, "mds")[1] for name, batches in read.items()}
    expected = separation_metrics(scores["val"], scores["ood"])  # computed here, by the score asked for
    assert metrics["far"]["auroc"] == pytest.approx(expected["auroc"], abs=1e-12)
    assert metrics["far"]["fpr95"] == pytest.approx(expected["fpr95"], abs=1e-12)
    text = (report / "report.md").read_text()
    assert "OOD score: mds" in text and "OOD: the mds score" in text and "maximum softmax" not in text


def test_a_feature_score_without_detectors_says_how_to_fit_them(classifier, text_files):
    result = refused(
        "predict", "--model", str(classifier), "--inputs", str(text_files["new"]), "--threshold", "1",
        "--score", "vim"
    )  # fmt: skip
    assert result.returncode == 2 and "hydra-ens ood --model" in result.stderr
