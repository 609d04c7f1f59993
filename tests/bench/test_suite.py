"""The benchmark suite end to end on a tiny BERT: every row, cached and resumable, tables and figures."""

import json
import re
from dataclasses import replace

import pytest
import torch
from conftest import HEADS, MODELS, make_inputs

from hydra_ensembles.bench import runner, suite
from hydra_ensembles.bench.tasks import Task
from hydra_ensembles.evaluation.bootstrap import difference_lines, paired_bootstrap
from hydra_ensembles.evaluation.compare import row_file
from hydra_ensembles.evaluation.report import evaluate
from hydra_ensembles.members import head_map_overlap
from hydra_ensembles.outputs import labels_of
from hydra_ensembles.predictors import load_predictor
from hydra_ensembles.pruning import linear_parameters
from hydra_ensembles.training import TEXT_RECIPE


def _batches(seeds, labelled=True):
    return [make_inputs("bert", seed=s) | ({"labels": torch.tensor([0, 1, 2, 1])} if labelled else {}) for s in seeds]


@pytest.fixture
def tiny_task():
    recipe = TEXT_RECIPE.with_(epochs=1, lr=1e-3, patience=None)
    return Task(
        name="tiny",
        new_model=lambda seed: MODELS["bert"](seed=seed),
        train=_batches((1, 2)),
        val=_batches((3,)),
        test=_batches((4, 5)),
        near={"near": _batches((6,), False)},
        far={"far": _batches((7, 8), False)},
        circuit_id=_batches((3,)),
        circuit_ood=_batches((9,), False),
        selection_id=_batches((10,)),
        selection_ood={"near": _batches((11,), False), "far": _batches((12, 13), False)},
        recipe=recipe,
        member_recipe=recipe,
        lora_recipe=recipe,
        lora_from_single=False,
        prune_per_layer=1,
        taylor_pool=2,
        circuit_pool=4,
        mc_samples=2,
        head_epochs=1,
        notes=["a tiny test task"],
    )


