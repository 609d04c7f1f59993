"""The benchmark's one loop: for each seed, for each row of a `Table`, skip what the seed's records hold, else build,
measure, keep the logits and record (`evaluation.compare`); then aggregate over seeds, time the rows and render.

- A task (`BenchTask`: `tasks.Task`, `zero_shot.ZeroShotTask`) gives `name`, `fingerprint()`, `test`, `near`, `far`,
  `notes`.
- A `Table` declares its rows as data: `rows(pieces)` maps a row name to `build(pieces()) -> compare.Built`, where
  `pieces()` makes, on first call, what `Table.pieces(SeedRun)` returns for the seed: the trained models, scores and
  circuits its rows share. `pieces()` is called only when a row is not recorded yet, so a table renders from its
  records without a model. Most tables' rows do not depend on the seed (`fixed(rows)` never calls `pieces`); AMP's
  are named by the delta-E the seed's cost rule picks, so its pieces are made for every seed (and may build
  models: `run_seed` records the batch layout before the first `pieces()`).
- `SeedRun(task, seed, cache, progress, base, device)`: `cache` is the seed's directory (`seed_dir`:
  `<cache_dir>/<task>-<fingerprint>/seed<k>/`); `base`, if given, builds the model every row starts from instead
  of the task's (e.g. AMP's pruned single model; `cache` is then that base's own directory); `device`: where the
  suite's pieces put the models they train or load (`run(device=...)`; default the CPU).
- Records, in the seed's directory: `Table.record` ({row: metrics, params, flops, the row's `Built.extra`,
  `_seconds`, `_measured` {machine, date}}), member logits in `Table.logits/<row>.pt`, and, in each timed seed's
  (`latency_seeds`, default the first), `latency.json` (`records.recorded_latency`: rows timed interleaved once,
  read back after; `Table.timed(pieces)` names another record and set of models).
- Rendering: `run` builds the summary (`run_record`, the task's notes and those of models rebuilt differently
  (`records.rebuilt_notes`), rows aggregated over seeds, `per_seed`, `measured_on`, latency, times), adds
  `Table.summarize(task, summary, seed_dirs)` (which may replace any of these: AMP's holds several tables),
  the latency over the timed seeds (`latency`; `latency_per_seed` {seed: rows}; `latency_timed`: when and where,
  {seed: that} when several seeds were timed), then `Table.conclude(summary)` (what reads the latency: the cost
  curve's choices by it and its answer), writes `<out>/<Table.output>.json`, `Table.markdown(summary)` as
  `.md`, and calls `Table.figures(task, summary, first seed's dir, out)`. Render again by running again: recorded
  rows are read back in the table's order (the json's keys are sorted).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from ..data.loaders import Batch, batch_size, rebatch
from ..evaluation.compare import Built, Data, compare, machine, time_rows
from ..evaluation.tables import aggregate, latency_over_seeds
from ..io import read_json_record, write_json_atomic, write_text_atomic
from ..version import __version__
from .records import BATCHES, copy_records, rebuilt_notes, recorded_latency

Build = Callable[[Any], Built]
Rows = Callable[[Callable[[], Any]], Mapping[str, Build]]  # (the seed's pieces, made on call) -> {row: build}
Models = Mapping[str, Callable[[], nn.Module]]
CPU = torch.device("cpu")  # where a run's models are unless it names a device


class BenchTask(Protocol):
    """What the runner reads of a task: its name and cache key, its data and the notes its tables carry."""

    name: str
    test: list[Batch]
    near: Mapping[str, list[Batch]]
    far: Mapping[str, list[Batch]]
    notes: list[str]

    def fingerprint(self) -> str: ...


@dataclass
class SeedRun:
    """What a table's `pieces` are built from: one seed of one task, its cache directory, the model the rows
    start from when not the task's (`base`), and the device its models are trained and measured on (the suite's
    pieces move them there; the library's loops move the batches to the model)."""

    task: BenchTask
    seed: int
    cache: Path
    progress: bool = True
    base: Callable[[], nn.Module] | None = None
    device: torch.device = CPU


