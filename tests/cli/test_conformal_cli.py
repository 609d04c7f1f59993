"""`--conformal` on `hydra-ens predict` and `evaluate`, and the selective-classification columns and plot of
`evaluate`'s report, each against the library on the same files."""

from __future__ import annotations

import json

import torch
from cli_support import hydra_ens, image_classifier, image_files, refused  # noqa: F401 (fixtures)

from hydra_ensembles.data.files import read_encoded
from hydra_ensembles.evaluation.conformal import SplitConformal
from hydra_ensembles.evaluation.report import conformal_metrics, selective_metrics
from hydra_ensembles.outputs import collect_member_logits, labels_of
from hydra_ensembles.predictors import load_classifier, load_preprocessor, model_config
from hydra_ensembles.uncertainty import ensemble_probs


def _probs(model_dir, folder, labelled: bool):
    """The ensemble probabilities (N, C) of the model at `model_dir` on an image folder, and its labels."""
    model = load_classifier(model_dir)
    kind, processor = load_preprocessor(model_dir)
    batches = read_encoded(folder, kind, processor, model_config(model), labelled=labelled).batches
    probs = ensemble_probs(collect_member_logits(model, batches).double())
    return probs, labels_of(batches) if labelled else None


def test_predict_prints_each_inputs_conformal_set(tmp_path, image_classifier, image_files):  # noqa: F811
    model, f = str(image_classifier), {k: str(v) for k, v in image_files.items()}
    common = ["predict", "--model", model, "--inputs", f["ood"], "--calibration", f["test"], "--conformal", "0.2"]
    shown = hydra_ens(*common).stdout
    hydra_ens(*common, "--format", "jsonl", "--output", str(tmp_path / "p.jsonl"))
    calibration, labels = _probs(image_classifier, f["test"], labelled=True)
    conformal = SplitConformal(0.2).calibrate(calibration, labels)  # APS, randomised, seed 0: as the command
    sets = conformal.sets(_probs(image_classifier, f["ood"], labelled=False)[0])
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(rows) == len(sets) == 6
    for row, in_set in zip(rows, sets):
        assert sorted(row["set"]) == sorted(name for name, inside in zip(("bright", "dark"), in_set) if inside)
    assert f"APS score <= {conformal.quantile:.4f}, calibrated on 12 labelled inputs" in shown
    assert "with probability 80%" in shown and "  set" in shown


def test_evaluate_reports_selective_columns_conformal_coverage_and_a_risk_coverage_plot(
    tmp_path,
    image_classifier,  # noqa: F811
    image_files,  # noqa: F811
):
    model, f, out = str(image_classifier), {k: str(v) for k, v in image_files.items()}, tmp_path / "report"
    flags = ["--far", f"stripes={f['ood']}", "--conformal", "0.2", "--latency-repeats", "0", "--out", str(out)]
    shown = hydra_ens("evaluate", "--model", f"vit={model}", "--data", f["test"], *flags).stdout
    saved = json.loads((out / "metrics.json").read_text())
    logits, labels = torch.load(out / "logits" / "vit.pt")["test"], _probs(image_classifier, f["test"], True)[1]
    assert saved["selective"] == {"coverage": 0.8, "risk": 0.05, "models": {"vit": selective_metrics(logits, labels)}}
    assert saved["conformal"] == {"alpha": 0.2, "models": {"vit": conformal_metrics(logits, labels, 0.2)}}
    report = (out / "report.md").read_text()
    for header in ("| AURC |", "| AUGRC |", "| Risk@80%cov |", "| Cov@5%risk |", "THR coverage", "RAPS set size"):
        assert header in report and header in shown
    assert "random half of the test data (6 inputs)" in report
    assert (out / "risk_coverage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_conformal_flags_say_what_is_wrong(tmp_path, image_classifier, image_files):  # noqa: F811
    model, f = str(image_classifier), {k: str(v) for k, v in image_files.items()}
    evaluate = ["evaluate", "--model", model, "--data", f["test"], "--out", str(tmp_path / "report")]
    bad = refused(*evaluate, "--conformal", "1.5")
    assert bad.returncode == 2 and "argument --conformal: invalid miscoverage value: '1.5'" in bad.stderr
    few = refused(*evaluate, "--conformal", "0.12")  # 8 to calibrate: more than half of 12
    assert few.returncode == 2 and "(6 of its 12 examples) and needs at least 8" in few.stderr
    fixed = refused("predict", "--model", model, "--inputs", f["ood"], "--threshold", "0.5", "--conformal", "0.2")
    assert fixed.returncode == 2 and "--conformal calibrates on labelled --calibration inputs" in fixed.stderr
    # flags that would be accepted and then ignored are refused
    predict = ["predict", "--model", model, "--inputs", f["ood"]]
    ignored = {
        "--tpr chooses the threshold on --calibration inputs": [*predict, "--threshold", "0.5", "--tpr", "0.9"],
        "--conformal-score is the score of --conformal": [*predict, "--threshold", "0.5", "--conformal-score", "raps"],
        "--severities applies to --shift": [*evaluate, "--severities", "1", "3"],
    }
    for message, args in ignored.items():
        result = refused(*args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
