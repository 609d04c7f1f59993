"""Records: a benchmark goes on from a fresh machine with the cache's small files and none of its weights."""

import json
import os
import shlex
import shutil
import signal
import time
import warnings
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from conftest import MODELS
from test_suite import tiny_task  # noqa: F401 (the fixture)

from hydra_ensembles.bench import records, runner, suite
from hydra_ensembles.cli import bench, build_parser
from hydra_ensembles.cli.common import CommandError
from hydra_ensembles.evaluation import compare, paired_bootstrap
from hydra_ensembles.io import weights_digest, write_json_atomic
from hydra_ensembles.outputs import labels_of


def one_seed(task, out, cache, rows, **options) -> dict:
    """The suite's `rows` of `task` for seed 0, quietly: how every test here runs the benchmark."""
    return runner.run(task, suite.TABLE, [0], out, cache, progress=False, rows=rows, **options)


def test_only_records_are_copied_and_the_target_keeps_its_own_unless_told(tmp_path):
    source, target = tmp_path / "cache", tmp_path / "records"
    files = {
        "seed0/results.json": '{"Single": "new"}',
        "seed0/logits/Single.pt": "logits",
        "seed0/circuit_avg_state.json": '{"model": "a", "removed": [[0, 1]]}',  # a search in progress
        "seed0/amp-v2/neuron_scores_entropy.pt": "scores",
        "seed0/models/single/model.safetensors": "weights",
        "seed0/amp-v2/models/adaptive-entropy-dE0.01/search.json": "beside weights",
        "seed0/checkpoints/start0/last.pt": "weights",
        "seed0/distill/deep-ensembles-k1/T1/KD/model.safetensors": "a distilled student",
        "seed0/.results.json.x1.tmp": "half written",
    }
    for name, text in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(text)
    (target / "seed0").mkdir(parents=True)
    (target / "seed0" / "results.json").write_text('{"Single": "old"}')

    kept = records.copy_records(source, target, overwrite=False)
    expected = {"seed0/logits/Single.pt", "seed0/circuit_avg_state.json", "seed0/amp-v2/neuron_scores_entropy.pt"}
    assert {str(p) for p in kept} == expected
    assert (target / "seed0" / "results.json").read_text() == '{"Single": "old"}'  # the target's own file wins
    assert not (target / "seed0" / "models").exists() and not (target / "seed0" / "checkpoints").exists()
    assert not list(target.rglob(".*"))  # no temporary file copied or left behind

    replaced = records.copy_records(source, target, overwrite=True)
    assert [str(p) for p in replaced] == ["seed0/results.json"]  # the others are identical: not copied again
    assert (target / "seed0" / "results.json").read_text() == '{"Single": "new"}'
    assert records.copy_records(tmp_path / "missing", target, overwrite=True) == []


def test_rows_finished_on_either_side_are_kept(tmp_path):
    """results.json holds one key per finished row: copying merges, and the side that wins decides only the rows
    both sides hold."""
    cache, kept = tmp_path / "cache" / "results.json", tmp_path / "records" / "results.json"
    for path, rows in ((cache, {"Single": 1, "Taylor": 2}), (kept, {"Single": 0, "CircAvg": 3})):
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(rows))
    records.copy_records(tmp_path / "records", tmp_path / "cache", overwrite=False)  # into the cache: it wins
    assert json.loads(cache.read_text()) == {"Single": 1, "Taylor": 2, "CircAvg": 3}
    kept.write_text(json.dumps({"Single": 0, "CircAvg": 3, "LoRA Ens.": 4}))
    records.copy_records(tmp_path / "cache", tmp_path / "records", overwrite=True)  # back: the cache wins
    assert json.loads(kept.read_text()) == {"Single": 1, "Taylor": 2, "CircAvg": 3, "LoRA Ens.": 4}
    assert records.copy_records(tmp_path / "cache", tmp_path / "records", overwrite=True) == []  # nothing new

    # a search in progress: the state further on wins whichever side it is on, if it is the same model's
    ahead, behind = {"model": "a", "removed": [[0, 1], [1, 0]]}, {"model": "a", "removed": [[0, 1]]}
    for side, data in ((cache, behind), (kept, ahead)):
        (side.parent / "circuit_avg_state.json").write_text(json.dumps(data))
    records.copy_records(tmp_path / "records", tmp_path / "cache", overwrite=False)
    assert json.loads((cache.parent / "circuit_avg_state.json").read_text()) == ahead
    (kept.parent / "circuit_avg_state.json").write_text(json.dumps(behind | {"model": "b"}))  # another model's
    records.copy_records(tmp_path / "cache", tmp_path / "records", overwrite=True)
    assert json.loads((kept.parent / "circuit_avg_state.json").read_text()) == ahead  # the winner: the cache's