@dataclass(frozen=True)
class Table:
    """A table's rows as data and how it renders; see the module docstring."""

    rows: Rows
    pieces: Callable[[SeedRun], Any]
    markdown: Callable[[dict], str]
    default: Sequence[str] | None = None  # the rows run when none are named (default: all)
    first: str = "Single"  # every ratio (FLOPs, latency) is relative to it: always run
    output: str = "table"
    record: str = "results.json"
    logits: str = "logits"
    summarize: Callable[[BenchTask, dict, dict[int, Path]], dict] = lambda task, summary, seed_dirs: {}
    figures: Callable[[BenchTask, dict, Path, Path], None] | None = None
    conclude: Callable[[dict], dict] = lambda summary: {}  # added last, once the latency is in the summary
    timed: Callable[[Any], tuple[str, Models]] | None = None  # (latency record, models) of a seed; default: rows
    timed_rows: Rows | None = None  # the rows' builds for timing, when `rows` also measure more than the model
    latency_record: str = "latency.json"  # where a seed's timing is kept: a table of other rows keeps its own
    latency_batch: int | None = None  # examples timed; default: the first test batch

    def ordered_rows(self, rows: Sequence[str] | None, known: Mapping[str, Build]) -> list[str]:
        """`rows` (default: `default`, else all) in the order of the seed's rows `known`, refusing an unknown row
        by name."""
        rows = list(self.default or known) if rows is None else list(rows)
        unknown = [row for row in rows if row not in known]
        if unknown:
            raise ValueError(f"unknown row(s) {unknown}; choose from {list(known)}.")
        if self.first not in rows:
            raise ValueError(f"rows must include {self.first!r}: every cost ratio is relative to it.")
        return [row for row in known if row in rows]


def fixed(rows: Mapping[str, Build]) -> Rows:
    """The rows of a table whose rows are the same for every seed: its pieces are not made to name them."""
    return lambda pieces: rows


def seed_dir(cache_dir: str | os.PathLike, task: BenchTask, seed: int) -> Path:
    """The cache directory of one seed of `task`: keyed by its fingerprint, so a changed recipe starts afresh.
    The fingerprint counts each split's examples, not where its batches are cut (it predates that; adding it
    would orphan every record): the task's directory keeps its batch layout (`BATCHES`, written by
    `record_batches` when a run starts work in it) and refuses another."""
    task_dir = Path(cache_dir) / task_key(task)
    _check_batches(task_dir, task)
    return task_dir / f"seed{seed}"


def task_key(task: BenchTask) -> str:
    """The name of `task`'s folder in a cache or in a records directory: its name and fingerprint."""
    return f"{task.name}-{task.fingerprint()}"


def pull_records(records_dir: str | os.PathLike, cache_dir: str | os.PathLike, task: BenchTask) -> list[Path]:
    """Copy `task`'s records from `records_dir` into the cache `cache_dir`, the cache's own files winning, before a
    run builds anything there: a model built again on a fresh machine is then cut into the records' batches (or
    refused, `record_batches`) and checked against its first build's digest, and recorded rows are not run again.
    Returns the paths written, relative to the task's folder."""
    key = task_key(task)
    return copy_records(Path(records_dir) / key, Path(cache_dir) / key, overwrite=False)


def push_records(cache_dir: str | os.PathLike, records_dir: str | os.PathLike, task: BenchTask) -> list[Path]:
    """Copy `task`'s records from the cache `cache_dir` back to `records_dir`, the cache's files winning (merged
    where both changed: `copy_records`). Returns the paths written, relative to the task's folder."""
    key = task_key(task)
    return copy_records(Path(cache_dir) / key, Path(records_dir) / key, overwrite=True)


def prepared_seed_dir(
    cache_dir: str | os.PathLike, task: BenchTask, seed: int, records: str | os.PathLike | None = None
) -> Path:
    """`seed_dir`, ready for a model to be built in it outside a `run`: the task's records pulled in first when
    `records` is given (`pull_records`), then its batch layout recorded (`record_batches`)."""
    if records is not None:
        pull_records(records, cache_dir, task)
    folder = seed_dir(cache_dir, task, seed)
    record_batches(folder.parent, task)
    return folder


SPLITS = ("train", "val", "test", "circuit_id", "circuit_ood")


def batch_layout(task: BenchTask) -> dict[str, list[int]]:
    """Where `task`'s splits are cut into batches: {split: [examples in the first batch, number of batches]} of
    every split it has (OOD sets as near/NAME, far/NAME). Another training batch size gives other steps and
    another schedule, so other models, under the same fingerprint."""
    splits = {name: getattr(task, name, None) for name in SPLITS}
    for kind in ("near", "far"):
        splits |= {f"{kind}/{name}": batches for name, batches in (getattr(task, kind, None) or {}).items()}
    return {
        name: [batch_size(batches[0]), len(batches)]
        for name, batches in splits.items()
        if isinstance(batches, list) and batches
    }


def record_batches(task_dir: Path, task: BenchTask) -> None:
    """Record `task`'s batch layout in its cache directory `task_dir` before a run's first model is built there
    (a run stopped midway must leave it: its models were trained on this layout); one recorded stays."""
    _check_batches(task_dir, task)
    if not (task_dir / BATCHES).is_file():
        write_json_atomic(task_dir / BATCHES, batch_layout(task))


