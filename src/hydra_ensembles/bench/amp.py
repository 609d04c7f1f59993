"""Paper 002's experiments on a benchmark task's fine-tuned single model, and the ensemble-for-free table
(issue 13). One seed, from the suite's cached Single model of the task (`bench.suite`):

sweep      Algorithm 1 at each delta-E with the label-free entropy criterion: kept MLP sizes, parameters, FLOPs
           and the evaluation suite's metrics, before and after recovery (the shape of Table 7).
free       the base of the ensemble: the smallest delta-E whose fused 3-member Hydra Ensemble costs at most
           `flops_target` x Single's FLOPs (a cost rule: FLOPs on a few validation inputs, no labels), on the
           sweep's grid refined by bisection between the grid's last delta-E over the target and its first
           within. Then Single, AMP single (that base, recovered), Hydra (Taylor) and Hydra (Circ) on the
           unpruned base (the suite's own rows) and on the AMP base (the same recipe: sequential Taylor
           scores, exact circuits, fine-tuned members, merged MLP), with latency timed interleaved in one run.
curve      Single, Hydra (Taylor) on the unpruned base, and AMP single and Hydra (Taylor) on every base of the
           sweep (recovered; the free base's delta-E included): the ensemble's quality against its cost, for when
           the free base's ensemble misses the bar (circuit rows are left out: an exact search per base is hours).
criteria   neurons ranked by cross-entropy, the prediction entropy or the [CLS] similarity entropy (Table 5
           swaps only the importance criterion: Algorithm 1's search stays on the prediction entropy), each at
           the delta-E that keeps the free base's MLP neuron count (found by bisection).
baselines  at that count with a uniform width: random neurons, L2 magnitude, Taylor (the entropy criterion), next
           to the adaptive result (Tables 3 and 6), before and after recovery.

Recovery is Eq. 8 (MSE on the last layer's features against the unpruned model) on the training inputs, labels
unused. The pruning set is the first `pruning_examples` training examples. Everything is cached under
`<suite seed cache>/<AMP_CACHE>/`, so a run resumes where it stopped; a model is built only when a result needs
it and is not recorded, so the records alone (`bench.records`) render every table on a fresh machine.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from ..adapters import get_adapter
from ..cost import count_flops, format_latency
from ..data.loaders import rebatch
from ..evaluation.report import measure
from ..evaluation.tables import CONVENTIONS, aggregate, latency_over_seeds, render, table_lines
from ..fusion import HydraEnsemble
from ..importance import (
    adaptive_mlp_pruning,
    magnitude_neuron_scores,
    neuron_scores,
    prune_to_sizes,
    random_neuron_scores,
    uniform_sizes,
)
from ..io import read_json_record, row_file, torch_save_atomic, write_json_atomic
from ..members import build_members
from ..predictors import load_predictor, save_predictor
from ..pruning import kept_neurons
from ..training import AMP_RECOVERY, TrainConfig, recover
from .records import DIGESTS, check_digest, rebuilt_notes, recorded_latency
from .suite import _Builder, run_record, run_seed, time_predictors
from .tasks import Task

DELTAS = (0.01, 0.02, 0.03, 0.05, 0.1, 0.2)
CRITERIA = ("entropy", "cross_entropy", "similarity")
BASELINES = ("random", "l2", "taylor")
HYDRA_ROWS = ("Single", "Hydra (Taylor)", "Hydra (Circ)")
CURVE_ROWS = ("Single", "Hydra (Taylor)")  # on each base: no circuit rows (an exact search per base is hours)
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
FREE_NAMES = {  # the suite's rows on the AMP base, as the free table names them
    "Single": "AMP single",
    "Hydra (Taylor)": "Hydra (Taylor) on AMP",
    "Hydra (Circ)": "Hydra (Circ) on AMP",
}


class AmpSeed:
    """The pruned, recovered and ensembled models of one seed, each built once and cached."""

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
        # the inputs FLOPs are counted on: validation ones, as the cost rule that picks the AMP base counts them
        self.probe = {k: v[:8] for k, v in task.val[0].items() if k != "labels"}
        self.suite = _Builder(task, seed, seed_cache, progress)
        settings = {"recovery": recovery.key(), "pruning_examples": pruning_examples}
        _check_settings(self.cache / "settings.json", settings)

    # Models are built only when a result is not recorded yet, so that a seed whose records are all there (e.g.
    # on a fresh machine, `bench.records`) is rendered without training anything.

    @functools.cached_property
    def single(self) -> nn.Module:
        """The suite's Single model of the seed (trained, or loaded from the cache)."""
        return self.suite.single()

    @functools.cached_property
    def shape(self) -> dict:
        """The single model's heads per layer, layers and MLP widths, as the suite records them."""
        return self.suite.shape

    # ---- models ----

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
        """The model Algorithm 1 prunes at `delta`, its neurons ranked by `criterion` and its sizes searched on
        the prediction entropy (built once, cached)."""
        return load_predictor(self._adaptive_dir(delta, criterion))

    def search(self, delta: float, criterion: str = "entropy") -> dict:
        """Algorithm 1's record at `delta` (sizes, baseline, entropies), without loading the model (a record:
        `searches/`; the search runs when it is missing)."""
        path = self.cache / "searches" / f"adaptive-{criterion}-dE{delta:.6g}.json"
        if not path.exists():
            self._adaptive_dir(delta, criterion)
        return json.loads(path.read_text())

    def _adaptive_dir(self, delta: float, criterion: str) -> Path:
        """Where the model pruned at `delta` is cached; built on first use, with its search record (written
        last: a run stopped in between builds it again)."""
        path = self.cache / "models" / f"adaptive-{criterion}-dE{delta:.6g}"
        record = self.cache / "searches" / f"{path.name}.json"
        if (path / "search.json").exists() and not record.exists():  # where caches before records kept it
            write_json_atomic(record, json.loads((path / "search.json").read_text()))
        if not path.exists() or not record.exists():
            pruned, record_ = adaptive_mlp_pruning(
                self.single,
                self.pruning,
                delta,
                loss="entropy",  # Algorithm 1's criterion E; `criterion` ranks the neurons
                scores=self.scores(criterion),
                progress=False,
            )
            save_predictor(pruned, path)
            search = {"delta_e": delta, "sizes": record_.sizes, "baseline": record_.baseline}
            write_json_atomic(record, search | {"entropies": record_.entropies})
        return path

    def uniform(self, criterion: str, total: int) -> nn.Module:
        """`total` MLP neurons spread evenly, the top ones by `criterion` ("taylor" = the entropy criterion)."""
        path = self.cache / "models" / f"uniform-{criterion}-{total}"
        if not path.exists():
            scores = self.scores("entropy" if criterion == "taylor" else criterion)
            save_predictor(prune_to_sizes(self.single, scores, uniform_sizes(self.single, total)), path)
        return load_predictor(path)

    def recovered(self, name: str, pruned: Callable[[], nn.Module]) -> nn.Module:
        """The model `pruned()` builds, after recovery by feature distillation from the single model (Eq. 8),
        cached by `name`."""
        path = self.cache / "models" / f"{name}-recovered"
        if not path.exists():
            student = copy.deepcopy(pruned())
            recover(
                student,
                self.single,
                self.task.train,
                self.recovery.with_(seed=self.seed),
                checkpoint_dir=self.cache / "checkpoints" / name,
                progress=self.progress,
            )
            save_predictor(student, path)
            shutil.rmtree(self.cache / "checkpoints" / name, ignore_errors=True)  # resumable no more: ~4x the model
        recovered = load_predictor(path)
        check_digest(self.cache, f"{name}-recovered", recovered)  # recorded, or compared with the record
        return recovered

    def base_dir(self, delta: float) -> Path:
        """The directory of the ensembles built on the AMP base of `delta` (its suite rows' cache)."""
        return self.cache / _slug(base_name(delta))

    def recovered_base(self, delta: float) -> nn.Module:
        """The AMP base of `delta`: Algorithm 1's model, recovered (the sweep's recovered model of that delta-E, the
        same name)."""
        return self.recovered(_slug(base_name(delta)), lambda: self.adaptive(delta))

    def matched_delta(self, criterion: str, total: int, start: float, tries: int = 8, tolerance: float = 0.03) -> float:
        """The delta-E at which Algorithm 1 with `criterion` keeps about `total` MLP neurons (within
        `tolerance`): from `start`, steps of x4 until the count is bracketed, then bisection in log(delta-E) (the
        kept count falls as delta-E grows). Returns the closest delta-E tried."""
        low, high, delta = None, None, start
        best, best_gap = start, math.inf
        for _ in range(tries):
            kept = sum(self.search(delta, criterion)["sizes"])
            gap = abs(kept - total) / total
            if gap < best_gap:
                best, best_gap = delta, gap
            if gap <= tolerance:
                break
            if kept > total:
                low = delta
            else:
                high = delta
            delta = float(f"{math.sqrt(low * high) if low and high else (low * 4 if low else high / 4):.3g}")
        return best

    def hydra_flops(self, pruned: nn.Module) -> float:
        """FLOPs of a fused Hydra Ensemble of the task's members on `pruned`, relative to Single: each member keeps
        the task's heads per layer (which heads does not change the count; member m keeps heads m, m+1, ..., so
        that no two are the same), the merged MLP."""
        adapter = get_adapter(pruned)
        heads, drop = adapter.num_heads(pruned), self.task.prune_per_layer
        head_maps = [
            {layer: [(m + j) % heads for j in range(heads - drop)] for layer in range(adapter.num_layers(pruned))}
            for m in range(self.task.members)
        ]
        ensemble = HydraEnsemble.fuse(build_members(pruned, head_maps), mlp="average")
        return count_flops(ensemble, self.probe) / count_flops(self.single, self.probe)

    def recorded_hydra_flops(self, delta: float) -> float:
        """`hydra_flops` of the model Algorithm 1 prunes at `delta`, recorded in `hydra_flops.json`."""
        path = self.cache / "hydra_flops.json"
        ratios = read_json_record(path)
        if f"{delta:.6g}" not in ratios:
            ratios[f"{delta:.6g}"] = self.hydra_flops(self.adaptive(delta))
            write_json_atomic(path, ratios)
        return ratios[f"{delta:.6g}"]

    def free_delta(
        self, deltas: Sequence[float], target: float, refine: int = REFINE_STEPS
    ) -> tuple[float, dict[float, float]]:
        """The smallest delta-E whose Hydra Ensemble costs <= `target` x Single's FLOPs, and every ratio computed.

        First the sweep's grid; when the first delta-E within the target has a grid neighbour below it that is
        over, `refine` bisection steps (in log delta-E, 3 significant digits) narrow the gap, so the base uses
        the budget instead of landing far under it. None within: the largest delta-E."""
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

    # ---- measurement ----

    def measured(self, name: str, model: Callable[[], nn.Module]) -> dict:
        """The suite's metrics of the model `model()` builds, its MLP sizes, its heads and MLP neurons as the
        tables label them, and the seconds it took (as the suite's rows record them); recorded in results.json by
        `name` (the model is built only when not recorded)."""
        record = self.cache / "results.json"
        results = read_json_record(record)
        if name not in results:
            started = time.perf_counter()
            built = model()
            sizes = [len(k) for k in kept_neurons(built).values()]
            results[name] = measure(
                built, self.task.test, self.task.near, self.task.far, row_file(self.cache / "logits", name)
            ) | {
                "heads": f"{self.shape['heads']}; MLP {sum(sizes)}/{sum(self.shape['widths'])}",
                "mlp_sizes": sizes,
                "_seconds": round(time.perf_counter() - started, 1),  # building it (pruning, recovery) and measuring
            }
            write_json_atomic(record, results)
        return results[name]


