"""Paper 002's experiments on a benchmark task's fine-tuned single model (the suite's cached Single model of each
seed), and the ensemble-for-free table (issue 13). The tables (`TABLES`):

free       Single and Hydra (Taylor) / Hydra (Circ) on the unpruned base and on the AMP base: the smallest delta-E
           whose fused Hydra costs <= `flops_target` x Single's FLOPs (counted on validation inputs, no labels), on
           the sweep's grid refined by bisection; latency timed interleaved in one run.
sweep      Algorithm 1 at each delta-E with the label-free entropy criterion, before and after recovery (Table 7).
curve      Single and Hydra (Taylor) on the unpruned base and on every base of the sweep: quality against cost
           (no circuit rows: an exact search per base is hours).
criteria   neurons ranked by cross-entropy, prediction entropy or [CLS] similarity entropy (Table 5; the search
           stays on the prediction entropy), each at the delta-E that keeps the free base's MLP neuron count.
baselines  that count at a uniform width: random, L2, Taylor neurons, next to the adaptive result (Tables 3, 6).

Recovery is Eq. 8 (MSE on the last layer's features against the unpruned model, labels unused) on the training
inputs; the pruning set is the first `pruning_examples` training examples. All five are one `bench.runner` table
(`AmpTable`): AMP's own rows recorded in `<seed cache>/<AMP_CACHE>/`, the suite's rows on a base in the base's
directory, so the records alone (`bench.records`) render every table.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..adapters import get_adapter
from ..cost import count_flops, format_latency
from ..evaluation.compare import Built
from ..evaluation.tables import CONVENTIONS, aggregate, render, table_lines
from ..fusion import HydraEnsemble
from ..importance import (
    adaptive_mlp_pruning,
    magnitude_neuron_scores,
    neuron_scores,
    prune_to_sizes,
    random_neuron_scores,
    uniform_sizes,
)
from ..io import read_json_record, torch_save_atomic, write_json_atomic
from ..members import build_members
from ..predictors import load_predictor, save_predictor
from ..pruning import kept_neurons
from ..training import AMP_RECOVERY, TrainConfig, recover
from . import runner, suite
from .records import DIGESTS, check_digest, rebuilt_notes
from .tasks import Task

DELTAS = (0.01, 0.02, 0.03, 0.05, 0.1, 0.2)
CRITERIA = ("entropy", "cross_entropy", "similarity")
BASELINES = ("random", "l2", "taylor")
HYDRA_ROWS = ("Single", "Hydra (Taylor)", "Hydra (Circ)")
CURVE_ROWS = ("Single", "Hydra (Taylor)")
TABLES = (
    ("free", "Ensemble for free: Hydra Ensembles on an AMP base"),
    ("sweep", "delta-E sweep, entropy criterion (Table 7's shape)"),
    ("curve", "Hydra (Taylor) on every AMP base: the ensemble's cost/quality curve"),
    ("criteria", "Criteria at the free base's MLP neuron count (Table 5)"),
    ("baselines", "Uniform width at the same count vs adaptive (Tables 3 and 6)"),
)
TABLE_NAMES = tuple(name for name, _ in TABLES)
# the cache directory in each suite seed's; a new name when what it holds would be built differently (v2: neuron
# importance per sequence, Eq. 4, instead of once over the pruning set; recovery with Table 8's AdamW settings)
AMP_CACHE = "amp-v2"
# tau of the similarity criterion (Eq. 5-7), paper 002's Table 8: 1/20 for DINOv2, 1/15 (the default) otherwise
SIMILARITY_TEMPERATURE = {"image-dinov2": 1 / 20}
LATENCY_BATCH = 32  # the bar of issue 13: latency on the CPU at batch 32
REFINE_STEPS = 3  # bisection steps of the cost rule between two grid delta-Es
FREE_NAMES = {"Single": "AMP single", "Hydra (Taylor)": "Hydra (Taylor) on AMP", "Hydra (Circ)": "Hydra (Circ) on AMP"}


class AmpSeed:
    """The pruned and recovered models of one seed, each built once (only when a result needs it) and cached."""

    def __init__(
        self,
        task: Task,
        seed: int,
        seed_cache: Path,
        recovery: TrainConfig = AMP_RECOVERY,
        pruning_examples: int = 256,
        progress: bool = True,
    ):
        self.task, self.seed, self.progress, self.recovery = task, seed, progress, recovery
        self.seed_cache, self.cache = seed_cache, seed_cache / AMP_CACHE
        self.pruning = _first_examples(task.train, pruning_examples)
        self.probe = {k: v[:8] for k, v in task.val[0].items() if k != "labels"}  # the cost rule's FLOPs inputs
        self.suite = suite.Pieces(runner.SeedRun(task, seed, seed_cache, progress))
        _check_settings(
            self.cache / "settings.json", {"recovery": recovery.key(), "pruning_examples": pruning_examples}
        )

    @functools.cached_property
    def single(self) -> nn.Module:
        return self.suite.single()

    def scores(self, criterion: str) -> list[Tensor]:
        """Neuron importance of the single model under `criterion` ("random", "l2" or a Taylor loss)."""
        path = self.cache / f"neuron_scores_{criterion}.pt"
        if not path.exists():
            if criterion == "random":
                scores = random_neuron_scores(self.single, seed=self.seed)
            elif criterion == "l2":
                scores = magnitude_neuron_scores(self.single)
            else:
                temperature = SIMILARITY_TEMPERATURE.get(self.task.name, 1 / 15)
                scores = neuron_scores(
                    self.single, self.pruning, loss=criterion, temperature=temperature, progress=self.progress
                )
            path.parent.mkdir(parents=True, exist_ok=True)
            torch_save_atomic(scores, path)
        return torch.load(path)

    def adaptive(self, delta: float, criterion: str = "entropy") -> nn.Module:
        """Algorithm 1's model at `delta`: neurons ranked by `criterion`, sizes searched on the prediction entropy."""
        return load_predictor(self._adaptive_dir(delta, criterion))

    def search(self, delta: float, criterion: str = "entropy") -> dict:
        """Algorithm 1's record at `delta` (sizes, baseline, entropies) in `searches/`, searched when missing."""
        path = self.cache / "searches" / f"adaptive-{criterion}-dE{delta:.6g}.json"
        if not path.exists():
            self._adaptive_dir(delta, criterion)
        return json.loads(path.read_text())

    def _adaptive_dir(self, delta: float, criterion: str) -> Path:
        """The model pruned at `delta`, built with its search record (written last: a stopped run builds again)."""
        path = self.cache / "models" / f"adaptive-{criterion}-dE{delta:.6g}"
        record = self.cache / "searches" / f"{path.name}.json"
        if not path.exists() or not record.exists():
            pruned, found = adaptive_mlp_pruning(
                self.single, self.pruning, delta, loss="entropy", scores=self.scores(criterion), progress=False
            )
            save_predictor(pruned, path)
            search = {"delta_e": delta, "sizes": found.sizes, "baseline": found.baseline}
            write_json_atomic(record, search | {"entropies": found.entropies})
        return path

    def uniform(self, criterion: str, total: int) -> nn.Module:
        """`total` MLP neurons spread evenly, the top ones by `criterion` ("taylor" = the entropy criterion)."""
        path = self.cache / "models" / f"uniform-{criterion}-{total}"
        if not path.exists():
            scores = self.scores("entropy" if criterion == "taylor" else criterion)
            save_predictor(prune_to_sizes(self.single, scores, uniform_sizes(self.single, total)), path)
        return load_predictor(path)

    def recovered(self, name: str, pruned: Callable[[], nn.Module]) -> nn.Module:
        """`pruned()` after recovery by feature distillation from the single model (Eq. 8), cached by `name`."""
        path, checkpoints = self.cache / "models" / f"{name}-recovered", self.cache / "checkpoints" / name
        if not path.exists():
            student = copy.deepcopy(pruned())
            recovery = self.recovery.with_(seed=self.seed)
            recover(student, self.single, self.task.train, recovery, checkpoint_dir=checkpoints, progress=self.progress)
            save_predictor(student, path)
            shutil.rmtree(checkpoints, ignore_errors=True)  # resumable no more: ~4x the model
        recovered = load_predictor(path)
        check_digest(self.cache, f"{name}-recovered", recovered)  # recorded, or compared with the record
        return recovered

    def base_dir(self, delta: float) -> Path:
        return self.cache / _slug(base_name(delta))

    def recovered_base(self, delta: float) -> nn.Module:
        """The AMP base of `delta`: the sweep's recovered model of that delta-E."""
        return self.recovered(_slug(base_name(delta)), lambda: self.adaptive(delta))

    def on_base(self, delta: float, rows: Sequence[str]) -> dict[str, dict]:
        """The suite's `rows` on the AMP base of `delta`, measured (or read back) in its directory."""
        base = functools.partial(self.recovered_base, delta)
        folder = self.base_dir(delta)
        return runner.run_seed(self.task, suite.TABLE, self.seed, folder, rows=rows, progress=self.progress, base=base)

    def free_models(self, delta: float) -> runner.Models:
        """The free table's models, each built (or read from the cache) when called: Single first, then the Hydra
        rows on the unpruned base, AMP single and the Hydra rows on the AMP base of `delta`."""
        base = functools.partial(self.recovered_base, delta)
        on_task = functools.partial(runner.predictor, self.task, suite.TABLE, self.seed, progress=False)
        models = {row: functools.partial(on_task, self.seed_cache, row=row) for row in HYDRA_ROWS}
        return models | {
            FREE_NAMES[r]: functools.partial(on_task, self.base_dir(delta), row=r, base=base) for r in HYDRA_ROWS
        }

    def matched_delta(self, criterion: str, total: int, start: float, tries: int = 8, tolerance: float = 0.03) -> float:
        """The delta-E at which Algorithm 1 with `criterion` keeps about `total` MLP neurons (within `tolerance`):
        from `start`, steps of x4 until the count is bracketed, then bisection in log(delta-E) (the count falls as
        delta-E grows). Returns the closest delta-E tried."""
        low, high, delta = None, None, start
        best, best_gap = start, math.inf
        for _ in range(tries):
            kept = sum(self.search(delta, criterion)["sizes"])
            gap = abs(kept - total) / total
            if gap < best_gap:
                best, best_gap = delta, gap
            if gap <= tolerance:
                break
            low, high = (delta, high) if kept > total else (low, delta)
            delta = float(f"{math.sqrt(low * high) if low and high else (low * 4 if low else high / 4):.3g}")
        return best

    def hydra_flops(self, pruned: nn.Module) -> float:
        """FLOPs of a fused Hydra Ensemble of the task's members on `pruned` (merged MLP) relative to Single, members
        keeping as many heads in every layer (member m heads m, m+1, ..., so no two are equal): which heads they
        keep does not change the count. Members with uneven heads per layer (circuits) count the same in the
        fused engine's ragged layout (a CPU's), more in its padded one (a GPU's)."""
        adapter = get_adapter(pruned)
        heads, drop = adapter.num_heads(pruned), self.task.prune_per_layer
        head_maps = [
            {layer: [(m + j) % heads for j in range(heads - drop)] for layer in range(adapter.num_layers(pruned))}
            for m in range(self.task.members)
        ]
        ensemble = HydraEnsemble.fuse(build_members(pruned, head_maps), mlp="average")
        return count_flops(ensemble, self.probe) / count_flops(self.single, self.probe)

    def recorded_hydra_flops(self, delta: float) -> float:
        path, key = self.cache / "hydra_flops.json", f"{delta:.6g}"
        ratios = read_json_record(path)
        if key not in ratios:
            ratios[key] = self.hydra_flops(self.adaptive(delta))
            write_json_atomic(path, ratios)
        return ratios[key]

    def free_delta(
        self, deltas: Sequence[float], target: float, refine: int = REFINE_STEPS
    ) -> tuple[float, dict[float, float]]:
        """The smallest delta-E whose Hydra Ensemble costs <= `target` x Single's FLOPs, and every ratio computed:
        the grid first, then `refine` bisection steps (log delta-E, 3 significant digits) between the grid's last
        delta-E over the target and its first within, so the base uses the budget. None within: the largest."""
        ratios = {delta: self.recorded_hydra_flops(delta) for delta in sorted(deltas)}
        within = [delta for delta, ratio in ratios.items() if ratio <= target]
        if not within:
            return max(deltas), ratios
        over = [delta for delta in ratios if delta < within[0]]
        low, high = (over[-1], within[0]) if over else (None, within[0])
        for _ in range(refine if low is not None else 0):
            middle = float(f"{math.sqrt(low * high):.3g}")
            if middle in (low, high):
                break
            ratios[middle] = self.recorded_hydra_flops(middle)
            low, high = (low, middle) if ratios[middle] <= target else (middle, high)
        return high, dict(sorted(ratios.items()))


