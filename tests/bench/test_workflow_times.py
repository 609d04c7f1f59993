"""benchmarks/workflow_times.py on a tiny BERT and the smoke-sized BBC data: every step of the workflow runs as a
`hydra-ens` process and the report times each one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import load_script

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))
from cli_support import text_encoder  # noqa: E402, F401 (fixture)

STEPS = [
    "finetune",
    "scores",
    "circuit",
    "members (Taylor)",
    "finetune members (Taylor)",
    "fuse (Taylor)",
    "members (circuit)",
    "finetune members (circuit)",
    "fuse (circuit)",
    "evaluate",
    "predict",
    "calibrate",
]


@pytest.fixture(scope="module")
def timed(tmp_path_factory, text_encoder) -> tuple[dict, str, Path]:  # noqa: F811 (the fixture)
    root = tmp_path_factory.mktemp("workflow-times")
    args = ["--model", str(text_encoder), "--size", "smoke", "--work", str(root / "work")]
    load_script("workflow_times").main([*args, "--results", str(root / "workflow-times")])
    report = json.loads((root / "workflow-times.json").read_text())
    return report, (root / "workflow-times.md").read_text(), root / "work"


def test_the_report_times_every_step_of_the_workflow_in_order(timed):
    report, markdown, _ = timed
    assert [step["step"] for step in report["steps"]] == STEPS
    assert all(step["seconds"] > 0 for step in report["steps"])
    assert report["total_seconds"] == pytest.approx(sum(step["seconds"] for step in report["steps"]), abs=0.2)
    inside = {step["step"]: step["command_seconds"] for step in report["steps"]}
    assert inside["predict"] is None and all(inside[name] is not None for name in STEPS if name != "predict")
    for step in report["steps"]:
        assert f"| {step['step']} | {step['seconds']:.1f} |" in markdown
    assert {"machine", "date", "command", "device"} <= set(report) and report["device"] == "cpu"
    assert "`hydra-ens scores --model single --data data/val.csv --max-length 32 --out scores`" in markdown


def test_the_report_gives_the_data_sizes_and_the_steps_wrote_what_a_user_gets(timed):
    report, markdown, work = timed
    assert report["data"]["train.csv"] == 3 * 8 and report["data"]["circuit-val.csv"] == 6  # smoke: 8 per topic
    assert {"near-bbc-tech.txt", "far-drug-reviews.txt", "ood-val.txt"} <= set(report["data"])
    assert "train.csv 24" in markdown
    predictions = (work / "predictions.jsonl").read_text().splitlines()
    assert len(predictions) == report["data"]["test.csv"]
    assert (work / "calibrated" / "model").is_dir() and (work / "report" / "metrics.json").is_file()


def test_a_work_folder_holding_files_is_refused(tmp_path):
    (tmp_path / "old").write_text("")
    with pytest.raises(SystemExit, match="is not empty"):
        load_script("workflow_times").main(["--model", "unused", "--work", str(tmp_path)])