def _check_settings(path: Path, settings: dict) -> None:
    """Record the settings that a seed's cached scores, recovered models and rows depend on, the first time; later,
    refuse other settings instead of mixing their rows with the recorded ones."""
    asked = _flat(json.loads(json.dumps(settings)))  # as JSON holds them (tuples become lists)
    recorded = _flat(read_json_record(path))
    if not recorded:
        write_json_atomic(path, settings)
    elif recorded != asked:
        differ = [
            f"{k} {recorded.get(k)} recorded, {asked.get(k)} asked"
            for k in sorted(asked.keys() | recorded.keys())
            if asked.get(k) != recorded.get(k)
        ]
        raise ValueError(
            f"{path.parent} holds models and rows made with other settings ({'; '.join(differ)}): run with the "
            "recorded settings, or give this run its own --cache (and --records directory)."
        )


def _flat(settings: Mapping, prefix: str = "") -> dict:
    """{"recovery.epochs": 10, ...}: nested settings as dotted keys."""
    flat = {}
    for key, value in settings.items():
        flat |= _flat(value, f"{prefix}{key}.") if isinstance(value, Mapping) else {f"{prefix}{key}": value}
    return flat


def amp_seed(
    task: Task,
    seed: int,
    seed_cache: Path,
    deltas: Sequence[float] = DELTAS,
    flops_target: float = 1.0,
    recovery: TrainConfig = AMP_RECOVERY,
    pruning_examples: int = 256,
    progress: bool = True,
    tables: Sequence[str] = TABLE_NAMES,
) -> dict:
    """The `tables` of one seed ({"free", "sweep", "curve", "criteria", "baselines"}: {row: results}, built in
    that order, the ensemble-for-free table first) and {"free_delta", "hydra_flops", "sizes": {row: MLP sizes}}.
    Every delta-E of the sweep is pruned (not recovered) whatever the tables: the free base's cost rule needs
    them."""
    amp = AmpSeed(task, seed, seed_cache, recovery, pruning_examples, progress)
    delta, ratios = amp.free_delta(deltas, flops_target)
    sizes = {"unpruned": amp.shape["widths"]}
    sizes |= {base_name(d): amp.search(d)["sizes"] for d in sorted({*deltas, delta})}
    total = sum(sizes[base_name(delta)])
    result: dict = {"free_delta": delta, "hydra_flops": {f"{d:g}": r for d, r in ratios.items()}, "sizes": sizes}

    def both(name: str, pruned: Callable[[], nn.Module]) -> dict[str, dict]:
        rows = {
            name: amp.measured(name, pruned),
            f"{name}, recovered": amp.measured(f"{name}, recovered", lambda: amp.recovered(_slug(name), pruned)),
        }
        sizes[name] = rows[name]["mlp_sizes"]
        return rows

    unpruned = amp.measured("Single", lambda: amp.single)
    if "free" in tables:
        print(f"[seed {seed}] ensembles on the AMP base (delta-E {delta:g})", flush=True)
        free = run_seed(task, seed, seed_cache, progress, rows=HYDRA_ROWS)
        on_amp = run_seed(
            task, seed, amp.base_dir(delta), progress, rows=HYDRA_ROWS, base=lambda: amp.recovered_base(delta)
        )
        result["free"] = free | {FREE_NAMES[row]: results for row, results in on_amp.items()}
    if "sweep" in tables:
        result["sweep"] = {"Single": unpruned}
        for d in deltas:
            print(f"[seed {seed}] AMP delta-E {d:g}", flush=True)
            result["sweep"] |= both(base_name(d), lambda d=d: amp.adaptive(d))
    if "curve" in tables:
        result["curve"] = run_seed(task, seed, seed_cache, progress, rows=CURVE_ROWS)  # the unpruned end
        for d in sorted({*deltas, delta}):
            print(f"[seed {seed}] Hydra (Taylor) on AMP dE={d:g}", flush=True)
            on_base = run_seed(  # at the free delta-E, the free table's own directory: its rows are reused
                task, seed, amp.base_dir(d), progress, rows=CURVE_ROWS, base=lambda d=d: amp.recovered_base(d)
            )
            result["curve"] |= {
                f"AMP single, dE={d:g}": on_base["Single"],
                f"Hydra (Taylor) on AMP, dE={d:g}": on_base["Hydra (Taylor)"],
            }
    if "criteria" in tables:
        result["criteria"] = {"Single": unpruned}
        for criterion in CRITERIA:
            matched = delta if criterion == "entropy" else amp.matched_delta(criterion, total, start=delta)
            print(f"[seed {seed}] criterion {criterion}: delta-E {matched:g}", flush=True)
            name = f"AMP ({criterion}, dE={matched:g})"
            result["criteria"] |= both(name, lambda m=matched, c=criterion: amp.adaptive(m, c))
    if "baselines" in tables:
        result["baselines"] = {"Single": unpruned} | both(base_name(delta), lambda: amp.adaptive(delta))
        for criterion in BASELINES:
            print(f"[seed {seed}] uniform width, {criterion}", flush=True)
            result["baselines"] |= both(f"Uniform ({criterion})", lambda c=criterion: amp.uniform(c, total))
    return result