def _check_settings(path: Path, settings: dict) -> None:
    """Record the settings a seed's scores, recovered models and rows depend on the first time; later, refuse
    other settings instead of mixing their rows with the recorded ones."""
    asked, recorded = _flat(json.loads(json.dumps(settings))), _flat(read_json_record(path))  # tuples as lists
    if not recorded:
        write_json_atomic(path, settings)
    elif recorded != asked:
        keys = sorted(k for k in asked.keys() | recorded.keys() if asked.get(k) != recorded.get(k))
        differ = "; ".join(f"{k} {recorded.get(k)} recorded, {asked.get(k)} asked" for k in keys)
        raise ValueError(
            f"{path.parent} holds models and rows made with other settings ({differ}): run with the recorded "
            "settings, or give this run its own --cache (and --records directory)."
        )


def _flat(settings: Mapping, prefix: str = "") -> dict:
    """{"recovery.epochs": 10, ...}: nested settings as dotted keys."""
    flat = {}
    for key, value in settings.items():
        flat |= _flat(value, f"{prefix}{key}.") if isinstance(value, Mapping) else {f"{prefix}{key}": value}
    return flat


@dataclass(frozen=True)
class AmpTable:
    """The AMP tables (some of TABLE_NAMES) as one table of the runner (`table()`): its rows are AMP's own (named
    per seed by the cost rule), its summary holds every table of every seed, and its latency is the free table's.
    Every delta-E of the sweep is pruned whatever the tables: the cost rule needs them."""

    deltas: Sequence[float] = DELTAS
    flops_target: float = 1.0
    recovery: TrainConfig = AMP_RECOVERY
    pruning_examples: int = 256
    tables: Sequence[str] = TABLE_NAMES
    progress: bool = True

    def table(self) -> runner.Table:
        unknown = sorted(set(self.tables) - set(TABLE_NAMES))
        if unknown or not self.tables:
            raise ValueError(f"tables must be some of {list(TABLE_NAMES)}, got {list(self.tables)}.")
        return runner.Table(
            self.rows,
            self.pieces,
            markdown,
            output="amp",
            record=f"{AMP_CACHE}/results.json",
            logits=f"{AMP_CACHE}/logits",
            summarize=self.summarize,
            timed=self.timed,
            latency_batch=LATENCY_BATCH,
        )

    def pieces(self, run: runner.SeedRun) -> AmpSeed:
        return AmpSeed(run.task, run.seed, run.cache, self.recovery, self.pruning_examples, run.progress)

    def pruned(self, amp: AmpSeed) -> dict[str, dict[str, Callable[[AmpSeed], nn.Module]]]:
        """{table: {row: the pruned model of a seed's pieces}} of the sweep, criteria and baselines tables asked
        for; the rows are named by `amp`'s cost rule."""
        delta, _ = amp.free_delta(self.deltas, self.flops_target)
        total, adaptive = sum(amp.search(delta)["sizes"]), AmpSeed.adaptive
        plans = {"sweep": lambda: {base_name(d): functools.partial(adaptive, delta=d) for d in self.deltas}}
        plans["criteria"] = lambda: {
            f"AMP ({c}, dE={d:g})": functools.partial(adaptive, delta=d, criterion=c)
            for c in CRITERIA
            for d in [delta if c == "entropy" else amp.matched_delta(c, total, start=delta)]
        }
        plans["baselines"] = lambda: (
            {base_name(delta): functools.partial(adaptive, delta=delta)}
            | {f"Uniform ({c})": functools.partial(AmpSeed.uniform, criterion=c, total=total) for c in BASELINES}
        )
        return {name: plan() for name, plan in plans.items() if name in self.tables}

    def rows(self, pieces: Callable[[], AmpSeed]) -> dict[str, runner.Build]:
        builds = {"Single": _row(lambda amp: amp.single)}
        for name, model in (row for plan in self.pruned(pieces()).values() for row in plan.items()):
            builds |= {name: _row(model), f"{name}, recovered": _row(functools.partial(_recovered, name, model))}
        return builds

    def seed_tables(self, amp: AmpSeed, measured: Mapping[str, dict]) -> dict:
        """One seed's tables ({table: {row: result}}, the free table first) and {"free_delta", "hydra_flops",
        "sizes": {row: MLP sizes}}: AMP's rows `measured` by the runner, the suite's rows on each base."""
        delta, ratios = amp.free_delta(self.deltas, self.flops_target)
        points = sorted({*self.deltas, delta})
        sizes = {"unpruned": amp.suite.shape["widths"]} | {base_name(d): amp.search(d)["sizes"] for d in points}
        built: dict[str, dict] = {}
        on_task = functools.partial(runner.run_seed, amp.task, suite.TABLE, amp.seed, amp.seed_cache)
        if "free" in self.tables:
            print(f"[seed {amp.seed}] ensembles on the AMP base (delta-E {delta:g})", flush=True)
            built["free"] = on_task(rows=HYDRA_ROWS, progress=self.progress)
            built["free"] |= {FREE_NAMES[row]: result for row, result in amp.on_base(delta, HYDRA_ROWS).items()}
        if "curve" in self.tables:
            built["curve"] = on_task(rows=CURVE_ROWS, progress=self.progress)
            for d in points:  # at the free delta-E, the free table's own directory: its rows are reused
                on_base = amp.on_base(d, CURVE_ROWS)
                built["curve"][f"AMP single, dE={d:g}"] = on_base["Single"]
                built["curve"][f"Hydra (Taylor) on AMP, dE={d:g}"] = on_base["Hydra (Taylor)"]
        for name, plan in self.pruned(amp).items():
            if name == "baselines":
                _check_uniform_sizes(measured, sum(amp.search(delta)["sizes"]))
            built[name] = {"Single": measured["Single"]}
            built[name] |= {row: measured[row] for model in plan for row in (model, f"{model}, recovered")}
            sizes |= {model: measured[model]["mlp_sizes"] for model in plan}
        result = {"free_delta": delta, "hydra_flops": {f"{d:g}": r for d, r in ratios.items()}, "sizes": sizes}
        return result | {name: built[name] for name in TABLE_NAMES if name in built}

    def summarize(self, task: Task, summary: dict, seed_dirs: dict[int, Path]) -> dict:
        pieces = {s: self.pieces(runner.SeedRun(task, s, folder, self.progress)) for s, folder in seed_dirs.items()}
        per_seed = {seed: self.seed_tables(amp, summary["per_seed"][seed]) for seed, amp in pieces.items()}
        settings = {"deltas": list(self.deltas), "flops_target": self.flops_target, "recovery": self.recovery.key()}
        tables = [name for name in TABLE_NAMES if name in self.tables]
        return dict(zip(("compute_s", "rows_without_time"), recorded_compute(per_seed))) | {
            "settings": settings | {"pruning_examples": self.pruning_examples},
            "tables": {name: aggregate({s: r[name] for s, r in per_seed.items()}) for name in tables},
            "per_seed": per_seed,
            "notes": [
                note for seed, folder in seed_dirs.items() for note in rebuilt_notes(seed, *_model_folders(folder))
            ],
        }

    def timed(self, amp: AmpSeed) -> tuple[str, runner.Models]:
        delta, _ = amp.free_delta(self.deltas, self.flops_target)
        return f"{AMP_CACHE}/latency-dE{delta:g}.json", amp.free_models(delta)


