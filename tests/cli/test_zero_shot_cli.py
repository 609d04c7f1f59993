"""Zero-shot from the command line on a tiny CLIPModel checkpoint: predict and evaluate with --classes, a joint
circuit over both towers, zero-shot members, and the errors that teach the flags."""

import json
import re

import pytest
import torch
from cli_support import clip_model, hydra_ens, image_files, refused  # noqa: F401 (fixtures)
from tolerances import CONTRACT

import hydra_ensembles as he
from hydra_ensembles.data.files import read_encoded
from hydra_ensembles.evaluation.compare import row_file
from hydra_ensembles.outputs import collect_member_logits
from hydra_ensembles.predictors import load_classifier, load_preprocessor, model_config


def test_zero_shot_predict_circuit_members_evaluate(tmp_path, clip_model, image_files):  # noqa: F811
    clip, f = str(clip_model), {k: str(v) for k, v in image_files.items()}
    classes = ["--classes", "bright,dark", "--templates", "a photo of a {}.|a {} image"]
    shown = hydra_ens("predict", "--model", clip, *classes, "--inputs", f["ood"], "--calibration", f["test"]).stdout
    assert "OOD flag" in shown and ("bright" in shown or "dark" in shown)
    circuit = tmp_path / "circuit"
    hydra_ens(
        "circuit",
        "--model",
        clip,
        *classes,
        "--data",
        f["test"],
        "--ood",
        f["ood"],
        "--budget",
        "6",
        "--out",
        str(circuit),
    )
    saved = json.loads((circuit / "circuit.json").read_text())
    assert len(saved["removed"]) == 6 and {t for t, _, _ in saved["removed"]} <= {"image", "text"}
    members = tmp_path / "zs"
    out = hydra_ens(
        "members", "--model", clip, "--circuit", str(circuit), "--budget", "3", "--pool", "6", "--out", str(members)
    ).stdout
    assert "zero-shot Hydra Ensemble of 3 members" in out
    assert (members / "model" / "README.md").read_text().startswith("---\nlibrary_name: hydra-ensembles\n")  # its card
    report = tmp_path / "report"
    hydra_ens(
        "evaluate",
        "--model",
        f"single={clip}",
        "--model",
        f"hydra={members}",
        *classes,
        "--data",
        f["test"],
        "--far",
        f"stripes={f['ood']}",
        "--latency-repeats",
        "1",
        "--out",
        str(report),
    )
    results = json.loads((report / "metrics.json").read_text())["results"]
    names, templates = ["bright", "dark"], ["a photo of a {}.", "a {} image"]
    for name, path, count in (
        ("single", clip_model, 1),
        ("hydra", members / "model", 3),
    ):  # what evaluate ran, in process
        model = load_classifier(path, names, templates)
        test = read_encoded(f["test"], *load_preprocessor(path), model_config(model)).batches
        expected = collect_member_logits(model, test)
        assert expected.shape == (12, count, 2)
        torch.testing.assert_close(
            torch.load(row_file(report / "logits", name))["test"], expected, atol=CONTRACT, rtol=0
        )
        labels = torch.cat([b["labels"] for b in test])
        accuracy = he.metrics.accuracy(he.ensemble_probs(expected), labels)
        assert results[name]["metrics"]["id"]["acc"] == pytest.approx(accuracy, abs=1e-12)
    table = (report / "report.md").read_text()
    assert "| hydra |" in table and re.search(r"\| hydra \| \d+\+\d+", table)  # heads: image+text per member
    jsonl = hydra_ens(
        "predict", "--model", str(members), "--inputs", f["ood"], "--threshold", "-0.5", "--format", "jsonl"
    ).stdout
    rows = [json.loads(line) for line in jsonl.splitlines() if line.startswith("{")]
    assert len(rows) == 6 and all(r["prediction"] in ("bright", "dark") and r["mutual_information"] >= 0 for r in rows)


def test_zero_shot_errors_name_the_fix(clip_model, image_files):  # noqa: F811
    f = {k: str(v) for k, v in image_files.items()}
    missing = refused("predict", "--model", str(clip_model), "--inputs", f["ood"], "--threshold", "0")
    assert missing.returncode == 2 and "--classes" in missing.stderr
    bad = refused(
        "predict",
        "--model",
        str(clip_model),
        "--classes",
        "a,b",
        "--templates",
        "no slot",
        "--inputs",
        f["ood"],
        "--threshold",
        "0",
    )
    assert bad.returncode == 2 and "{}" in bad.stderr