def test_every_row_is_built_evaluated_tabled_and_cached(tiny_task, tmp_path, monkeypatch):
    # Packed-Ensembles, MIMO: tests/bench/test_cheap_rows.py; the shared trunks, which need a longer circuit than the
    # tiny task's pool of 4 holds: tests/bench/test_curve.py
    rows = tuple(row for row in suite.ALL_ROWS if row not in suite.FROM_SCRATCH_ROWS + suite.TRUNK_ROWS)
    scaled_row = "Hydra (Circ), temp. scaling"
    summary = runner.run(
        tiny_task, suite.TABLE, [0], tmp_path / "out", tmp_path / "cache", command="pytest", progress=False, rows=rows
    )
    assert list(summary["rows"]) == list(rows)
    table = (tmp_path / "out" / "table.md").read_text()
    assert all(f"| {row} |" in table for row in rows) and "a tiny test task" in table
    assert "| Method | near | far |" in table.split("Per OOD set")[1]  # the task's near sets, then its far ones
    assert not [line for line in table.splitlines() if line.startswith("| ") and " ± " in line]  # one seed: no "± 0.0"
    assert set(summary["latency"]) == set(rows) and summary["latency"]["Single"]["median"] == 1.0
    single_line = next(line for line in table.splitlines() if line.startswith("| Single |"))
    assert single_line.endswith("| 1.00 (1.00-1.00) |")  # latency: median (min-max) over interleaved rounds
    saved = json.loads((tmp_path / "out" / "table.json").read_text())
    assert saved["seeds"] == [0] and saved["command"] == "pytest" and saved["wall_time_s"] > 0
    hydra, stacked = (saved["per_seed"]["0"][row] for row in ("Hydra (Circ)", "Hydra (Circ), stacked MLP"))
    assert hydra["heads"] == "3x3 (avg)" and hydra["mlp"] == "average" and len(hydra["head_maps"]) == 3
    assert stacked["mlp"] == "stack" and stacked["head_maps"] == hydra["head_maps"]  # the same members
    in_memory = summary["per_seed"][0]["Hydra (Circ)"]["head_maps"]  # as JSON reads them back: the same table
    assert in_memory == hydra["head_maps"] and all(isinstance(layer, str) for m in in_memory for layer in m)
    assert hydra["averaged"] > 0 and stacked["averaged"] == 0  # fine-tuned apart: the merged MLP is averaged
    assert "| Hydra (Circ) | " in table.split("Members' disagreement")[1]  # one by one vs after fusion
    search = saved["circuit_search"]["0"]  # and how many removals tied: on the tiny task's 8 + 8 examples, all
    assert re.fullmatch(r'exact — (\d+) of \1 removals tied \(tie rule "order": S alone; .*\)', search)
    assert f"- Circuit search (CircAvg ranking): seed 0: {search}." in table
    for name in ("reliability.png", "ood_scores.png", "head_importance.png"):
        assert (tmp_path / "out" / name).stat().st_size > 5000
    seed_cache = next((tmp_path / "cache").iterdir()) / "seed0"
    assert not list((seed_cache / "checkpoints").iterdir())  # every model saved: no training checkpoint kept
    trained = json.loads((seed_cache / suite.TRAINING).read_text())  # every fine-tuned model's epochs: a record
    assert {"single", "start0-1", "start0-2"} <= set(trained) and any(n.startswith("hydra-circ") for n in trained)
    single = trained["single"]
    assert 1 <= single["kept_epoch"] <= len(single["epochs"]) <= tiny_task.recipe.epochs
    assert "val_nll" in single["epochs"][0] and saved["per_seed"]["0"]["Single"]["_measured"]["machine"]
    # every fine-tuned pruned model, the control and the ensemble fine-tuned after fusing keep their best
    # validation epoch
    assert "single-long" in trained and all("val_nll" in record["epochs"][0] for record in trained.values())
    fused_first = saved["per_seed"]["0"]["Hydra (Circ), fused then fine-tuned"]
    assert fused_first["head_maps"] == hydra["head_maps"] and fused_first["averaged"] == 0  # exact before training
    assert len([name for name in trained if name.startswith("hydra-circ-fused-")]) == 1
    # the calibrated Hydra (Circ): the same members, one temperature fitted on validation, the NLL no worse there
    scaled = saved["per_seed"]["0"]["Hydra (Circ), temp. scaling"]
    assert scaled["head_maps"] == hydra["head_maps"] and scaled["temperature"] != 1.0
    assert scaled["temperature"] != saved["per_seed"]["0"]["Temp. scaling"]["temperature"]
    logits = {row: torch.load(row_file(seed_cache / "logits", row)) for row in ("Hydra (Circ)", scaled_row)}
    hydra_test, scaled_test = logits["Hydra (Circ)"]["test"], logits[scaled_row]["test"]  # (N, M, C) member logits
    assert torch.allclose(scaled_test, hydra_test / scaled["temperature"], atol=1e-5)
    # OBA: as many weights removed as a third of the heads hold, still zero after its fine-tuning
    assert re.fullmatch(r"4 \(\d\d\.\d % of weights\)", saved["per_seed"]["0"]["OBA"]["heads"])
    assert suite.OBA_NOTE in table and ["Hydra (Circ)", "OBA"] in [d["rows"] for d in saved["differences"]["pairs"]]
    oba = linear_parameters(load_predictor(seed_cache / "models" / f"oba{suite.OBA_STEPS}"))
    zeros, removed = sum(int((weight == 0).sum()) for weight in oba.values()), 3 * (3 * (8 * 32 + 8) + 8 * 32)
    # the removed q, k, v rows and o columns, and at most the key biases (3 x 32, zero at init; softmax makes their
    # gradient 0 in exact arithmetic): training leaves no other weight at exactly 0
    assert f"oba{suite.OBA_STEPS}" in trained and removed <= zeros <= removed + 3 * 32
    # a second run trains nothing: every model and result comes from the cache
    monkeypatch.setattr(suite, "finetune", lambda *a, **k: pytest.fail("retrained a cached model"))
    again = runner.run(tiny_task, suite.TABLE, [0], tmp_path / "out2", tmp_path / "cache", progress=False, rows=rows)
    assert again["rows"]["Single"]["id.acc"] == summary["rows"]["Single"]["id.acc"]


def test_mc_dropout_samples_a_model_trained_with_dropout_when_the_single_model_has_none(tiny_task, tmp_path):
    task = replace(tiny_task, dropout_model=lambda seed: MODELS["bert"](seed=seed))
    rows = ["Single", "MC Dropout"]
    runner.run(task, suite.TABLE, [0], tmp_path / "out", tmp_path / "cache", progress=False, rows=rows)
    trained = json.loads((next((tmp_path / "cache").iterdir()) / "seed0" / suite.TRAINING).read_text())
    assert set(trained) == {"single", "single-dropout0"}