def test_timed_runs_of_both_sides_are_kept_and_other_settings_are_refused(tmp_path):
    """latency.json holds one run per table timed ({"runs": [...]}): both sides' keys are equal, so a merge by
    keys kept the winner's file whole and lost the other side's runs (timing them again needs every row's model,
    which a fresh machine trains again). AMP's settings.json decides which rows may share a table: two different
    ones are refused, not merged."""
    cache, kept = tmp_path / "cache" / "latency.json", tmp_path / "records" / "latency.json"
    suite_run, curve_run = {"rows": {"Single": 1.0}, "timed": {"a": 1}}, {"rows": {"OBA": 2.0}, "timed": {"b": 2}}
    for path, run in ((cache, suite_run), (kept, curve_run)):
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"runs": [run]}))
    records.copy_records(tmp_path / "records", tmp_path / "cache", overwrite=False)
    assert json.loads(cache.read_text())["runs"] == [curve_run, suite_run]  # the winner's last: read first
    records.copy_records(tmp_path / "cache", tmp_path / "records", overwrite=True)
    assert json.loads(kept.read_text())["runs"] == [curve_run, suite_run]

    for path, epochs in ((cache, 10), (kept, 3)):
        path.with_name("settings.json").write_text(json.dumps({"recovery": {"epochs": epochs}}))
        path.with_name("results.json").write_text(json.dumps({f"Uniform, {epochs} epochs": 1}))
    for source, target in (("records", "cache"), ("cache", "records")):
        with pytest.raises(ValueError, match=r"record other settings \(recovery: .*\).*its own cache \(--cache"):
            records.copy_records(tmp_path / source, tmp_path / target, overwrite=target == "records")
    assert json.loads(cache.with_name("results.json").read_text()) == {"Uniform, 10 epochs": 1}  # nothing merged
    assert json.loads(kept.with_name("results.json").read_text()) == {"Uniform, 3 epochs": 1}


def test_a_record_that_does_not_parse_is_refused_not_merged_around(tmp_path):
    """A results.json cut short or left with a merge's conflict markers would lose the other side's rows."""
    cache, kept = tmp_path / "cache" / "results.json", tmp_path / "records" / "results.json"
    for path, text in ((cache, json.dumps({"Single": 1})), (kept, '<<<<<<< HEAD\n{"CircAvg": 3}\n=======\n')):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    for source, target, overwrite in (("records", "cache", False), ("cache", "records", True)):
        with pytest.raises(ValueError, match=f"the record {kept} is not valid JSON"):
            records.copy_records(tmp_path / source, tmp_path / target, overwrite=overwrite)
    assert json.loads(cache.read_text()) == {"Single": 1} and kept.read_text().startswith("<<<<<<<")  # untouched
    with pytest.raises(ValueError, match=f"the record {kept} is not valid JSON"):
        records.read_json_record(kept)
    kept.write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a list, not a JSON object"):
        records.read_json_record(kept)


def test_a_latency_is_served_only_to_the_rows_device_and_batch_it_was_timed_with(tmp_path):
    path, times, rows = tmp_path / "latency.json", [], ["Single", "A"]

    def stats(value: float) -> dict:
        return dict.fromkeys(("median", "min", "max"), value)

    def time_now(order, value):
        def timed():
            times.append(value)
            return {row: stats(1.0 if i == 0 else value) for i, row in enumerate(order)}

        return timed

    def latency_of(row, order, value, conditions) -> float:
        return records.recorded_latency(path, order, time_now(order, value), conditions)[0][row]["median"]

    cpu32, gpu, batch4 = ({"device": d, "batch": b} for d, b in (("cpu", 32), ("cuda: NVIDIA H100", 32), ("cpu", 4)))
    latency, timed = records.recorded_latency(path, rows, time_now(rows, 2.0), cpu32)
    assert latency["A"]["median"] == 2.0 and timed["device"] == "cpu" and timed["batch"] == 32
    assert latency_of("A", rows, 9.0, cpu32) == 2.0  # read back
    assert latency_of("A", rows, 1.1, gpu) == 1.1  # another device: timed again
    assert latency_of("A", rows, 3.0, batch4) == 3.0  # another batch: timed again
    assert latency_of("Single", ["A", "Single"], 0.5, cpu32) == 0.5  # ratios to another row are not Single's
    assert times == [2.0, 1.1, 3.0, 0.5]
    kept = json.loads(path.read_text())["runs"]  # each condition keeps its own run, each reference its own
    assert [(run["timed"]["device"], run["timed"]["batch"]) for run in kept] == [
        ("cpu", 32),
        ("cuda: NVIDIA H100", 32),
        ("cpu", 4),
        ("cpu", 32),
    ]
    # a run recorded before conditions were kept: timed on a CPU, at a batch not recorded
    path.write_text(json.dumps({"runs": [{"rows": {"Single": stats(1.0), "A": stats(7.0)}, "timed": {}}]}))
    assert latency_of("A", rows, 9.0, cpu32) == 7.0
    assert latency_of("A", rows, 1.2, gpu) == 1.2