def _check_uniform_sizes(measured: Mapping[str, dict], total: int) -> None:
    """The uniform rows keep `total` MLP neurons, the free base's count; rows recorded under another free delta-E
    (another --flops-target or --deltas) keep another, and their names do not say so: refuse them, not mix them."""
    for row in (f"Uniform ({c}){recovered}" for c in BASELINES for recovered in ("", ", recovered")):
        kept = sum(measured[row]["mlp_sizes"]) if row in measured else total
        if kept != total:
            raise ValueError(
                f"the recorded row {row!r} keeps {kept} MLP neurons, and this run's AMP base {total}: it was measured "
                "under another --flops-target or --deltas; run with those, or give this run its own --cache (and "
                "--records directory)."
            )


def _row(model: Callable[[AmpSeed], nn.Module]) -> runner.Build:
    """A row: `model(amp)` of the seed's pieces, with its heads and MLP neurons as the tables label them."""

    def build(amp: AmpSeed) -> Built:
        built = model(amp)
        sizes = [len(k) for k in kept_neurons(built).values()]
        heads = f"{amp.suite.shape['heads']}; MLP {sum(sizes)}/{sum(amp.suite.shape['widths'])}"
        return Built(built, {"heads": heads, "mlp_sizes": sizes})

    return build


def _recovered(name: str, pruned: Callable[[AmpSeed], nn.Module], amp: AmpSeed) -> nn.Module:
    """The row `name`'s model `pruned` of `amp`, recovered (`AmpSeed.recovered`) under `_recovery_name`."""
    return amp.recovered(_recovery_name(name, pruned), lambda: pruned(amp))