def test_an_interrupted_seed_resumes_at_the_missing_rows(tiny_task, tmp_path):
    built = []

    def table(dies_at=None):  # the suite's rows, each saying when it is built; one may be killed
        def row(name, build):
            def logged(pieces):
                if name == dies_at:
                    raise KeyboardInterrupt("killed")
                return built.append(name) or build(pieces)

            return logged

        return replace(suite.TABLE, rows=runner.fixed({name: row(name, build) for name, build in suite.BUILDS.items()}))

    with pytest.raises(KeyboardInterrupt):
        runner.run_seed(tiny_task, table(dies_at="Taylor"), 0, tmp_path / "seed0", progress=False)
    done = json.loads((tmp_path / "seed0" / "results.json").read_text())
    assert set(done) == set(suite.ROWS[: suite.ROWS.index("Taylor")])
    built.clear()
    results = runner.run_seed(tiny_task, table(), 0, tmp_path / "seed0", progress=False)
    assert built == list(suite.ROWS[suite.ROWS.index("Taylor") :]) and list(results) == list(suite.ROWS)


def test_the_cache_key_changes_with_any_setting_or_split(tiny_task):
    key = tiny_task.fingerprint()
    assert key == replace(tiny_task).fingerprint()  # deterministic
    assert key != replace(tiny_task, recipe=tiny_task.recipe.with_(lr=2e-3)).fingerprint()
    assert key != replace(tiny_task, prune_per_layer=2).fingerprint()
    assert key != replace(tiny_task, test=tiny_task.test[:1]).fingerprint()
    assert key != replace(tiny_task, recipe=tiny_task.recipe.with_(precision="bf16")).fingerprint()
    assert key != replace(tiny_task, circuit_precision="bf16").fingerprint()
    # settings added later key only when set: a model cached before they existed keeps its key
    assert "precision" not in repr(tiny_task.recipe) and "circuit_precision" not in tiny_task.settings()


def test_head_sweep_measures_each_budget_zero_shot_and_fine_tuned(tiny_task, tmp_path):
    task = replace(tiny_task, circuit_pool=6)  # the circuit must rank 2 heads x 3 layers
    summary = suite.head_sweep(task, [0], [1, 2], tmp_path / "out", tmp_path / "cache", progress=False)
    rows = summary["rows"]
    assert list(rows)[0] == "Single" and len(rows) == 1 + 2 * 2 * 2  # budgets x methods x (zero-shot, tuned)
    for method in ("Taylor", "CircAvg"):
        zero, tuned = (rows[f"{method}, 2 pruned/layer, {stage}"] for stage in ("zero-shot", "fine-tuned"))
        assert zero["params"]["mean"] == tuned["params"]["mean"] < rows["Single"]["params"]["mean"]
        assert rows[f"{method}, 1 pruned/layer, zero-shot"]["params"]["mean"] > zero["params"]["mean"]
    assert (tmp_path / "out" / "head_sweep.png").stat().st_size > 5000
    assert "| CircAvg, 2 pruned/layer, fine-tuned |" in (tmp_path / "out" / "sweep.md").read_text()
    saved = tmp_path / "cache" / f"{task.name}-{task.fingerprint()}" / "seed0" / "sweep-logits"
    assert sorted(p.name for p in saved.iterdir() if p.is_dir()) == []  # one file per row, "/" or not
    assert (saved / "CircAvg, 2 pruned per layer, fine-tuned.pt").is_file()
    with pytest.raises(ValueError, match="use budgets up to 2"):
        suite.head_sweep(task, [0], [3], tmp_path / "out", tmp_path / "cache", progress=False)


def test_a_table_rendered_from_records_says_where_its_rows_were_measured():
    per_seed = {
        0: {"Single": {"_measured": {"machine": "AMD"}}, "Taylor": {}},  # Taylor recorded before rows kept machines
        1: {"Single": {"_measured": {"machine": "Intel"}}, "Taylor": {"_measured": {"machine": "Intel"}}},
    }
    machines = runner.measured_on(per_seed)
    assert machines == {"AMD": 1, "not recorded": 1, "Intel": 2}
    assert suite.measured_on_lines({"machine": "Intel", "measured_on": machines}) == [
        "Rows (seed, row) measured on: AMD (1); Intel (2); not recorded (1)  "  # in table.json's (sorted) order
    ]
    only_here = {"machine": "Intel", "measured_on": runner.measured_on({1: per_seed[1]})}
    assert suite.measured_on_lines(only_here) == []  # every row measured where the table is rendered: said once


