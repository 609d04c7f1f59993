"""`hydra-ens evaluate --shift`: shift.json, shift.md and one plot per metric, checked against the library on the same
files; the clean point is exactly evaluate's own metrics; wrong shifts and severities are user errors."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from cli_support import TOPICS, hydra_ens, image_classifier, image_files, refused, text_encoder, text_files  # noqa: F401

import hydra_ensembles as he
from hydra_ensembles.cli.evaluate import _heads
from hydra_ensembles.data.files import read_encoded
from hydra_ensembles.evaluation.shift import PixelSpace, shift_curve, shifts_of
from hydra_ensembles.predictors import DeepEnsemble, load_classifier, load_preprocessor, model_config

CURVE = ("acc", "nll", "ece", "mi")  # what evaluate's metrics.json also holds


@pytest.fixture(scope="module")
def text_classifier(tmp_path_factory, text_encoder):  # noqa: F811
    root = tmp_path_factory.mktemp("shift") / "classifier"
    classes = sorted(TOPICS)
    config = T.BertConfig.from_pretrained(text_encoder, num_labels=3, id2label=dict(enumerate(classes)))
    config.label2id = {c: i for i, c in enumerate(classes)}
    torch.manual_seed(2)
    T.BertForSequenceClassification(config).save_pretrained(root)
    T.BertTokenizer.from_pretrained(text_encoder).save_pretrained(root)
    return root


def _clean_point_is_evaluates(out, model: str, shifts: list[str]) -> None:
    saved, evaluated = json.loads((out / "shift.json").read_text()), json.loads((out / "metrics.json").read_text())
    assert sorted(saved["models"][model]["shifts"]) == sorted(shifts)  # the JSON keys are sorted
    plain = evaluated["results"][model]["metrics"]["id"]
    for points in saved["models"][model]["shifts"].values():
        assert {k: points["0"][k] for k in CURVE} == {k: plain[k] for k in CURVE}  # exactly


def test_evaluate_shift_on_images_matches_the_library_and_plots_each_metric(tmp_path, image_classifier, image_files):  # noqa: F811
    model, test, out = str(image_classifier), str(image_files["test"]), tmp_path / "report"
    shifts = ["gaussian_noise", "contrast"]
    flags = ["--shift", *shifts, "--severities", "3", "1", "--latency-repeats", "0", "--out", str(out)]
    shown = hydra_ens("evaluate", "--model", f"a={model}", "--model", f"b={model}", "--data", test, *flags).stdout
    _clean_point_is_evaluates(out, "a", shifts)
    saved = json.loads((out / "shift.json").read_text())
    assert saved["severities"] == [0, 1, 3] and saved["seed"] == 0
    classifier = load_classifier(image_classifier)
    kind, processor = load_preprocessor(image_classifier)
    batches = read_encoded(test, kind, processor, model_config(classifier), labelled=True).batches
    expected = shift_curve(classifier, batches, shifts, [1, 3], pixels=PixelSpace.of(processor))
    assert saved["models"]["b"]["shifts"]["contrast"]["3"] == expected["contrast"][3]
    assert saved["models"]["a"]["shifts"]["gaussian_noise"]["1"] == expected["gaussian_noise"][1]
    table = (out / "shift.md").read_text()
    assert "| a | mean |" in table and "| b | contrast |" in table and "## ECE (%)" in table
    for metric in ("acc", "nll", "ece", "entropy", "mi"):
        assert (out / f"shift_{metric}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "shift.json, shift.md, shift_*.png" in shown


def test_evaluate_shift_on_text_perturbs_the_file_and_defaults_to_every_text_shift(
    tmp_path,
    text_classifier,
    text_files,  # noqa: F811
):
    out = tmp_path / "report"
    hydra_ens(
        "evaluate",
        "--model",
        f"bert={text_classifier}",
        "--data",
        str(text_files["test"]),
        "--text-column",
        "review",
        "--shift",
        "--severities",
        "5",
        "--latency-repeats",
        "0",
        "--out",
        str(out),
    )
    _clean_point_is_evaluates(out, "bert", shifts_of("text"))
    saved = json.loads((out / "shift.json").read_text())["models"]["bert"]
    assert saved["shifts"]["word_dropout"]["5"] != saved["shifts"]["word_dropout"]["0"]
    assert not list(out.glob("shift_*.png"))  # one model: the table says it all


def test_wrong_shifts_and_severities_are_user_errors(tmp_path, text_classifier, text_files):  # noqa: F811
    evaluate = [
        "evaluate",
        "--model",
        str(text_classifier),
        "--data",
        str(text_files["test"]),
        "--text-column",
        "review",
    ]
    evaluate += ["--out", str(tmp_path / "report")]
    unknown = refused(*evaluate, "--shift", "fog")
    assert unknown.returncode == 2 and "unknown shift(s) ['fog']; the known ones are image:" in unknown.stderr
    wrong = refused(*evaluate, "--shift", "gaussian_blur")
    assert wrong.returncode == 2 and "['gaussian_blur'] do not apply to text data; the text shifts are" in wrong.stderr
    severe = refused(*evaluate, "--shift", "--severities", "6")
    assert severe.returncode == 2 and "severities must be integers 1..5, got [6]" in severe.stderr


def test_the_heads_column_counts_heads_per_layer_as_the_benchmark_tables_do():
    """evaluate's "Heads": kept heads per layer ("4"; "3x3" for 3 members), averaged where layers or members differ,
    as the demo's and the benchmarks' tables write them (README: "8x3 (avg)")."""
    model = T.BertForSequenceClassification(
        T.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=4, intermediate_size=8)
    )
    assert _heads(model) == "4"
    even = he.build_members(model, [{layer: [head] for layer in range(3)} for head in range(3)])
    assert _heads(he.HydraEnsemble.fuse(even)) == "1x3"
    uneven = he.build_members(model, [{0: [0, 1]}, {1: [0]}, {2: [1, 2, 3]}])  # 2+4+4, 4+1+4, 4+4+3 kept
    assert _heads(he.HydraEnsemble.fuse(uneven)) == "3.3x3 (avg)"
    assert _heads(DeepEnsemble([model, model])) == "4x2"  # not its first member's alone
    assert _heads(he.prune_heads(model, {0: [0]})) == "3.7 (avg)"  # one head of layer 0 removed