def test_two_records_of_one_model_built_differently_merge_as_a_rebuild(tmp_path):
    """Rows measured on two builds of a model (one machine ran without the other's records) are merged, and the
    digests say so, as a rebuild on one machine does: the table's note names the model."""
    cache, kept = tmp_path / "cache" / records.DIGESTS, tmp_path / "records" / records.DIGESTS
    for path, digests in ((cache, {"single": "b", "lora": "l"}), (kept, {"single": "a", "taylor": "t"})):
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(digests))
    with pytest.warns(UserWarning, match="different weights for single"):
        records.copy_records(tmp_path / "records", tmp_path / "cache", overwrite=False)
    assert json.loads(cache.read_text()) == {"single": "b", "single, rebuilt": "a", "lora": "l", "taylor": "t"}
    assert records.rebuilt_differently(cache.parent) == ["single"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same digests again: nothing new to say
        records.copy_records(tmp_path / "cache", tmp_path / "records", overwrite=True)
    assert json.loads(kept.read_text()) == json.loads(cache.read_text())


def test_a_model_built_or_loaded_is_checked_against_its_recorded_digest(tmp_path):
    model = MODELS["bert"](seed=0)
    assert records.check_digest(tmp_path, "single", model)  # nothing recorded: records it
    assert records.check_digest(tmp_path, "single", MODELS["bert"](seed=0))  # the same weights built again
    first = weights_digest(model)
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1e-6
    with pytest.warns(UserWarning, match="the weights of single differ from the digest recorded"):
        assert not records.check_digest(tmp_path, "single", model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same rebuild loaded again: recorded, not said again
        assert not records.check_digest(tmp_path, "single", model)
    digests = json.loads((tmp_path / records.DIGESTS).read_text())
    assert digests["single"] == first and digests["single, rebuilt"] == weights_digest(model)  # the first is kept
    assert records.rebuilt_differently(tmp_path) == ["single"]


def test_a_search_in_progress_for_other_weights_starts_over(tmp_path):
    model, state = MODELS["bert"](seed=0), tmp_path / "circuit_avg_state.json"
    state.write_text(json.dumps({"model": weights_digest(model), "removed": [[0, 1]]}))
    records.discard_stale_state(state, model)
    assert state.exists()  # the same weights: resumed
    state.write_text(json.dumps({"model": "0123456789abcdef", "removed": [[0, 1]]}))
    with pytest.warns(UserWarning, match="written for other model weights"):
        records.discard_stale_state(state, model)
    assert not state.exists() and (tmp_path / ".circuit_avg_state.json.stale").exists()


def test_latency_is_read_back_only_when_every_row_was_timed_together(tmp_path):
    path, timings, cpu = tmp_path / "latency.json", [], {"device": "cpu", "batch": 8}

    def time_rows(rows):
        timings.append(rows)
        return {row: dict.fromkeys(("median", "min", "max"), float(i + 1)) for i, row in enumerate(rows)}

    def latency(rows):
        return records.recorded_latency(path, rows, lambda: time_rows(rows), cpu)

    rows = ["Single", "Taylor", "CircAvg"]
    first, timed = latency(rows)
    again, timed_again = latency(rows[:2])
    assert again == {row: first[row] for row in rows[:2]} and again["Taylor"]["median"] == 2.0
    assert timed_again == timed and len(timings) == 1 and set(timed) == {"machine", "date", "device", "batch"}
    more = [*rows, "Hydra (Circ)"]
    assert latency(more)[0]["Hydra (Circ)"]["median"] == 4.0
    assert len(timings) == 2  # a row not timed before: every row timed again, together
    review = ["Single", "CircAcc"]  # another table of the seed (the reviewers' rows): its own run, kept beside
    latency(review)
    assert latency(more)[0]["Hydra (Circ)"]["median"] == 4.0
    assert len(timings) == 3 and len(json.loads(path.read_text())["runs"]) == 2


def test_a_benchmark_goes_on_from_its_records_on_a_fresh_machine(tiny_task, tmp_path, monkeypatch):  # noqa: F811
    key = runner.task_key(tiny_task)
    first_rows = ["Single", "Taylor", "CircAvg"]
    before = one_seed(tiny_task, tmp_path / "out", tmp_path / "cache-a", first_rows)
    records.copy_records(tmp_path / "cache-a" / key, tmp_path / "records" / key, overwrite=True)
    assert not list((tmp_path / "records").rglob("*.safetensors"))  # no weights among the records

    # a fresh machine: the records only; finished rows, Taylor scores and the circuit are not made again
    fresh = tmp_path / "cache-b" / key
    records.copy_records(tmp_path / "records" / key, fresh, overwrite=False)
    monkeypatch.setattr(suite, "extract_circuit", lambda *a, **k: pytest.fail("searched a recorded circuit again"))
    monkeypatch.setattr(suite, "taylor_head_scores", lambda *a, **k: pytest.fail("scored recorded heads again"))
    rows = [*first_rows, "Hydra (Circ)"]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="the weights of")  # the single trained again equals the recorded
        after = one_seed(tiny_task, tmp_path / "out-b", tmp_path / "cache-b", rows)
    for row in first_rows:  # read back, not measured again (the seconds it took are the first run's)
        assert after["per_seed"][0][row] == before["per_seed"][0][row]
    search = after["per_seed"][0]["Hydra (Circ)"]["circuit_search"]
    assert search.startswith("exact — ") and after["circuit_search"] == {"0": search}  # its ties, said
    assert (fresh / "seed0" / "models" / "single").exists()  # trained again for the row that needed it
    digests = [
        json.loads((c / key / "seed0" / records.DIGESTS).read_text()) for c in (tmp_path / "cache-a", fresh.parent)
    ]
    assert digests[0]["single"] == digests[1]["single"]  # checked against the record: the same weights
    assert set(after["latency"]) == set(rows)  # a new row: timed again, together

    # rendering needs no model at all once every row and its latency are recorded
    monkeypatch.setattr(suite.Pieces, "__init__", lambda self, run: pytest.fail("made a seed's pieces to render"))
    empty = tmp_path / "cache-c" / key
    records.copy_records(fresh, empty, overwrite=False)
    rendered = one_seed(tiny_task, tmp_path / "out-c", tmp_path / "cache-c", rows)
    assert rendered["latency"] == after["latency"] and rendered["rows"] == after["rows"]
    assert "timed " in (tmp_path / "out-c" / "table.md").read_text()


def test_the_head_sweep_goes_on_from_its_records(tiny_task, tmp_path, monkeypatch):  # noqa: F811
    key = runner.task_key(tiny_task)
    before = suite.head_sweep(tiny_task, [0], [1], tmp_path / "out", tmp_path / "cache-a", progress=False)
    records.copy_records(tmp_path / "cache-a" / key, tmp_path / "cache-b" / key, overwrite=False)
    monkeypatch.setattr(suite.Pieces, "single", lambda self: pytest.fail("built the single model"))
    after = suite.head_sweep(tiny_task, [0], [1], tmp_path / "out-b", tmp_path / "cache-b", progress=False)
    assert after["per_seed"] == before["per_seed"] and after["notes"] == []
    # a single model built again differently (e.g. on another machine): the sweep's table says so, as the suite's
    digests = tmp_path / "cache-b" / key / "seed0" / records.DIGESTS
    digests.write_text(json.dumps(json.loads(digests.read_text()) | {"single, rebuilt": "0" * 16}))
    noted = suite.head_sweep(tiny_task, [0], [1], tmp_path / "out-b", tmp_path / "cache-b", progress=False)
    assert noted["notes"] == records.rebuilt_notes(0, tmp_path / "cache-b" / key / "seed0") != []
    assert noted["notes"][0] in (tmp_path / "out-b" / "sweep.md").read_text()


def test_a_running_benchmark_saves_its_records_now_and_then_and_when_stopped(tiny_task, tmp_path, monkeypatch):  # noqa: F811
    key = runner.task_key(tiny_task)
    args = Namespace(records=tmp_path / "records", records_only=False)
    monkeypatch.setattr(bench, "PUSH_MINUTES", 0.1 / 60)
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit):
        with bench._records(args, tmp_path / "cache", tiny_task) as go_on:
            assert go_on
            (tmp_path / "cache" / key / "seed0").mkdir(parents=True)
            (tmp_path / "cache" / key / "seed0" / "results.json").write_text('{"Single": {}}')
            deadline = time.monotonic() + 10
            while not (args.records / key / "seed0" / "results.json").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert (args.records / key / "seed0" / "results.json").exists()  # pushed while running
            monkeypatch.setattr(bench, "PUSH_MINUTES", 60)
            time.sleep(0.5)  # the pusher's short wait ends: from now on it waits an hour
            (tmp_path / "cache" / key / "seed0" / "circuit_avg.json").write_text("{}")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
    assert (args.records / key / "seed0" / "circuit_avg.json").exists()  # pushed on the way out
    assert signal.getsignal(signal.SIGTERM) == handler  # the handler before the run, back