def test_hydra_rows_record_their_members_overlap_and_the_table_lists_it(tiny_task, tmp_path):
    rows = ["Single", "Hydra (Taylor)", "Hydra (Circ)"]
    summary = runner.run(tiny_task, suite.TABLE, [0], tmp_path / "out", tmp_path / "cache", progress=False, rows=rows)
    results, table = summary["per_seed"][0], (tmp_path / "out" / "table.md").read_text()
    block = table.split("Members of each Hydra row (mean over seeds)")[1]
    for row in rows[1:]:
        overlap = head_map_overlap(results[row]["head_maps"], HEADS).mean
        assert results[row]["overlap"] == overlap and 0 <= overlap < 1  # distinct members
        disagreement, mi = (summary["rows"][row][k]["mean"] for k in ("id.disagreement", "id.mi"))
        assert f"| {row} | {overlap:.2f} | {100 * disagreement:.1f} % | {mi:.4f} |" in block
    assert "overlap" not in results["Single"] and "| Single |" not in block
    for result in results.values():  # records made before rows recorded their overlap: the table as it was
        result.pop("overlap", None)
    assert "Members of each Hydra row" not in suite.markdown(summary)
    results["Hydra (Circ)"]["overlap"] = 0.25  # on one seed of two
    summary["per_seed"][1] = {row: results[row] | {"overlap": 0.5} for row in ("Single", "Hydra (Taylor)")}
    lines = suite.members_lines(summary)
    assert any(line.startswith("| Hydra (Circ) | 0.25 |") for line in lines)  # seed 1 did not run it
    assert any(line.startswith("| Hydra (Taylor) | 0.50 (1 of 2 seeds) |") for line in lines)

    # latency timed on two seeds' models (--latency-seeds 0 1), here on two machines: each said, and the mix
    when = {"date": "2026-11-28", "machine": "AMD", "device": "cpu"}
    summary |= {"latency_per_seed": {0: {}, 1: {}}, "latency_batch": 32}
    summary["latency_timed"] = {0: when, 1: when | {"machine": "Intel"}}
    said = "Latency: batch of 32, each seed's models timed on its own (seed 0 2026-11-28 on AMD; seed 1 2026-11-28 on"
    assert said + " Intel), so its spread over seeds holds the machines' difference too" in suite.markdown(summary)
    summary |= {"latency_per_seed": {1: {}}, "latency_timed": when}  # one seed's: when and where, once
    assert "Latency: batch of 32, timed 2026-11-28 on AMD  " in suite.markdown(summary)