def _check_batches(task_dir: Path, task: BenchTask) -> None:
    """Refuse a task whose batches are cut otherwise than those its cached models were trained on (the layout
    `record_batches` kept); a directory without that record is not refused (nothing was built by this version)."""
    recorded, layout = read_json_record(task_dir / BATCHES), batch_layout(task)
    if not recorded:
        return
    changed = sorted(name for name in layout.keys() | recorded.keys() if layout.get(name) != recorded.get(name))
    if changed:
        raise ValueError(
            f"{task.name}'s batches are cut otherwise than those its cache {str(task_dir)!r} was built on "
            f"({', '.join(f'{n}: {recorded.get(n)} then, {layout.get(n)} now' for n in changed)}; [first batch, "
            "batches]), under the same fingerprint: its models would be served as if trained so. Change a setting "
            "of the task too (its fingerprint then changes), or delete that directory."
        )


def run(
    task: BenchTask,
    table: Table,
    seeds: Sequence[int],
    out_dir: str | os.PathLike,
    cache_dir: str | os.PathLike,
    *,
    command: str = "",
    rows: Sequence[str] | None = None,
    latency_repeats: int = 7,
    progress: bool = True,
    base: Callable[[], nn.Module] | None = None,
    latency_seeds: Sequence[int] | None = None,
    device: torch.device = CPU,
) -> dict:
    """Run `rows` of `table` for every seed, reusing the cache, and render; returns the summary. Latency relative
    to the first row is timed on the models of `latency_seeds` (default: the first seed), every row interleaved
    with the others over `latency_repeats` rounds on one test batch (0: not timed), and recorded; over several
    seeds, the column is the mean ± std of each seed's median."""
    started, out_dir = time.perf_counter(), Path(out_dir)
    latency_seeds = list(seeds[:1] if latency_seeds is None else latency_seeds)
    if not latency_seeds or not set(latency_seeds) <= set(seeds):
        raise ValueError(f"latency_seeds must be some of the seeds {list(seeds)}, got {latency_seeds}.")
    seed_dirs = {seed: seed_dir(cache_dir, task, seed) for seed in seeds}
    starting = functools.partial(record_batches, seed_dirs[seeds[0]].parent, task)
    per_seed = {
        s: run_seed(task, table, s, folder, rows=rows, progress=progress, base=base, device=device, starting=starting)
        for s, folder in seed_dirs.items()
    }
    summary = run_record(task.name, command, seeds) | {
        "task_fingerprint": task.fingerprint(),
        "notes": [*task.notes, *(n for seed, folder in seed_dirs.items() for n in rebuilt_notes(seed, folder))],
        "ood_sets": [*task.near, *task.far],
        "rows": aggregate(per_seed),
        "per_seed": per_seed,
        "measured_on": measured_on(per_seed),
    }
    summary["compute_s"] = round(sum(r.get("_seconds", 0) for s in per_seed.values() for r in s.values()), 1)
    summary |= table.summarize(task, summary, seed_dirs)
    if latency_repeats:
        batch = rebatch(task.test, table.latency_batch)[0] if table.latency_batch else task.test[0]
        runs = {s: SeedRun(task, s, seed_dirs[s], False, base, device) for s in latency_seeds}
        timed = {s: _latency(table, run, rows, latency_repeats, batch) for s, run in runs.items()}
        summary["latency_per_seed"] = {seed: stats for seed, (stats, _) in timed.items()}
        summary["latency"] = latency_over_seeds(summary["latency_per_seed"])
        at = {seed: when for seed, (_, when) in timed.items()}  # {date, machine}; one seed's alone (the suite's)
        summary["latency_timed"] = at if len(at) > 1 else at[latency_seeds[0]]
        summary["latency_batch"] = batch_size(batch)
    summary |= table.conclude(summary)
    summary["wall_time_s"] = round(time.perf_counter() - started, 1)
    write_json_atomic(out_dir / f"{table.output}.json", summary)
    write_text_atomic(out_dir / f"{table.output}.md", table.markdown(summary))
    if table.figures:
        table.figures(task, summary, seed_dirs[seeds[0]], out_dir)
    return summary


def timings(summary: Mapping[str, Any]) -> dict[int | str, dict]:
    """{seed: when and where it was timed ({date, machine[, device]})} of a summary's latency column, from either
    form `run` stores (one seed's alone, or {seed: that}); a summary written before `latency_per_seed` was
    recorded timed its first seed."""
    timed, when = summary.get("latency_per_seed"), summary["latency_timed"]
    if timed is None:
        return {summary["seeds"][0]: when}
    return dict(when) if len(timed) > 1 else {next(iter(timed)): when}