def test_records_only_needs_a_records_folder():
    args = Namespace(records=None, records_only=True)
    with pytest.raises(CommandError, match="--records-only needs --records DIR"):
        with bench._records(args, None, None):
            pass


def test_a_single_model_trained_again_for_rows_recorded_without_digests_is_checked_by_its_metrics(
    tiny_task,  # noqa: F811
    tmp_path,
):
    """Records made before digests existed: the single model trained again is checked by measuring it as the
    recorded Single row; the same metrics record its digest (and restore the row's lost logits), others warn and
    the table says so."""
    key = runner.task_key(tiny_task)
    first = one_seed(tiny_task, tmp_path / "out", tmp_path / "cache", ["Single"], latency_repeats=0)
    first_logits = torch.load(tmp_path / "cache" / key / "seed0" / "logits" / "Single.pt")
    rows = ["Single", "Taylor"]
    cases = ((0.0, tmp_path / "same"), (0.0, tmp_path / "stopped before checking"), (0.01, tmp_path / "tampered"))
    for tamper, cache in cases:
        old = cache / key / "seed0"
        records.copy_records(tmp_path / "cache" / key, cache / key, overwrite=False)
        if cache.name == "stopped before checking":  # the model trained again and saved, not checked yet
            shutil.copytree(tmp_path / "cache" / key / "seed0" / "models", old / "models")
        (old / records.DIGESTS).unlink()  # as records made before digests existed: no digest, no logits
        (old / "logits" / "Single.pt").unlink()
        results = json.loads((old / "results.json").read_text())
        results["Single"]["metrics"]["id"]["nll"] += tamper
        (old / "results.json").write_text(json.dumps(results))
        if tamper:
            with pytest.warns(UserWarning, match=r"measures differently from the recorded row \(id.nll"):
                after = one_seed(tiny_task, tmp_path / "o", cache, rows, latency_repeats=0)
            assert records.rebuilt_differently(old) == ["single"]
            assert any("Seed 0: single trained again" in note for note in after["notes"])
            assert not (old / "logits" / "Single.pt").exists()  # not the recorded row's logits
        else:
            with warnings.catch_warnings():
                warnings.filterwarnings("error", message=".*(measures differently|cannot be checked)")
                after = one_seed(tiny_task, tmp_path / "o", cache, rows, latency_repeats=0)
            assert records.rebuilt_differently(old) == []
            restored = torch.load(old / "logits" / "Single.pt")
            assert torch.equal(restored["test"], first_logits["test"])
        digests = json.loads((old / records.DIGESTS).read_text())
        assert (
            digests["single"]
            == json.loads((tmp_path / "cache" / key / "seed0" / records.DIGESTS).read_text())["single"]
        )
        assert (
            after["per_seed"][0]["Single"]["metrics"]["id"]["nll"]
            == first["per_seed"][0]["Single"]["metrics"]["id"]["nll"] + tamper
        )


