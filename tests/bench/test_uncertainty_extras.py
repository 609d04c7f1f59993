"""benchmarks/uncertainty_extras.py end to end on the bench tests' tiny task: the rows `hydra-ens bench` cached,
the detector chosen on validation, a row not trained reported as missing (and not trained), a rerun that resumes."""

import json
import zlib
from dataclasses import replace

import pytest
import torch
from conftest import load_script
from sklearn.metrics import roc_auc_score
from test_suite import _batches, tiny_task  # noqa: F401 (the fixture)

from hydra_ensembles.bench import runner, suite
from hydra_ensembles.evaluation.ood import OOD_SCORES
from hydra_ensembles.evaluation.scores import collect_scores
from hydra_ensembles.evaluation.shift import TextData
from hydra_ensembles.outputs import labels_of
from hydra_ensembles.predictors import fit_feature_scores


def _token_texts(batches) -> TextData:
    """The tiny task's token ids as texts of numbers ("17 4 52"), and an encoder back: text shifts act on them.
    A word that is no longer a number (a typo) becomes some id of the vocabulary."""

    def ids(text: str) -> list[int]:
        words = text.split()[:24]
        return [int(w) if w.isdigit() and int(w) < 90 else 3 + zlib.crc32(w.encode()) % 87 for w in words] or [3]

    def encode(texts: list[str]) -> list[dict]:
        out, labels = [], labels_of(batches).tolist()
        for start in range(0, len(texts), 4):
            rows = [ids(t) for t in texts[start : start + 4]]
            width = max(map(len, rows))
            out.append(
                {
                    "input_ids": torch.tensor([r + [0] * (width - len(r)) for r in rows]),
                    "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
                    "labels": torch.tensor(labels[start : start + 4]),
                }
            )
        return out

    texts = [
        " ".join(str(i) for i in row[mask.bool()].tolist())
        for batch in batches
        for row, mask in zip(batch["input_ids"], batch["attention_mask"])
    ]
    return TextData(texts, encode)


def _validation_aurocs(task, predictor, feature_names) -> dict[str, float]:
    """Every score's AUROC of ID validation vs OOD validation (OOD positive), by the library's public scoring path:
    logit scores of the logits; a feature score fit on each member model apart (`fit_feature_scores`) and the
    members' scores averaged by hand; "_concat" as `fit_feature_scores` fits it on the whole predictor."""
    members = list(getattr(predictor, "models", [predictor]))  # a deep ensemble's member models
    names = [n for n in OOD_SCORES if len(members) > 1 or n not in ("mutual_information", "disagreement")]

    def scores(data, name) -> torch.Tensor:
        if name in OOD_SCORES:
            return collect_scores(predictor, data, name)[1]
        if name.endswith("_concat"):
            fitted = fit_feature_scores(predictor, task.train, scores=[name.removesuffix("_concat")])
            return collect_scores(fitted, data, name)[1]
        each = [collect_scores(fit_feature_scores(m, task.train, scores=[name]), data, name)[1] for m in members]
        return torch.stack(each).mean(dim=0)

    aurocs = {}
    for name in [*names, *feature_names]:
        id_scores, ood_scores = scores(task.val, name), scores(task.circuit_ood, name)
        truth = [0] * len(id_scores) + [1] * len(ood_scores)
        aurocs[name] = roc_auc_score(truth, torch.cat([id_scores, ood_scores]).numpy())
    return aurocs