def _recovery_name(name: str, pruned: Callable[[AmpSeed], nn.Module]) -> str:
    """The cache name of a row's recovered model. Algorithm 1's model on the entropy criterion is the sweep's
    model of its delta-E under any row name (the criteria table's entropy row): it shares that model's recovery
    (one training, not two), told by what the row builds, not by how it is labelled; a uniform-width model is
    named with its neuron count."""
    settings, builds = getattr(pruned, "keywords", {}), getattr(pruned, "func", None)
    if builds is AmpSeed.adaptive and settings.get("criterion", "entropy") == "entropy":
        return _slug(base_name(settings["delta"]))
    if builds is AmpSeed.uniform:  # its row name does not carry its neuron count, which the free delta-E sets
        return f"{_slug(name)}-{settings['total']}"
    return _slug(name)


def free_predictors(
    task: Task,
    seed: int,
    seed_cache: Path,
    delta: float,
    recovery: TrainConfig = AMP_RECOVERY,
    pruning_examples: int = 256,
) -> dict[str, nn.Module]:
    """The free table's predictors of one seed, from its cache (or built again from its records)."""
    amp = AmpSeed(task, seed, seed_cache, recovery, pruning_examples, progress=False)
    return {row: model() for row, model in amp.free_models(delta).items()}