def free_predictors(
    task: Task,
    seed: int,
    seed_cache: Path,
    delta: float,
    recovery: TrainConfig = AMP_RECOVERY,
    pruning_examples: int = 256,
) -> dict[str, nn.Module]:
    """The free table's predictors of one seed, from its cache (built there by `amp_seed`, or again from its
    records): Single first, then the Hydra rows on the unpruned base, AMP single and the Hydra rows on the AMP
    base of `delta`."""
    amp = AmpSeed(task, seed, seed_cache, recovery, pruning_examples, progress=False)
    unpruned = _Builder(task, seed, seed_cache, progress=False)
    on_amp = _Builder(task, seed, amp.base_dir(delta), progress=False, base=lambda: amp.recovered_base(delta))
    predictors = {row: unpruned.row(row)[0] for row in HYDRA_ROWS}
    return predictors | {FREE_NAMES[row]: on_amp.row(row)[0] for row in HYDRA_ROWS}


def free_latency(
    task: Task, seed: int, seed_cache: Path, delta: float, repeats: int = 7, batch: int = LATENCY_BATCH, **amp
) -> dict[str, dict]:
    """Latency of the free table's rows relative to Single, timed interleaved on the first `batch` test examples
    (one batch). `amp`: `free_predictors`' recovery and pruning_examples."""
    predictors = free_predictors(task, seed, seed_cache, delta, **amp)
    return time_predictors(predictors, rebatch(task.test, batch)[0], repeats)


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
    """`amp_seed` for every seed, aggregated; writes amp.md and amp.json to `out_dir`. `tables`: which of
    TABLE_NAMES to build. When the free table is one of them, its rows' latency is timed on the models of
    `latency_seeds` (default: the first seed; timing a seed needs its models, which a machine that has only the
    records must train again), each seed's rows interleaved in one run."""
    unknown = sorted(set(tables) - set(TABLE_NAMES))
    if unknown or not tables:
        raise ValueError(f"tables must be some of {list(TABLE_NAMES)}, got {list(tables)}.")
    latency_seeds = list(seeds[:1] if latency_seeds is None else latency_seeds)
    if not set(latency_seeds) <= set(seeds) or not latency_seeds:
        raise ValueError(f"latency_seeds must be some of the seeds {list(seeds)}, got {latency_seeds}.")
    tables = [name for name in TABLE_NAMES if name in tables]
    started = time.perf_counter()
    out_dir, cache = Path(out_dir), Path(cache_dir) / f"{task.name}-{task.fingerprint()}"
    per_seed = {
        seed: amp_seed(
            task, seed, cache / f"seed{seed}", deltas, flops_target, recovery, pruning_examples, progress, tables
        )
        for seed in seeds
    }
    summary = run_record(task.name, command, seeds) | {
        "settings": {
            "deltas": list(deltas),
            "flops_target": flops_target,
            "recovery": recovery.key(),
            "pruning_examples": pruning_examples,
        },
        "tables": {name: aggregate({s: r[name] for s, r in per_seed.items()}) for name in tables},
        "per_seed": per_seed,
        "notes": [note for s in seeds for note in rebuilt_notes(s, *_model_folders(cache / f"seed{s}"))],
    }
    if latency_repeats and "free" in tables:
        per_seed_latency, summary["latency_timed"] = {}, {}
        for seed in latency_seeds:
            delta = per_seed[seed]["free_delta"]
            per_seed_latency[seed], summary["latency_timed"][seed] = recorded_latency(
                cache / f"seed{seed}" / AMP_CACHE / f"latency-dE{delta:g}.json",
                list(per_seed[seed]["free"]),
                lambda seed=seed, delta=delta: free_latency(
                    task,
                    seed,
                    cache / f"seed{seed}",
                    delta,
                    latency_repeats,
                    recovery=recovery,
                    pruning_examples=pruning_examples,
                ),
            )
        summary["latency_per_seed"] = per_seed_latency
        summary["latency"] = latency_over_seeds(per_seed_latency)
        summary["latency_batch"] = min(LATENCY_BATCH, sum(len(b["labels"]) for b in task.test))
    summary["wall_time_s"] = round(time.perf_counter() - started, 1)
    summary["compute_s"], summary["rows_without_time"] = recorded_compute(per_seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "amp.json", summary)
    (out_dir / "amp.md").write_text(markdown(summary))
    return summary