def test_the_report_of_cached_rows_chooses_on_validation_and_reports_a_missing_row(tiny_task, tmp_path, monkeypatch):  # noqa: F811
    extras = load_script("uncertainty_extras")
    task = replace(
        tiny_task,
        train=_batches((1, 2, 14, 15, 16)),
        val=_batches((3, 10, 11)),
        circuit_ood=_batches((9, 12, 13), False),
    )
    cache, out = tmp_path / "cache", tmp_path / "out" / "extras.md"
    runner.run(
        task,
        suite.TABLE,
        [0],
        tmp_path / "table",
        cache,
        rows=["Single", "Deep Ensembles"],
        progress=False,
        latency_repeats=0,
    )
    monkeypatch.setattr(suite, "finetune", lambda *a, **k: pytest.fail("trained a model"))
    monkeypatch.setattr(suite, "extract_circuit", lambda *a, **k: pytest.fail("searched a circuit"))
    rows = ["Single", "Deep Ensembles", "Hydra (Circ)"]
    summary = extras.run(
        task,
        [0],
        rows,
        out,
        cache,
        shift_data=lambda: (_token_texts(task.test), None),
        severities=[1, 3],
        resamples=200,
        command="pytest",
        progress=False,
    )

    report = out.read_text()
    for heading in (
        "Missing rows",
        "Best OOD detector per row",
        "Every score",
        "Selective prediction",
        "Conformal prediction sets",
        "Shift curves",
        "Does an ensemble of feature-space detectors beat the single model's best detector?",
    ):
        assert f"## {heading}\n" in report
    assert "- Hydra (Circ), seed 0: missing (not trained yet;" in report and "Command: `pytest`" in report
    for figure in ("extras-risk-coverage.png", "extras-shift-acc.png", "extras-shift-ece.png"):
        assert (out.parent / figure).stat().st_size > 5000 and f"]({figure})" in report, figure
    assert "chosen on the OOD validation split" in report
    seed_dir = runner.seed_dir(cache, task, 0)
    assert not (seed_dir / "circuit_avg.json").exists()
    assert not [m for m in (seed_dir / "models").iterdir() if m.name.startswith("hydra")]
    record = json.loads((out.parent / "extras-seed0.json").read_text())
    assert set(record["rows"]) == {"Single", "Deep Ensembles"}  # the missing row holds nothing
    assert all(set(parts) == set(extras.PARTS) for parts in record["rows"].values())
    assert json.loads(out.with_suffix(".json").read_text())["missing"][0]["row"] == "Hydra (Circ)"

    for row in ("Single", "Deep Ensembles"):
        ood = record["rows"][row]["ood"]
        predictor = suite.cached_row(task, 0, seed_dir, row).predictor
        # ViM keeps 16 of a member's 32 feature dimensions, 48 of the three members' 96 concatenated: 20 training
        # inputs leave it a residual on a member's features, none on the concatenation
        variants = ("", "_concat") if row == "Deep Ensembles" else ("",)  # one member: no concatenation
        assert set(ood["not_fit"]) == ({"vim_concat"} if row == "Deep Ensembles" else set())
        feature_names = [
            name + v for name in ("mds", "rmds", "knn", "vim") for v in variants if name + v != "vim_concat"
        ]
        expected = _validation_aurocs(task, predictor, feature_names)
        assert list(expected) == ood["order"]  # the same scores, in the same order
        for name, auroc in expected.items():
            assert ood["scores"][name]["val"]["auroc"] == pytest.approx(auroc, abs=1e-9), name
        best = max(expected.values())
        assert summary["ood"][row]["chosen"] == next(n for n, a in expected.items() if a == best)
        # the interval is chosen minus MSP on test: its point is the difference of the two test AUROCs
        chosen, msp = (ood["scores"][n]["all"]["auroc"] for n in (summary["ood"][row]["chosen"], "msp"))
        assert summary["ood"][row]["vs_msp"]["point"] == pytest.approx(chosen - msp, abs=1e-9)
        assert ood["recorded_vs_forward_max_abs"] < 1e-4  # MSP is the table's: its recorded logits
        conformal = record["rows"][row]["conformal"]
        assert conformal["aps"]["calibration_size"] == len(labels_of(task.val))  # calibrated on validation
        assert set(record["rows"][row]["shift"]["mean"]) == {"0", "1", "3"}
    assert (
        summary["ood"]["Deep Ensembles"]["members"] == 3
        and "mds_concat" in record["rows"]["Deep Ensembles"]["ood"]["scores"]
    )
    assert summary["feature_ensembles"][0]["row"] == "Deep Ensembles"

    # a rerun measures nothing again: every part of every (row, seed) is read back
    fail = lambda run: pytest.fail("measured a recorded part again")  # noqa: E731
    monkeypatch.setattr(extras, "PART_RUNS", dict.fromkeys(extras.PARTS, fail))
    again = extras.run(
        task,
        [0],
        rows,
        out,
        cache,
        shift_data=lambda: (_token_texts(task.test), None),
        severities=[1, 3],
        resamples=200,
        command="pytest",
        progress=False,
    )
    assert again["ood"] == summary["ood"]
