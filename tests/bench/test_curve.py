"""The cost/quality curve on a tiny BERT: every row measured on validation, the choice made on validation alone,
the shared-trunk rows fused with their first layers run once."""

import json
from dataclasses import replace

import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score
from test_suite import tiny_task  # noqa: F401 (the fixture)

from hydra_ensembles.bench import curve, runner, suite
from hydra_ensembles.outputs import collect_member_logits, labels_of
from hydra_ensembles.uncertainty import ensemble_probs


def test_the_curve_measures_every_row_on_validation_and_chooses_on_it(tiny_task, tmp_path):  # noqa: F811
    # members sharing 2 of 3 layers draw from the last layer's heads: a circuit of every head, ranked by data
    tiny_task = replace(tiny_task, circuit_pool=11, circuit_tie_break="score")
    summary = curve.run(tiny_task, [0], tmp_path / "out", tmp_path / "cache", progress=False, latency_repeats=1)
    assert list(summary["rows"]) == list(curve.CURVE_ROWS) and set(summary["latency"]) == set(curve.CURVE_ROWS)
    seed_dir = runner.seed_dir(tmp_path / "cache", tiny_task, 0)
    for row in ("Single", "Hydra (Circ), shared trunk 1/2"):  # the validation numbers, against scikit-learn's
        predictor = suite.cached_row(tiny_task, 0, seed_dir, row).predictor
        # on the data set apart for choosing: no circuit read it (the circuits' OOD data would flatter their rows)
        probs = {
            split: ensemble_probs(collect_member_logits(predictor, data)).double()
            for split, data in (("val", tiny_task.selection_id), *tiny_task.selection_ood.items())
        }
        aurocs = []
        for source in tiny_task.selection_ood:  # each OOD source apart, then their mean, as "AUROC all"
            msp = torch.cat([probs["val"].max(dim=1).values, probs[source].max(dim=1).values])
            is_ood = [0] * len(probs["val"]) + [1] * len(probs[source])
            aurocs.append(roc_auc_score(is_ood, -msp.numpy()))
        said = summary["validation"][row]
        assert abs(said["auroc"] - sum(aurocs) / len(aurocs)) < 1e-9
        val_probs = probs["val"] / probs["val"].sum(dim=1, keepdim=True)  # sums to 1 within float64's precision
        nll = log_loss(labels_of(tiny_task.selection_id).numpy(), val_probs.numpy(), labels=[0, 1, 2])
        assert abs(said["nll"] - nll) < 1e-6
    trunk = summary["per_seed"][0]["Hydra (Circ), shared trunk 1/2"]
    assert trunk["trunk"] == 2 and all(m["0"] == trunk["head_maps"][0]["0"] for m in trunk["head_maps"])
    flops = {row: stats["flops_per_example"]["mean"] for row, stats in summary["rows"].items()}
    assert flops["Hydra (Circ), shared trunk 1/2"] < flops["Hydra (Circ), fused then fine-tuned"]
    # the choice: the best validation AUROC within each cost limit, whatever the test columns say
    for limit, chosen in summary["chosen"].items():
        within = [row for row in flops if flops[row] <= float(limit) * flops["Single"] * (1 + 1e-9)]
        best = max(summary["validation"][row]["auroc"] for row in within)
        assert chosen in within and summary["validation"][chosen]["auroc"] == best
    timed = {row: stats["median"] for row, stats in summary["latency"].items()}  # and within each latency limit
    for limit, chosen in curve.choose_by_latency(summary).items():
        within = [row for row in timed if timed[row] <= float(limit) * (1 + 1e-9)]
        best = max(summary["validation"][row]["auroc"] for row in within)
        assert chosen in within and summary["validation"][chosen]["auroc"] == best
    pairs = {tuple(pair["rows"]) for pair in summary["differences"]["pairs"]}  # each row against Single
    calibrated = {("CircAvg, temp. scaling", "Temp. scaling"), ("Hydra (Circ), temp. scaling", "Temp. scaling")}
    assert pairs == {(row, "Single") for row in curve.CURVE_ROWS[1:] if row != curve.ENGINE} | calibrated
    # Single on the fused engine: Single's predictions at the engine's cost (its last layer reads [CLS] alone)
    single, engine = (suite.cached_row(tiny_task, 0, seed_dir, row).predictor for row in ("Single", curve.ENGINE))
    torch.testing.assert_close(
        collect_member_logits(engine, tiny_task.test), collect_member_logits(single, tiny_task.test), atol=1e-5, rtol=0
    )
    assert flops[curve.ENGINE] < flops["Single"]
    table = (tmp_path / "out" / "cost_curve.md").read_text()
    assert "- CircAvg vs Single: NLL" in table and "at most 1.1x Single's latency: " in table
    assert all(f"| {row} |" in table for row in curve.CURVE_ROWS) and "Chosen on validation" in table
    assert f"- at most 1.1x Single's latency: {curve.choose_by_latency(summary)['1.1']}" in table
    assert "Chosen on validation within 1.1x Single's latency: " in table and "Latency: batch of" in table
    # its own timing record: timing its rows must not replace the suite table's run in latency.json
    assert (seed_dir / "curve_latency.json").is_file() and not (seed_dir / "latency.json").exists()
    assert "no answer, not timed (" in curve.markdown(summary | {"latency": {}})  # untimed: no "none" claim
    engine_ratio = flops["Hydra (Circ)"] / flops[curve.ENGINE]
    assert "The fused rows x this engine-matched Single: Hydra (Circ), shared trunk 3/4" in table
    assert f"Hydra (Circ) {engine_ratio:.2f}x FLOPs, latency " in table
    assert (tmp_path / "out" / "cost_curve.png").stat().st_size > 5000
    written = json.loads((tmp_path / "out" / "cost_curve.json").read_text())
    assert written["chosen"] == summary["chosen"]  # and what the table says of the latency, as it says it
    assert written["chosen_by_latency"] == curve.choose_by_latency(summary) and written["chosen_by_latency"]
    assert written["answer"] == curve.one_model_answer(summary) and written["answer"][0] in table
    # rendered again from its records: nothing rebuilt, the same numbers
    again = curve.run(tiny_task, [0], tmp_path / "out2", tmp_path / "cache", progress=False, latency_repeats=1)
    assert again["validation"] == summary["validation"] and again["latency"] == summary["latency"]
    # a row recorded before the selection data (validation on the circuits' OOD data) is measured again
    record = seed_dir / curve.TABLE.record
    results = json.loads(record.read_text())
    del results["CircAvg"]["validation"]["data"]
    results["CircAvg"]["validation"]["auroc"] = 1.0
    record.write_text(json.dumps(results))
    logits = seed_dir / curve.TABLE_LOGITS / "CircAvg.pt"
    assert logits.is_file() and curve.forget_stale_rows(record) == ["CircAvg"] and not logits.exists()
    results["CircAvg"]["validation"]["auroc"] = 1.0  # and stale again, for the run to find
    record.write_text(json.dumps(results))
    third = curve.run(tiny_task, [0], tmp_path / "out3", tmp_path / "cache", progress=False, latency_repeats=1)
    assert third["validation"] == summary["validation"]
    assert json.loads(record.read_text())["CircAvg"]["validation"]["data"] == curve.SELECTION
    assert third["selection_without"] == [] and "no examples to spare" not in curve.markdown(third)
    assert "test part (near: no examples to spare, left out)" in curve.markdown(third | {"selection_without": ["near"]})
    with pytest.raises(ValueError, match="has no selection data .Task.selection_id / selection_ood."):
        curve.validation_metrics(engine, replace(tiny_task, selection_ood={}))