def recorded_compute(per_seed: Mapping[int, Mapping[str, object]]) -> tuple[float, int]:
    """The seconds recorded with the rows of the tables built, over every run that built them (a row that several
    tables show, e.g. the free base's Hydra (Taylor) in the free table and the curve, counted once), and how many
    of those rows carry no time (AMP rows recorded before they kept it)."""
    rows = {
        (seed, json.dumps(row, sort_keys=True)): row
        for seed, result in per_seed.items()
        for name in TABLE_NAMES
        for row in result.get(name, {}).values()
    }
    seconds = sum(row.get("_seconds", 0.0) for row in rows.values())
    return round(seconds, 1), sum("_seconds" not in row for row in rows.values())


def markdown(summary: dict) -> str:
    seeds = summary["seeds"]
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
            chosen = {s: r["free_delta"] for s, r in summary["per_seed"].items()}
            ratios = {
                s: ", ".join(f"{d}: {x:.2f}" for d, x in r["hydra_flops"].items())
                for s, r in summary["per_seed"].items()
            }
            lines += [
                f"AMP base: delta-E {chosen} per seed, the smallest whose fused {len(HYDRA_ROWS)}-member Hydra "
                f"costs <= {summary['settings']['flops_target']}x Single's FLOPs on the grid "
                f"{summary['settings']['deltas']}, refined by up to {REFINE_STEPS} bisection steps between the grid's "
                "last delta-E over the target and first within it "
                f"(Hydra FLOPs x per delta-E, per seed: {ratios}). Heads: per layer; MLP: hidden neurons kept of all."
                + (f" {latency_note(summary)}" if "latency" in summary else ""),
                "",
            ]
    missing = [name for name in TABLE_NAMES if name not in summary["tables"]]
    if missing:
        lines += [f"Not built in this run: {', '.join(missing)} (`--tables`).", ""]
    lines += ["## Kept MLP sizes per block (first seed)", ""]
    first = summary["per_seed"][seeds[0]]["sizes"]
    lines += render(["Model", "MLP hidden size per block"], [[k, str(v)] for k, v in first.items()], "markdown")
    lines += ["", CONVENTIONS, ""]
    return "\n".join(lines) + "\n"