def timed_on(when: Mapping[str, str]) -> str:
    """The machine a latency was timed on (`timings`' values), and the accelerator when it was not the CPU."""
    device = when.get("device", "cpu")
    return when["machine"] + ("" if device == "cpu" else f", {device}")


def run_seed(
    task: BenchTask,
    table: Table,
    seed: int,
    cache: Path,
    *,
    rows: Sequence[str] | None = None,
    progress: bool = True,
    base: Callable[[], nn.Module] | None = None,
    device: torch.device = CPU,
    starting: Callable[[], None] = lambda: None,
) -> dict[str, dict]:
    """{row: result} of one seed, in the table's order: recorded rows read back, the others built and measured.
    `starting` is called once, before anything is built (`run`: `record_batches`): when the seed's pieces are first
    made (a table's `rows` may make them, as AMP's do) or else once the rows are known good."""
    starting, made = functools.cache(starting), _pieces(table, SeedRun(task, seed, cache, progress, base, device))

    def pieces() -> Any:
        starting()
        return made()

    known = table.rows(pieces)
    builds = {row: (lambda row=row: known[row](pieces())) for row in table.ordered_rows(rows, known)}
    starting()
    cache.mkdir(parents=True, exist_ok=True)
    return compare(builds, Data(task.test, task.near, task.far), cache / table.record, cache / table.logits)


def predictor(
    task: BenchTask,
    table: Table,
    seed: int,
    cache: Path,
    *,
    row: str,
    progress: bool = True,
    base: Callable[[], nn.Module] | None = None,
) -> nn.Module:
    """The predictor of one row for one seed, from (or into) the seed's cache: what other experiments build on
    (e.g. the teachers that distillation compresses). `cache`: the seed's directory (`seed_dir`), whose task
    directory records the batch layout first (`record_batches`)."""
    record_batches(Path(cache).parent, task)
    pieces = _pieces(table, SeedRun(task, seed, cache, progress, base))
    known = table.rows(pieces)
    table.ordered_rows([row, table.first], known)
    cache.mkdir(parents=True, exist_ok=True)
    return known[row](pieces()).predictor


def _pieces(table: Table, run: SeedRun) -> Callable[[], Any]:
    """The seed's pieces, made on first use: a seed whose rows are all recorded loads nothing."""
    return functools.cache(lambda: table.pieces(run))


def _latency(
    table: Table, run: SeedRun, rows: Sequence[str] | None, repeats: int, batch: Batch
) -> tuple[dict[str, dict], dict]:
    """`recorded_latency` of one seed's timed models (`run`): `Table.timed`'s, or its rows' in the table's
    `latency_record`."""
    pieces = _pieces(table, run)
    if table.timed is not None:
        record, models = table.timed(pieces())
    else:
        known = (table.timed_rows or table.rows)(pieces)
        record = table.latency_record
        models = {row: (lambda row=row: known[row](pieces()).predictor) for row in table.ordered_rows(rows, known)}

    def time_now() -> dict[str, dict]:
        predictors = {row: model() for row, model in models.items()}
        return time_rows(predictors, dict.fromkeys(models, batch), repeats, progress=run.progress)

    conditions = {"device": device_name(run.device), "batch": batch_size(batch)}
    return recorded_latency(run.cache / record, list(models), time_now, conditions)


def device_name(device: torch.device) -> str:
    """ "cpu", or the accelerator's type and model ("cuda: NVIDIA H100 80GB HBM3"): what a latency was timed on,
    which `compare.machine` (the host) does not say."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return device.type


def run_record(task: str, command: str, seeds: Sequence[int]) -> dict:
    """What every benchmark table records about its run: the task, the command, the seeds, the machine and the
    library version."""
    return {
        "task": task,
        "command": command,
        "seeds": list(seeds),
        "machine": machine(),
        "library_version": __version__,
    }


def measured_on(per_seed: Mapping[int, Mapping[str, dict]]) -> dict[str, int]:
    """{machine: how many (seed, row) results were measured on it}, sorted: a table rendered from records says
    where its rows ran, not only where it was rendered ("not recorded" for results older than `_measured`)."""
    machines: dict[str, int] = {}
    for results in per_seed.values():
        for result in results.values():
            where = result.get("_measured", {}).get("machine", "not recorded")
            machines[where] = machines.get(where, 0) + 1
    return dict(sorted(machines.items()))