def experiment(
    task: Task,
    seeds: Sequence[int],
    out_dir: str | os.PathLike,
    cache_dir: str | os.PathLike,
    command: str = "",
    deltas: Sequence[float] = DELTAS,
    flops_target: float = 1.0,
    recovery: TrainConfig = AMP_RECOVERY,
    pruning_examples: int = 256,
    latency_repeats: int = 7,
    progress: bool = True,
    tables: Sequence[str] = TABLE_NAMES,
    latency_seeds: Sequence[int] | None = None,
) -> dict:
    """`table` run for every seed; writes amp.md and amp.json to `out_dir`. The free table's latency is timed on
    the models of `latency_seeds` (default: the first seed; timing needs the models, which a machine with only the
    records trains again), each seed's rows interleaved."""
    amp = AmpTable(deltas, flops_target, recovery, pruning_examples, tables, progress).table()
    repeats = latency_repeats if "free" in tables else 0
    return runner.run(
        task,
        amp,
        seeds,
        out_dir,
        cache_dir,
        command=command,
        latency_repeats=repeats,
        progress=progress,
        latency_seeds=latency_seeds,
    )


def recorded_compute(per_seed: Mapping[int, Mapping[str, object]]) -> tuple[float, int]:
    """The seconds recorded with the rows of the tables built, over every run that built them (a row that several
    tables show counted once), and how many rows carry no time (AMP rows recorded before they kept it)."""
    rows = {
        (seed, json.dumps(row, sort_keys=True)): row
        for seed, result in per_seed.items()
        for name in TABLE_NAMES
        for row in result.get(name, {}).values()
    }
    seconds = sum(row.get("_seconds", 0.0) for row in rows.values())
    return round(seconds, 1), sum("_seconds" not in row for row in rows.values())