def compute_note(summary: dict) -> str:
    """The compute recorded with the tables' rows, and the rows recorded without their time."""
    minutes, missing = summary["compute_s"] / 60, summary["rows_without_time"]
    note = f"compute recorded with these tables' rows over all runs that built them: {minutes:.1f} min"
    return note + (f"; {missing} rows recorded before AMP rows kept their time are not counted" if missing else "")


def latency_note(summary: dict) -> str:
    """Which seeds' models the free table's latency column timed, how, when and where."""
    timed = summary["latency_timed"]
    where = "; ".join(sorted({f"{t['date']} on {t['machine']}" for t in timed.values()}))
    batch = f"one batch of {summary['latency_batch']} test examples"
    if len(timed) == 1:
        seed = next(iter(timed))
        return f"Latency: seed {seed}'s models on {batch}, timed interleaved (median and range over rounds), {where}."
    per_seed = "; ".join(
        f"seed {seed}: " + ", ".join(f"{row} {format_latency(stats)}" for row, stats in rows.items() if row != "Single")
        for seed, rows in summary["latency_per_seed"].items()
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
    """The folders whose models an AMP table of a seed is built on, each with its digest file: the seed's (the
    single model), the AMP models' and every AMP base's (the members trained on it)."""
    amp_cache = seed_cache / AMP_CACHE
    return [seed_cache, amp_cache, *(path.parent for path in sorted(amp_cache.glob(f"*/{DIGESTS}")))]


def base_name(delta: float) -> str:
    """The row name of Algorithm 1's model at `delta` (the sweep's), which also names its recovered model and the
    directory of the ensembles built on it."""
    return f"AMP dE={delta:g}"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in name).strip("-").replace("--", "-")