@pytest.mark.parametrize("queue", ["queue.sh", "queue-core1.sh"])
def test_every_run_of_the_records_queues_is_a_valid_bench_command(queue):
    """benchmarks/records/queue*.sh list the runs under way: each line must parse, pass the CLI's flag checks (a
    line with `--latency-seeds` on a suite task parsed, then was refused by `bench.run`), and name known rows."""
    script = Path(__file__).parents[2] / "benchmarks" / "records" / queue
    runs = [shlex.split(line) for line in script.read_text().splitlines() if line.startswith("hydra-ens bench ")]
    assert runs, f"no `hydra-ens bench` line in {script}"
    for words in runs:
        args = build_parser().parse_args([word.replace("$R", "benchmarks/records") for word in words[1:]])
        assert args.seeds, words
        bench.check_flags(args)
        if args.task.startswith("distill-"):  # keeps no records: its students are cached, its teachers recorded
            continue
        assert args.records == Path("benchmarks/records"), words
        if args.rows:
            suite.TABLE.ordered_rows(args.rows, suite.BUILDS)  # an unknown row is refused by name


def test_metrics_agree_only_when_every_shared_one_is_within_the_tolerance(tmp_path):
    model = MODELS["bert"](seed=0)
    row = {"metrics": {"id": {"acc": 0.9, "nll": 0.25}, "all": {"auroc": 0.8}}}
    assert records.check_by_metrics(tmp_path, "single", model, row, row)
    close = {"metrics": {"id": {"acc": 0.9, "nll": 0.25 + 1e-8}, "all": {"auroc": 0.8}, "new": {"x": 1.0}}}
    assert records.check_by_metrics(tmp_path, "single", model, row, close)  # a metric only one holds is skipped
    for other in (
        {"metrics": {"id": {"acc": 0.9, "nll": 0.2501}, "all": {"auroc": 0.8}}},
        {"metrics": {"id": {"acc": 0.9, "nll": float("nan")}, "all": {"auroc": 0.8}}},  # NaN agrees with nothing
        {"metrics": {"renamed": {"acc": 0.9}}},  # nothing shared: nothing checked
    ):
        with pytest.warns(UserWarning, match="measures differently"):
            assert not records.check_by_metrics(tmp_path, "single", model, row, other)
    assert records.rebuilt_differently(tmp_path) == ["single"]


def test_the_note_of_a_model_trained_again_says_how_far_its_metrics_moved(tmp_path):
    model = MODELS["bert"](seed=0)
    row = {"metrics": {"id": {"acc": 0.9, "nll": 0.25}, "all": {"auroc": 0.8, "aupr_out": 0.39124}}}
    moved = {"metrics": {"id": {"acc": 0.9, "nll": 0.25}, "all": {"auroc": 0.800002, "aupr_out": 0.391235}}}
    with pytest.warns(UserWarning, match="measures differently"):
        records.check_by_metrics(tmp_path, "single", model, row, moved)
    (note,) = records.rebuilt_notes(0, tmp_path)
    assert "single differs by more than 1e-06 in 2 of 4 metrics, the most in all.aupr_out" in note, note
    assert "0.39124 recorded, 0.391235 now" in note, note
    assert records.is_record(Path("seed0") / records.REBUILT)  # the note outlives the machine