def markdown(summary: dict) -> str:
    seeds, per_seed = summary["seeds"], summary["per_seed"]
    lines = [
        f"# {summary['task']}: adaptive MLP pruning (paper 002) and Hydra Ensembles on it",
        "",
        f"Command: `{summary['command']}`  ",
        f"Machine: {summary['machine']}  ",
        f"Seeds: {seeds} "
        + ("(mean ± std over seeds)  " if len(seeds) > 1 else "(one run: values without a spread)  "),
        f"Wall time: {summary['wall_time_s'] / 60:.1f} min for this run ({compute_note(summary)})",
        "",
        *[f"- {note}" for note in summary.get("notes", [])],
        *([""] if summary.get("notes") else []),
    ]
    for name, title in TABLES:
        if name not in summary["tables"]:
            continue
        latency = summary.get("latency") if name == "free" else None
        lines += [f"## {title}", "", *table_lines(summary["tables"][name], latency), ""]
        if name == "free":
            chosen = {s: r["free_delta"] for s, r in per_seed.items()}
            ratios = {s: ", ".join(f"{d}: {x:.2f}" for d, x in r["hydra_flops"].items()) for s, r in per_seed.items()}
            lines += [
                f"AMP base: delta-E {chosen} per seed, the smallest whose fused {len(HYDRA_ROWS)}-member Hydra "
                f"costs <= {summary['settings']['flops_target']}x Single's FLOPs on the grid "
                f"{summary['settings']['deltas']}, refined by up to {REFINE_STEPS} bisection steps between the grid's "
                "last delta-E over the target and first within it "
                f"(Hydra FLOPs x per delta-E, per seed: {ratios}; members keeping as many heads in every layer, as "
                "Hydra (Taylor)'s do: Hydra (Circ)'s members keep uneven numbers, which cost the same in the fused "
                "engine's ragged layout (CPU) and more in its padded one (GPU)). Heads: per layer; MLP: hidden "
                "neurons kept of all."
                + "".join(
                    f" Seed {s}: no delta-E of the grid reached the target; its base is the largest, over it."
                    for s, r in per_seed.items()
                    if r["hydra_flops"][f"{r['free_delta']:g}"] > summary["settings"]["flops_target"]
                )
                + (f" {latency_note(summary)}" if "latency" in summary else ""),
                "",
            ]
    missing = [name for name in TABLE_NAMES if name not in summary["tables"]]
    if missing:
        lines += [f"Not built in this run: {', '.join(missing)} (`--tables`).", ""]
    first = per_seed[seeds[0]]["sizes"]
    lines += ["## Kept MLP sizes per block (first seed)", ""]
    lines += render(["Model", "MLP hidden size per block"], [[k, str(v)] for k, v in first.items()], "markdown")
    return "\n".join([*lines, "", CONVENTIONS, ""]) + "\n"


