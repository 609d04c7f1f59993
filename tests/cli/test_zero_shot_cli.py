"""Zero-shot from the command line on a tiny CLIPModel checkpoint: predict and evaluate with --classes, a joint
circuit over both towers, zero-shot members, and the errors that teach the flags."""

import json

from cli_support import clip_model, hydra_ens, image_files, refused  # noqa: F401 (fixtures)


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
    metrics = json.loads((report / "metrics.json").read_text())
    assert set(metrics["models"]) == {"single", "hydra"} if "models" in metrics else "hydra" in json.dumps(metrics)
    table = (report / "report.md").read_text()
    assert "| hydra |" in table and "+" in table  # heads shown as image+text per member
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