def test_the_table_says_which_differences_the_bootstrap_separates(tiny_task, tmp_path):
    rows = ["Single", "Hydra (Taylor)", "Hydra (Circ)"]  # Deep Ensembles not run: its pairs are left out
    summary = runner.run(tiny_task, suite.TABLE, [0], tmp_path / "out", tmp_path / "cache", progress=False, rows=rows)
    said, table = summary["differences"], (tmp_path / "out" / "table.md").read_text()
    assert [pair["rows"] for pair in said["pairs"]] == [
        ["Hydra (Circ)", "Single"],
        ["Hydra (Taylor)", "Single"],
        ["Hydra (Circ)", "Hydra (Taylor)"],  # the paper's two importances against each other
    ]
    logits = next((tmp_path / "cache").iterdir()) / "seed0" / "logits"
    circ, single = (torch.load(row_file(logits, row)) for row in ("Hydra (Circ)", "Single"))
    expected = paired_bootstrap([circ], [single], labels_of(tiny_task.test), resamples=said["resamples"])
    assert said["pairs"][0] | {"rows": None} == {"rows": None} | {m: i._asdict() for m, i in expected.items()}
    table_rows = summary["rows"]
    for metric, key in (("nll", "id.nll"), ("ece", "id.ece"), ("auroc_all", "all.auroc")):  # the table's numbers
        difference = table_rows["Hydra (Circ)"][key]["mean"] - table_rows["Single"][key]["mean"]
        assert said["pairs"][0][metric]["point"] == pytest.approx(difference, abs=1e-6)
    block = "\n".join(["", *difference_lines(said), ""])
    assert block + "\nPer OOD set" in table and "(one seed: test examples resampled only, so retraining" in block
    assert re.search(r"^- Hydra \(Circ\) vs Single: NLL .*, (better|worse|not separated); ECE .* %, ", table, re.M)
    saved = json.loads((tmp_path / "out" / "table.json").read_text())
    assert saved["differences"] == said  # what the markdown reads comes back from the results file as it was
    del summary["differences"]  # records kept without logits: the table as it was before
    assert suite.markdown(summary) == table.replace(block, "")

    # how long each model trained, by the name every seed shares
    recorded = json.loads((logits.parent / "training.json").read_text())
    single = recorded["single"]
    kept = next(epoch for epoch in single["epochs"] if epoch["epoch"] == single["kept_epoch"])
    assert summary["training"]["0"]["single"] == {
        "epochs": len(single["epochs"]),
        "kept": single["kept_epoch"],
        "val_nll": kept["val_nll"],
    }
    members = {name.rsplit("-", 1)[0] for name in recorded if name.startswith("hydra-circ")}  # without the digest
    assert members and members <= set(summary["training"]["0"])
    assert f"| single | {len(single['epochs'])} / {single['kept_epoch']}, {kept['val_nll']:.3f} |" in table
    names = ("start1-2", "hydra-circ0-1d5aeb22", "hydra-circ-fused-976dd26f-trunk1", "single-dropout2")
    rebuilt = ("hydra-taylor0-cf8d997e, rebuilt", "start2-1, rebuilt 2")
    assert [suite._model_kind(n) for n in (*names, *rebuilt)] == [
        "start-2",
        "hydra-circ0",
        "hydra-circ-fused-trunk1",
        "single-dropout",  # one MC-Dropout line for every seed, not one a seed
        "hydra-taylor0, rebuilt",  # beside its seed's first build, not a line of its own digest
        "start-1, rebuilt 2",  # seed 2's member 1
    ]

    # each ensemble beside its members alone: the ensemble's is the table's AUROC; a member's, its own logits'
    members = summary["member_ood"]["Hydra (Circ)"]
    assert list(summary["member_ood"]) == ["Hydra (Taylor)", "Hydra (Circ)"]  # Single has one member: not listed
    assert members["ensemble"] == [pytest.approx(table_rows["Hydra (Circ)"]["all.auroc"]["mean"], abs=1e-9)]
    labels = labels_of(tiny_task.test)
    alone = [
        evaluate(
            circ["test"][:, m : m + 1],
            labels,
            *({k: x[:, m : m + 1] for k, x in circ[g].items()} for g in ("near", "far")),
        )
        for m in range(circ["test"].shape[1])
    ]
    assert members["members"] == [[pytest.approx(result["all"]["auroc"], abs=1e-9) for result in alone]]
    assert len({round(value, 9) for value in members["members"][0]}) > 1  # the members differ: a slice per member
    mean = 100 * sum(members["members"][0]) / len(alone)
    assert f"| Hydra (Circ) | {100 * members['ensemble'][0]:.1f} | {mean:.1f} |" in table


def test_a_fused_then_fine_tuned_ensemble_cached_for_other_members_is_refused(tiny_task, tmp_path, monkeypatch):
    """Its cache name digests member 0's head map alone: members 1.. drawn anew (another circuit or pool) loaded the
    old ensemble, and its weights digest matched, being its own."""
    seed_cache = runner.seed_dir(tmp_path / "cache", tiny_task, 0)
    row = "Hydra (Circ), fused then fine-tuned"
    first = suite.BUILDS[row](suite.Pieces(runner.SeedRun(tiny_task, 0, seed_cache, progress=False)))
    drawn = suite.sample_members

    def reordered(*args, **kwargs):  # member 0 as before, the others in another order
        maps = drawn(*args, **kwargs)
        return [maps[0], *reversed(maps[1:])]

    monkeypatch.setattr(suite, "sample_members", reordered)
    assert len(first.predictor.head_maps) > 2 and first.predictor.head_maps[1] != first.predictor.head_maps[2]
    with pytest.raises(RuntimeError, match="other members' head maps than this run draws.*delete that folder"):
        suite.BUILDS[row](suite.Pieces(runner.SeedRun(tiny_task, 0, seed_cache, progress=False)))