def compute_note(summary: dict) -> str:
    """The compute recorded with the tables' rows, and the rows recorded without their time."""
    minutes, missing = summary["compute_s"] / 60, summary["rows_without_time"]
    note = f"compute recorded with these tables' rows over all runs that built them: {minutes:.1f} min"
    return note + (f"; {missing} rows recorded before AMP rows kept their time are not counted" if missing else "")


def latency_note(summary: dict) -> str:
    """Which seeds' models the free table's latency column timed, how, when and where."""
    timed = summary["latency_per_seed"]
    where = "; ".join(sorted({f"{t['date']} on {runner.timed_on(t)}" for t in runner.timings(summary).values()}))
    batch = f"one batch of {summary['latency_batch']} test examples"
    if len(timed) == 1:
        seed = next(iter(timed))
        return f"Latency: seed {seed}'s models on {batch}, timed interleaved (median and range over rounds), {where}."
    per_seed = "; ".join(
        f"seed {seed}: " + ", ".join(f"{row} {format_latency(stats)}" for row, stats in rows.items() if row != "Single")
        for seed, rows in timed.items()
    )
    return (
        f"Latency: each seed's models on {batch}, timed interleaved; the column is the mean ± std over seeds "
        f"{list(timed)} of each seed's median ratio. Per seed, median (min-max) over rounds: {per_seed}. Timed {where}."
    )


def _first_examples(batches: list, count: int) -> list:
    """The first batches holding `count` examples (whole batches; at least one)."""
    taken, seen = [], 0
    for batch in batches:
        if seen >= count:
            break
        taken.append(batch)
        seen += len(next(iter(batch.values())))
    return taken


def _model_folders(seed_cache: Path) -> list[Path]:
    """The folders (each with its digest file) whose models a seed's AMP tables use: the seed's (the single
    model), the AMP models' and every AMP base's (the members trained on it)."""
    amp_cache = seed_cache / AMP_CACHE
    return [seed_cache, amp_cache, *(path.parent for path in sorted(amp_cache.glob(f"*/{DIGESTS}")))]


def base_name(delta: float) -> str:
    """The row name of Algorithm 1's model at `delta`, which also names its recovered model and base directory."""
    return f"AMP dE={delta:g}"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in name).strip("-").replace("--", "-")