def test_one_models_price_needs_all_three_intervals_better_within_the_latency():
    better = {"nll": (-0.02, -0.03, -0.01), "ece": (-0.01, -0.02, -0.005), "auroc_all": (0.02, 0.01, 0.03)}

    def pair(row, other="Single", **changed):
        said = better | changed
        return {"rows": [row, other]} | {k: dict(zip(("point", "low", "high"), v)) for k, v in said.items()}

    latency = {"A": {"median": 0.9}, "B": {"median": 1.05}, "C": {"median": 1.2}, "D": {"median": 1.0}}
    summary = {
        "latency": latency,
        "differences": {
            "pairs": [
                pair("A"),
                pair("B", ece=(-0.01, -0.02, 0.001)),  # ECE not separated
                pair("C"),  # too slow
                pair("D", other="Temp. scaling"),  # not against Single
            ]
        },
    }
    assert curve.beats_single(summary) == ["A"]
    assert curve.beats_single(summary, latency_limit=1.3) == ["A", "C"]
    # latency timed on several seeds' models: each row's mean over seeds of its median (`latency_over_seeds`)
    summary["latency"] = {row: {"mean": stats["median"], "std": 0.01, "runs": 2} for row, stats in latency.items()}
    assert curve.beats_single(summary) == ["A"]


def test_the_answer_is_the_row_chosen_on_validation_and_other_rows_are_exploratory():
    better = {"nll": (-0.02, -0.03, -0.01), "ece": (-0.01, -0.02, -0.005), "auroc_all": (0.02, 0.01, 0.03)}

    def pair(row, **changed):
        intervals = {k: dict(zip(("point", "low", "high"), v)) for k, v in (better | changed).items()}
        return {"rows": [row, "Single"]} | intervals

    rows = {row: {} for row in ("Single", "A", "B", "C")}
    summary = {
        "rows": rows,
        "latency": {"Single": {"median": 1.0}, "A": {"median": 1.05}, "B": {"median": 1.0}, "C": {"median": 2.0}},
        "validation": {  # B best on validation within 1.1x; C better still, but too slow
            "Single": {"auroc": 0.80, "nll": 0.3}, "A": {"auroc": 0.81, "nll": 0.3},
            "B": {"auroc": 0.85, "nll": 0.3}, "C": {"auroc": 0.90, "nll": 0.2},
        },
        "differences": {"pairs": [pair("A"), pair("B", ece=(0.01, -0.01, 0.02)), pair("C")]},
    }  # fmt: skip
    first, second = curve.one_model_answer(summary)
    assert first.startswith("Chosen on validation within 1.1x Single's latency: B;") and "not better on all" in first
    assert "ECE not separated" in first and "exploratory" in second and second.endswith(": A.")
    summary["differences"]["pairs"][1] = pair("B")
    assert curve.one_model_answer(summary)[0].endswith("better on NLL, ECE and all-OOD AUROC alike.")
    summary["validation"]["Single"]["auroc"] = 0.99  # Single itself chosen: nothing cheaper to name
    assert curve.one_model_answer(summary)[0].endswith("Single, Single itself.")
    del summary["latency"]["C"]
    assert curve.one_model_answer(summary) == ["At most 1.1x Single's latency: no answer, not timed (C)."]