def test_a_single_model_rebuilt_with_other_weights_is_measured_once_and_the_table_says_how_far_apart(
    tiny_task,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """Rows recorded on another kind of machine, whose single model trains to other weights here: the rows built
    now use this build, so it is measured as the Single row once and the note says how far apart the two are."""
    key = runner.task_key(tiny_task)
    one_seed(tiny_task, tmp_path / "out", tmp_path / "cache", ["Single"], latency_repeats=0)
    seed = tmp_path / "elsewhere" / key / "seed0"
    records.copy_records(tmp_path / "cache" / key, tmp_path / "elsewhere" / key, overwrite=False)
    digests = json.loads((seed / records.DIGESTS).read_text())
    (seed / records.DIGESTS).write_text(json.dumps(digests | {"single": "0" * 16}))  # as another machine's build
    results = json.loads((seed / "results.json").read_text())
    results["Single"]["metrics"]["id"]["nll"] += 0.01  # and its row measured a little differently
    (seed / "results.json").write_text(json.dumps(results))
    trained = json.loads((seed / suite.TRAINING).read_text())
    first = trained["single"] | {"kept_epoch": 99}  # and it trained otherwise
    (seed / suite.TRAINING).write_text(json.dumps(trained | {"single": first}))
    recorded_logits = torch.load(compare.row_file(seed / "logits", "Single"))  # and predicted otherwise
    torch.save(recorded_logits | {"test": recorded_logits["test"].flip(0)}, compare.row_file(seed / "logits", "Single"))

    def run():
        rows = ["Single", "Taylor"]
        return one_seed(tiny_task, tmp_path / "o", tmp_path / "elsewhere", rows, latency_repeats=0)

    with pytest.warns(UserWarning, match="differ from the digest recorded"):
        after = run()
    assert records.rebuilt_differently(seed) == ["single"]
    (note,) = records.rebuilt_notes(0, seed)
    assert (
        note in after["notes"] and "the most in id.nll" in note and "single differs by more than 1e-06 in 1 of" in note
    ), note
    acc = 100 * results["Single"]["metrics"]["id"]["acc"]  # the same training here: the same accuracy
    assert f"Its accuracy: {acc:.1f} % recorded, {acc:.1f} % now. Its all-OOD AUROC: " in note, note
    assert note.endswith(" Rows recorded on this build of single (the others are the first build's): Taylor."), note
    assert (seed / "logits" / "Single, trained again.pt").exists()  # beside the recorded row's logits
    monkeypatch.setattr(suite, "DIFFERENCES", (("Taylor", "Single"),))  # Taylor against the build it was made from
    (pair,) = suite.differences(tiny_task, {"rows": ["Single", "Taylor"]}, {0: seed})["differences"]["pairs"]
    assert pair["stand_ins"] == {"0": ["Taylor", records.AGAIN]}
    taylor, again = (torch.load(compare.row_file(seed / "logits", row)) for row in ("Taylor", records.AGAIN))
    expected = paired_bootstrap([taylor], [again], labels_of(tiny_task.test), resamples=2000)
    assert pair["nll"] == expected["nll"]._asdict()
    monkeypatch.setattr(suite, "DIFFERENCES", (("Single", "Taylor"),))  # Single as row A: it stands in too
    (pair,) = suite.differences(tiny_task, {"rows": ["Single", "Taylor"]}, {0: seed})["differences"]["pairs"]
    assert pair["stand_ins"] == {"0": [records.AGAIN, "Taylor"]} and "builds_apart" not in pair
    kept_again = compare.row_file(seed / "logits", records.AGAIN).read_bytes()
    compare.row_file(seed / "logits", records.AGAIN).unlink()  # no logits of the rebuild: the pair says so
    (pair,) = suite.differences(tiny_task, {"rows": ["Single", "Taylor"]}, {0: seed})["differences"]["pairs"]
    assert pair["builds_apart"] == [0] and "stand_ins" not in pair
    compare.row_file(seed / "logits", records.AGAIN).write_bytes(kept_again)
    trained_now = json.loads((seed / suite.TRAINING).read_text())  # the first build's training stays
    assert trained_now["single"] == first and trained_now["single, rebuilt"] == trained["single"]
    assert after["per_seed"][0]["Single"]["metrics"]["id"]["nll"] == results["Single"]["metrics"]["id"]["nll"]
    recorded = json.loads((seed / "results.json").read_text())
    (seed / "results.json").write_text(json.dumps({"Single": recorded["Single"]}))  # Taylor's row built again,
    for pruned in (seed / "models").glob("taylor*"):  # from the single model loaded from the cache
        shutil.rmtree(pruned)
    measured, measure = [], suite.measure  # which is not measured again (rows, or the rebuilt single model)
    for module in (suite, compare):
        monkeypatch.setattr(module, "measure", lambda *a, **k: measured.append(a[0]) or measure(*a, **k))
    with warnings.catch_warnings(record=True) as said:  # the same rebuild again: noted, not warned of again
        warnings.simplefilter("always")
        assert run()["notes"] == after["notes"]
    assert not [w for w in said if "differ from the digest recorded" in str(w.message)]
    assert len(measured) == 1  # the Taylor row only


def test_a_third_build_keeps_the_rows_recorded_on_the_second_named(tmp_path):
    """A seed rebuilt on a second machine type, then on a third: the third's entry replaced the second's, and the
    rows recorded on the second build were said to be the first build's."""
    row = {"metrics": {"id": {"acc": 0.9, "nll": 0.25}, "all": {"auroc": 0.8}}}
    results = tmp_path / records.RESULTS
    write_json_atomic(results, {"Single": row, "Deep Ensembles": row})  # measured on the first build
    records.record_measured_apart(tmp_path, "single", "second", row, row)
    write_json_atomic(results, {"Single": row, "Deep Ensembles": row, "CircAvg": row, "Hydra (Circ)": row})
    records.record_measured_apart(tmp_path, "single", "third", row, row)
    records.record_measured_apart(tmp_path, "single", "third", row, row)  # the same build again: nothing new
    write_json_atomic(results, json.loads(results.read_text()) | {"Hydra (Taylor)": row})
    (tmp_path / records.DIGESTS).write_text(json.dumps({"single": "first", "single, rebuilt": "third"}))
    (note,) = records.rebuilt_notes(2, tmp_path)
    assert note.endswith(
        " Rows recorded on this build of single: Hydra (Taylor). On its earlier rebuild second: CircAvg, "
        "Hydra (Circ). The others are the first build's."
    ), note
    assert [b["digest"] for b in json.loads((tmp_path / records.REBUILT).read_text())["single"]["earlier"]] == [
        "second"
    ]


def test_rows_compare_on_the_build_of_the_single_model_they_were_made_from(tmp_path):
    """Three builds of a seed's single model (first, second, third): each row is said to be made from the build
    cached when it was recorded, and a pair on two builds reads Single's logits of its partner's build where they
    were kept (the first's, and the latest rebuild's, "Single, trained again"); the other pairs name the seed."""
    row = {"metrics": {"id": {"acc": 0.9}}}
    results = tmp_path / records.RESULTS
    write_json_atomic(results, {"Single": row, "Deep Ensembles": row})
    records.record_measured_apart(tmp_path, "single", "second", row, row)
    write_json_atomic(results, json.loads(results.read_text()) | {"CircAvg": row})
    records.record_measured_apart(tmp_path, "single", "third", row, row)
    write_json_atomic(results, json.loads(results.read_text()) | {"Hydra (Taylor)": row, "Hydra (Circ)": row})
    (tmp_path / records.DIGESTS).write_text(json.dumps({"single": "first", "single, rebuilt": "third"}))
    assert records.single_builds(tmp_path) == {
        "Single": "first",
        "Deep Ensembles": "first",
        "CircAvg": "second",
        "Hydra (Taylor)": "third",
        "Hydra (Circ)": "third",
    }
    pairs = [
        ("Hydra (Taylor)", "Single"),
        ("CircAvg", "Single"),
        ("Hydra (Circ)", "Hydra (Taylor)"),
        ("Hydra (Circ)", "Deep Ensembles"),
        ("Deep Ensembles", "Single"),
    ]
    (tmp_path / "logits").mkdir()
    assert records.same_build_stand_ins({0: tmp_path}, pairs) == (
        {},  # no logits of a rebuild kept
        {("Hydra (Taylor)", "Single"): [0], ("CircAvg", "Single"): [0], ("Hydra (Circ)", "Deep Ensembles"): [0]},
    )
    compare.row_file(tmp_path / "logits", records.AGAIN).write_bytes(b"the third build's")
    stand_ins, apart = records.same_build_stand_ins({0: tmp_path, 1: tmp_path}, pairs)
    assert stand_ins == {("Hydra (Taylor)", "Single"): dict.fromkeys((0, 1), ("Hydra (Taylor)", records.AGAIN))}
    assert apart == {("CircAvg", "Single"): [0, 1], ("Hydra (Circ)", "Deep Ensembles"): [0, 1]}
    compare.row_file(tmp_path / "logits", records.build_logits("second")).write_bytes(b"the second build's")
    stand_ins, apart = records.same_build_stand_ins({0: tmp_path}, pairs)
    assert stand_ins[("CircAvg", "Single")] == {0: ("CircAvg", "Single, build second")}
    assert apart == {("Hydra (Circ)", "Deep Ensembles"): [0]}  # the deep ensemble is not a Single row


def test_a_single_model_back_on_its_first_build_after_a_rebuild_is_named_so(tmp_path):
    """Built on machine A, rebuilt on B, then on A again (the first digest): the rows recorded from then on are the
    first build's, compared with the first build's Single; nothing is measured again (the weights are the first's)."""
    model, row = MODELS["bert"](seed=0), {"metrics": {"id": {"acc": 0.9}}}
    results = tmp_path / records.RESULTS
    write_json_atomic(results, {"Single": row, "Deep Ensembles": row})
    (tmp_path / records.DIGESTS).write_text(json.dumps({"single": weights_digest(model), "single, rebuilt": "b"}))
    records.record_measured_apart(tmp_path, "single", "b", row, row)
    (tmp_path / "logits").mkdir()
    for name in ("Single", records.AGAIN):
        compare.row_file(tmp_path / "logits", name).write_bytes(name.encode())
    write_json_atomic(results, json.loads(results.read_text()) | {"CircAvg": row})  # made from build b

    def measure(model, path):
        raise AssertionError("the first build is not measured again")

    records.checked_single(tmp_path, model, measure)
    write_json_atomic(results, json.loads(results.read_text()) | {"Hydra (Circ)": row})  # made from A again
    assert records.single_builds(tmp_path) == {
        "Single": "first",
        "Deep Ensembles": "first",
        "CircAvg": "b",
        "Hydra (Circ)": "first",
    }
    assert records.single_logits(tmp_path) == {"first": "Single", "b": "Single, build b"}
    assert compare.row_file(tmp_path / "logits", "Single, build b").read_bytes() == records.AGAIN.encode()
    pairs = [("CircAvg", "Single"), ("Hydra (Circ)", "Single"), ("Hydra (Circ)", "CircAvg")]
    assert records.same_build_stand_ins({0: tmp_path}, pairs) == (
        {("CircAvg", "Single"): {0: ("CircAvg", "Single, build b")}},
        {("Hydra (Circ)", "CircAvg"): [0]},
    )
    (note,) = records.rebuilt_notes(0, tmp_path)
    assert "single was built again as its first build (the same weights) after a rebuild. Measured as its" in note
    assert note.endswith(
        "this build of single: Hydra (Circ). On its earlier rebuild b: CircAvg. The others are the first build's."
    ), note
    records.checked_single(tmp_path, model, measure)  # loaded again: nothing new
    assert records.single_logits(tmp_path) == {"first": "Single", "b": "Single, build b"}


def test_rows_are_not_told_apart_by_builds_they_do_not_share(tmp_path):
    row = {"metrics": {"id": {"acc": 0.9}}}
    write_json_atomic(tmp_path / records.RESULTS, {"Single": row})
    records.record_measured_apart(tmp_path, "single", "b", row, row)
    write_json_atomic(tmp_path / records.RESULTS, {"Single": row, "Hydra (Circ)": row, "MIMO": row})
    (tmp_path / records.DIGESTS).write_text(json.dumps({"single": "a", "single, rebuilt": "b"}))
    pairs = [("Hydra (Circ)", "MIMO"), ("Hydra (Circ)", "Single")]
    assert records.same_build_stand_ins({0: tmp_path}, pairs, independent=["MIMO"]) == (
        {},
        {("Hydra (Circ)", "Single"): [0]},  # MIMO is trained from scratch: no build of the single model
    )
    (tmp_path / records.REBUILT).unlink()  # a rebuild's digest merged from another record, its entry not
    assert records.single_builds(tmp_path) == {}


def test_a_third_build_keeps_the_second_builds_logits(tmp_path):
    """The third build of a single model is measured into "Single, trained again": the second's logits, there
    before, move to their own name, so the rows made from the second build still compare on it."""
    row = {"metrics": {"id": {"acc": 0.9}}}
    write_json_atomic(tmp_path / records.RESULTS, {"Single": row})
    (tmp_path / records.DIGESTS).write_text(json.dumps({"single": "first", "single, rebuilt": "second"}))
    records.record_measured_apart(tmp_path, "single", "second", row, row)
    (tmp_path / "logits").mkdir()
    compare.row_file(tmp_path / "logits", records.AGAIN).write_bytes(b"the second build's")

    def measure(model, path):
        path.write_bytes(b"the third build's")
        return row

    with pytest.warns(UserWarning, match="differ from the digest recorded"):
        records.checked_single(tmp_path, MODELS["bert"](seed=0), measure)
    assert compare.row_file(tmp_path / "logits", records.AGAIN).read_bytes() == b"the third build's"
    assert compare.row_file(tmp_path / "logits", "Single, build second").read_bytes() == b"the second build's"
    third = weights_digest(MODELS["bert"](seed=0))
    assert records.single_logits(tmp_path) == {"second": "Single, build second", third: records.AGAIN}
    compare.row_file(tmp_path / "logits", "Single").write_bytes(b"the first build's")  # the recorded row's
    assert records.single_logits(tmp_path)[records.FIRST] == "Single"


def test_rows_whose_build_cannot_be_told_are_not_compared_on_one(tmp_path):
    row = {"metrics": {"id": {"acc": 0.9}}}
    write_json_atomic(tmp_path / records.RESULTS, {"Single": row, "CircAvg": row})
    assert records.single_builds(tmp_path) == {}  # no digest recorded: rows recorded before digests existed
    (tmp_path / records.DIGESTS).write_text(json.dumps({"single": "first"}))
    assert records.single_builds(tmp_path) == {"Single": "first", "CircAvg": "first"}  # never rebuilt
    (tmp_path / records.REBUILT).write_text(json.dumps({"single": {"digest": "second", "compared": 1, "apart": 0}}))
    assert records.single_builds(tmp_path) == {}  # an entry from before rows_before was kept
    assert records.same_build_stand_ins({0: tmp_path}, [("CircAvg", "Single")]) == ({}, {})


def test_a_third_build_keeps_the_second_builds_training(tiny_task, tmp_path):  # noqa: F811
    """The third build's training replaced the second's "single, rebuilt" entry, on which rows were recorded."""
    pieces = suite.Pieces(runner.SeedRun(tiny_task, 0, tmp_path, progress=False))
    for kept in (1, 2, 3, 2, 1):  # a build that trains as an earlier one did is that build
        pieces._record_training("single", {"kept_epoch": kept})
    assert json.loads((tmp_path / suite.TRAINING).read_text()) == {
        "single": {"kept_epoch": 1},
        "single, rebuilt": {"kept_epoch": 2},
        "single, rebuilt 2": {"kept_epoch": 3},
    }


def test_the_note_of_a_rebuild_says_when_it_measures_the_same_and_reads_entries_from_before_headlines(tmp_path):
    model = MODELS["bert"](seed=0)
    row = {"metrics": {"id": {"acc": 0.9, "nll": 0.25}, "all": {"auroc": 0.8}}}
    for folder in ("same", "old"):  # the note names the models the digests say were rebuilt
        (tmp_path / folder).mkdir()
        (tmp_path / folder / records.DIGESTS).write_text(json.dumps({"single": "a", "single, rebuilt": "b"}))
    records.record_measured_apart(tmp_path / "same", "single", weights_digest(model), row, row)
    (note,) = records.rebuilt_notes(0, tmp_path / "same")
    agrees = "Measured as its recorded row, single agrees within 1e-06 in all 3 metrics."
    assert note.endswith(f"{agrees} No row was recorded on this build of single."), note
    assert records.has_measured_rebuild(tmp_path / "same", "single", weights_digest(model))
    third = weights_digest(MODELS["bert"](seed=1))  # a third build
    assert not records.has_measured_rebuild(tmp_path / "same", "single", third)
    old = {
        "single": {
            "compared": 3,
            "apart": 1,
            "tolerance": 1e-6,
            "furthest": {"metric": "id.nll", "recorded": 0.25, "now": 0.3},
        }
    }
    (tmp_path / "old" / records.REBUILT).write_text(json.dumps(old))  # written before headlines and digests were
    (note,) = records.rebuilt_notes(0, tmp_path / "old")
    assert note.endswith("the most in id.nll (0.25 recorded, 0.3 now).")
    assert not records.has_measured_rebuild(tmp_path / "old", "single", weights_digest(model))  # measured again
