"""The comparison of the paper's Tables 1-2 on one task: every baseline and both Hydra Ensembles, per seed,
then mean +- std over seeds as markdown and JSON tables, plus figures.

Rows (`ROWS`): Single, Deep Ensembles, Deep Ensembles (D), MC Dropout, Temp. scaling, LoRA Ens., Taylor,
CircAvg, Hydra (Taylor), Hydra (Circ) — the paper's method: sequential Taylor scores (§D.1.1), circuits by
greedy removal (§D.1.2; exact, or the approximation a task names where exact is out of reach), fine-tuned
members fused with the merged (averaged) MLP (§4.2) — and the variant that keeps each member's own MLP, as its
own labelled rows (same members, exact fusion, more parameters).
`REVIEW_ROWS` answer reviewers' questions (paper §B.1-B.3): Taylor / CircAvg / Hydra (Circ) without
fine-tuning (Table 4), CircAcc and CircOOD next to CircAvg (Table 6); `head_sweep` gives Figures 5-6.

Everything trained is cached under `cache_dir/<task>-<fingerprint>/seed<k>/` and reused, and each seed's
finished rows are recorded there, so an interrupted benchmark resumes where it stopped. The cache key includes
`Task.fingerprint()`, so a changed recipe or split retrains instead of reusing. Choices made on validation
data only: early stopping of the single and deep-ensemble models, and the temperature; no row is chosen or
dropped after seeing test data.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from ..adapters import get_adapter
from ..cost import machine, predictor_latency
from ..evaluation import plots
from ..evaluation.report import measure
from ..evaluation.tables import CONVENTIONS, aggregate, mean_std, per_set_lines, render, table_lines
from ..fusion import HydraEnsemble
from ..importance import Circuit, extract_circuit, taylor_head_scores
from ..io import read_json_record, row_file, torch_save_atomic, weights_digest, write_json_atomic
from ..members import build_members, sample_members
from ..outputs import collect_member_logits, labels_of
from ..predictors import (
    DeepEnsemble,
    MCDropout,
    TemperatureScaled,
    fit_temperature,
    load_predictor,
    lora_ensemble,
    save_predictor,
    shared_backbone_ensemble,
)
from ..pruning import kept_neurons
from ..training import finetune
from ..version import __version__
from .records import (
    check_by_metrics,
    check_digest,
    discard_stale_state,
    has_measured_rebuild,
    rebuilt_notes,
    record_measured_apart,
    recorded_latency,
    unchecked,
)
from .tasks import Task

ROWS = (
    "Single",
    "Deep Ensembles",
    "Deep Ensembles (D)",
    "MC Dropout",
    "Temp. scaling",
    "LoRA Ens.",
    "Taylor",
    "CircAvg",
    "Hydra (Taylor)",
    "Hydra (Circ)",
    "Hydra (Taylor), stacked MLP",
    "Hydra (Circ), stacked MLP",
)
REVIEW_ROWS = (
    "Taylor, no fine-tuning",
    "CircAvg, no fine-tuning",
    "Hydra (Circ), no fine-tuning",
    "CircAcc",
    "CircOOD",
)
ALL_ROWS = ROWS + REVIEW_ROWS
PLOTTED = ("Single", "Deep Ensembles", "Hydra (Taylor)", "Hydra (Circ)")


TRAINING = "training.json"  # {model name: its epochs (loss, validation metrics) and the epoch kept}, per seed


def run(
    task: Task,
    seeds: Sequence[int],
    out_dir: str | os.PathLike,
    cache_dir: str | os.PathLike,
    command: str = "",
    progress: bool = True,
    rows: Sequence[str] = ROWS,
    latency_repeats: int = 7,
) -> dict:
    """Run `rows` (default: all) for every seed, reusing the cache; write table.md, table.json and figures to
    `out_dir`. Latency relative to Single is timed at the end, every row interleaved with the others over
    `latency_repeats` rounds on one test batch (0: not timed)."""
    started = time.perf_counter()
    rows = _check_rows(rows)
    out_dir, cache = Path(out_dir), Path(cache_dir) / f"{task.name}-{task.fingerprint()}"
    per_seed = {seed: run_seed(task, seed, cache / f"seed{seed}", progress, rows) for seed in seeds}
    summary = run_record(task.name, command, seeds) | {
        "task_fingerprint": task.fingerprint(),
        "notes": task.notes,
        "ood_sets": [*task.near, *task.far],
        "rows": aggregate(per_seed),
        "per_seed": per_seed,
        "circuit_search": circuit_searches(per_seed),
        "measured_on": measured_on(per_seed),
    }
    summary["notes"] = summary["notes"] + [
        note for seed in seeds for note in rebuilt_notes(seed, cache / f"seed{seed}")
    ]
    if latency_repeats:
        first = cache / f"seed{seeds[0]}"
        summary["latency"], summary["latency_timed"] = recorded_latency(
            first / "latency.json",
            list(per_seed[seeds[0]]),
            lambda: timed_rows(task, seeds[0], first, per_seed[seeds[0]], latency_repeats),
        )
        summary["latency_batch"] = len(task.test[0]["labels"])
    figures(task, cache / f"seed{seeds[0]}", out_dir)
    summary["wall_time_s"] = round(time.perf_counter() - started, 1)
    summary["compute_s"] = round(sum(r["_seconds"] for s in per_seed.values() for r in s.values()), 1)
    write_json_atomic(out_dir / "table.json", summary)
    (out_dir / "table.md").write_text(markdown(summary))
    return summary


def run_seed(
    task: Task,
    seed: int,
    cache: Path,
    progress: bool = True,
    rows: Sequence[str] = ROWS,
    base: Callable[[], nn.Module] | None = None,
) -> dict[str, dict]:
    """Train (or load) and evaluate `rows` for one seed; returns {row: results}. `base` gives the model that the
    Single row stands for and every pruned row starts from (default: the task's model, fine-tuned here), e.g.
    an MLP-pruned single model (`bench.amp`); `cache` must then be that base's own directory."""
    rows = _check_rows(rows)
    cache.mkdir(parents=True, exist_ok=True)
    record = cache / "results.json"
    results: dict[str, dict] = read_json_record(record)
    build = _Builder(task, seed, cache, progress, base)
    for row in rows:
        if row in results:
            continue
        print(f"[{rows.index(row) + 1}/{len(rows)}] {row}", flush=True)
        started = time.perf_counter()
        predictor, heads, extra = build.row(row)
        results[row] = measure(predictor, task.test, task.near, task.far, row_file(cache / "logits", row)) | {
            "heads": heads,
            **extra,
        }
        results[row]["_seconds"] = round(time.perf_counter() - started, 1)
        results[row]["_measured"] = {"machine": machine(), "date": datetime.date.today().isoformat()}
        write_json_atomic(record, results)
    return {row: results[row] for row in rows}


def measured_on(per_seed: Mapping[int, Mapping[str, dict]]) -> dict[str, int]:
    """{machine: how many (seed, row) results were measured on it}: a table rendered from records says where its
    rows ran, not only where it was rendered. Results recorded before they kept their machine count as "not
    recorded"."""
    machines: dict[str, int] = {}
    for results in per_seed.values():
        for result in results.values():
            where = result.get("_measured", {}).get("machine", "not recorded")
            machines[where] = machines.get(where, 0) + 1
    return dict(sorted(machines.items()))  # as table.json keeps it: a table rendered again reads the same


def circuit_searches(per_seed: Mapping[int, Mapping[str, dict]]) -> dict[str, str]:
    """{seed: the search that ranked its CircAvg circuit ("exact", or the approximation and why)}, as the rows
    built on that circuit recorded it."""
    searches = {}
    for seed, results in per_seed.items():
        recorded = [r["circuit_search"] for r in results.values() if "circuit_search" in r]
        if recorded:
            searches[str(seed)] = recorded[0]
    return searches


def timed_rows(task: Task, seed: int, cache: Path, results: Mapping[str, dict], repeats: int) -> dict[str, dict]:
    """Latency of every row relative to Single on the first test batch: the rows' predictors (from the cache)
    timed interleaved, `repeats` rounds (`cost.predictor_latency`)."""
    build = _Builder(task, seed, cache, progress=False)
    return time_predictors({row: build.row(row)[0] for row in results}, task.test[0], repeats)


def time_predictors(predictors: Mapping[str, nn.Module], batch: Mapping, repeats: int) -> dict[str, dict]:
    """`cost.predictor_latency` of every predictor on the same batch, relative to the first, saying so."""
    print(f"timing {len(predictors)} rows, interleaved, {repeats} rounds", flush=True)
    return predictor_latency(predictors, {row: batch for row in predictors}, repeats)


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


def suite_predictor(
    task: Task,
    seed: int,
    seed_cache: Path,
    row: str,
    progress: bool = True,
    base: Callable[[], nn.Module] | None = None,
) -> nn.Module:
    """The predictor of one row of the table for one seed, from (or into) the seed's cache directory: what other
    experiments build on (e.g. the teachers that distillation compresses). `base` as in `run_seed`."""
    _check_rows([row, "Single"])  # an unknown row is refused by name
    seed_cache.mkdir(parents=True, exist_ok=True)
    return _Builder(task, seed, seed_cache, progress, base).row(row)[0]


def _check_rows(rows: Sequence[str]) -> list[str]:
    unknown = [row for row in rows if row not in ALL_ROWS]
    if unknown:
        raise ValueError(f"unknown row(s) {unknown}; choose from {list(ALL_ROWS)}.")
    if "Single" not in rows:
        raise ValueError("rows must include 'Single': every cost ratio is relative to it.")
    return [row for row in ALL_ROWS if row in rows]


class _Builder:
    """Builds each row's predictor for one seed, caching every trained model."""

    def __init__(self, task: Task, seed: int, cache: Path, progress: bool, base: Callable[[], nn.Module] | None = None):
        self.task, self.seed, self.cache, self.progress, self.base = task, seed, cache, progress, base
        self._single: nn.Module | None = None

    def row(self, name: str) -> tuple[nn.Module, str, dict]:
        return {
            "Single": self.single_row,
            "Deep Ensembles": self.deep_ensemble,
            "Deep Ensembles (D)": self.deep_ensemble_d,
            "MC Dropout": self.mc_dropout,
            "Temp. scaling": self.temperature,
            "LoRA Ens.": self.lora,
            "Taylor": self.taylor,
            "CircAvg": lambda: self.circuit_row("avg"),
            "Hydra (Taylor)": lambda: self.hydra_taylor("average"),
            "Hydra (Circ)": lambda: self.hydra_circ("average"),
            "Hydra (Taylor), stacked MLP": lambda: self.hydra_taylor("stack"),
            "Hydra (Circ), stacked MLP": lambda: self.hydra_circ("stack"),
            "Taylor, no fine-tuning": lambda: self.taylor(fine_tune=False),
            "CircAvg, no fine-tuning": lambda: self.circuit_row("avg", fine_tune=False),
            "Hydra (Circ), no fine-tuning": lambda: self.hydra_circ("average", fine_tune=False),
            "CircAcc": lambda: self.circuit_row("acc"),
            "CircOOD": lambda: self.circuit_row("ood"),
        }[name]()

    # ---- shared pieces ----

    @property
    def shape(self) -> dict:
        """{"heads": per layer, "layers", "widths": [MLP hidden size per block]} of the single model, recorded in
        `shape.json` so that tables render from the records without the model."""
        path = self.cache / "shape.json"
        if not path.exists():
            single, adapter = self.single(), get_adapter(self.single())
            widths = [len(kept) for kept in kept_neurons(single).values()]
            shape = {"heads": adapter.num_heads(single), "layers": adapter.num_layers(single), "widths": widths}
            write_json_atomic(path, shape)
        return json.loads(path.read_text())

    @property
    def heads(self) -> int:
        return self.shape["heads"]

    @property
    def layers(self) -> int:
        return self.shape["layers"]

    def trained(self, name: str, build: Callable[[], nn.Module], checkpoint: str | None = None) -> nn.Module:
        """The predictor cached under `name`, built (and cached) on first use, checked against its digest."""
        model = self.cached(name, build, checkpoint)
        check_digest(self.cache, name, model)  # recorded, or compared with the record (`bench.records`)
        return model

    def cached(self, name: str, build: Callable[[], nn.Module], checkpoint: str | None = None) -> nn.Module:
        """The predictor cached under `name`, or `build()`'s, cached now. `checkpoint`: the folder under
        checkpoints/ that `build` trains in (to resume after a stop), deleted once the model is saved: it holds
        the optimiser state and a copy of the best weights, ~4x the model (1.7 GB for MPNet-base)."""
        path = self.cache / "models" / name
        if path.exists():
            return load_predictor(path)
        model = build()
        if hasattr(model, "training_history"):  # a record: why an epoch was kept, checkable without the weights
            epochs = {"epochs": model.training_history, "kept_epoch": model.kept_epoch}
            # Before the weights: a stop in between rebuilds the model and rewrites this, never loses it.
            write_json_atomic(self.cache / TRAINING, read_json_record(self.cache / TRAINING) | {name: epochs})
        save_predictor(model, path)
        if checkpoint is not None:
            shutil.rmtree(self.cache / "checkpoints" / checkpoint, ignore_errors=True)
        return model

    def single(self) -> nn.Module:
        if self._single is None and self.base:
            self._single = self.base()
        elif self._single is None and unchecked(self.cache, "single"):
            self._single = self.single_checked_by_metrics()
        elif self._single is None:
            self._single = self.cached("single", *self.from_start(self.seed))
            if not check_digest(self.cache, "single", self._single):
                self.measure_rebuilt_single()
        return self._single

    def measure_rebuilt_single(self) -> None:
        """A single model built again with other weights than the recorded rows were measured on (another kind
        of machine trains differently) is measured once as the Single row, beside the recorded one ("Single,
        trained again"), so that the table's note says how far apart the two builds measure. Only where the
        standard table recorded its Single row (the head sweep's own Single row is not compared)."""
        recorded, digest = read_json_record(self.cache / "results.json"), weights_digest(self._single)
        if "Single" not in recorded or has_measured_rebuild(self.cache, "single", digest):
            return
        record_measured_apart(self.cache, "single", digest, recorded["Single"], self.measured_as_single(self._single))

    def measured_as_single(self, model: nn.Module) -> dict:
        """`model` measured as the Single row, its logits kept as "Single, trained again" (beside the row's)."""
        task = self.task
        return measure(model, task.test, task.near, task.far, self.trained_again_logits())

    def trained_again_logits(self) -> Path:
        return row_file(self.cache / "logits", "Single, trained again")

    def single_checked_by_metrics(self) -> nn.Module:
        """The single model of a seed whose rows were recorded before digests existed (trained again, or loaded
        if a run stopped before checking it), checked by measuring it as the Single row and comparing with the
        recorded one (`records.check_by_metrics`). Agreeing, its logits become the row's, lost with the first
        machine; otherwise they stay beside them as "Single, trained again"."""
        recorded = json.loads((self.cache / "results.json").read_text())
        if "Single" not in recorded:
            warnings.warn(
                f"{self.cache} records finished rows but neither the single model's digest nor its row: the single "
                "model trained now cannot be checked against the one the recorded rows were measured on.",
                stacklevel=3,
            )
            return self.trained("single", *self.from_start(self.seed))
        model = self.cached("single", *self.from_start(self.seed))
        if check_by_metrics(self.cache, "single", model, recorded["Single"], self.measured_as_single(model)):
            # the recorded row's logits, lost with its machine
            os.replace(self.trained_again_logits(), row_file(self.cache / "logits", "Single"))
            print(f"{self.cache}: the single model trained again measures as its recorded row", flush=True)
        return model

    def from_start(self, seed: int) -> tuple[Callable[[], nn.Module], str]:
        """`cached`'s build and checkpoint for a model fine-tuned from the pretrained weights with `seed`."""
        return (lambda: self.train_from_start(seed)), _start(seed)

    def train_from_start(self, seed: int) -> nn.Module:
        task = self.task
        return finetune(
            task.new_model(seed),
            task.train,
            task.recipe.with_(seed=seed),
            val_loader=task.val,
            checkpoint_dir=self.cache / "checkpoints" / _start(seed),
            progress=self.progress,
        )

    def taylor_scores(self, budget: int | None = None) -> Tensor:
        """Sequential Taylor scores (§D.1.1): layer by layer, the layer's `budget` (default: the task's
        `prune_per_layer`) lowest heads are pruned before the next layer is scored."""
        budget = self.task.prune_per_layer if budget is None else budget
        suffix = "" if budget == self.task.prune_per_layer else f"_b{budget}"
        path = self.cache / f"taylor_scores_sequential{suffix}.pt"
        if not path.exists():
            calibration = self.task.train[: max(1, len(self.task.val))]
            scores = taylor_head_scores(self.single(), calibration, sequential_budget=budget, progress=self.progress)
            torch_save_atomic(scores, path)
        return torch.load(path)

    def circuit(self, criterion: str = "avg") -> Circuit:
        path = self.cache / f"circuit_{criterion}.json"
        if not path.exists():
            discard_stale_state(self.cache / f"circuit_{criterion}_state.json", self.single())
            task = self.task
            budget = max(task.circuit_pool, task.prune_per_layer * self.layers)
            circuit = extract_circuit(
                self.single(),
                task.circuit_id,
                task.circuit_ood,
                criterion,
                budget,
                method=task.circuit_method,
                top=task.circuit_top,
                precision=task.circuit_precision,
                state_path=self.cache / f"circuit_{criterion}_state.json",
                progress=self.progress,
            )
            circuit.save(path)
        return Circuit.load(path)

    def fine_tuned_members(self, prefix: str, head_maps, fine_tune: bool = True) -> list[nn.Module]:
        if not fine_tune:  # the pruned copies as they are (zero-shot, paper Table 4)
            return build_members(self.single(), head_maps)
        members = []
        for m, head_map in enumerate(head_maps):
            seed = self.seed * 100 + m
            name = f"{prefix}{m}-{_digest(head_map)}"  # the head map is part of what is cached

            def build(head_map=head_map, seed=seed, name=name) -> nn.Module:
                member = build_members(self.single(), [head_map])[0]
                return finetune(
                    member,
                    self.task.train,
                    self.task.member_recipe.with_(seed=seed),
                    checkpoint_dir=self.cache / "checkpoints" / name,
                    progress=self.progress,
                )

            members.append(self.trained(name, build, checkpoint=name))
        return members

    @staticmethod
    def fused(members: list[nn.Module], mlp: str) -> tuple[HydraEnsemble, dict]:
        ensemble = HydraEnsemble.fuse(members, mlp=mlp)
        return ensemble, {"mlp": mlp, "averaged": len(ensemble.averaged)}

    # ---- rows ----

    def single_row(self):
        return self.single(), str(self.heads), {}

    def deep_ensemble(self):
        others = [
            self.trained(f"start{self.seed}-{m}", *self.from_start(self.seed * 100 + 50 + m))
            for m in range(1, self.task.members)
        ]
        return DeepEnsemble([self.single(), *others]), f"{self.heads}x{self.task.members}", {}

    def deep_ensemble_d(self):
        seeds = [self.seed * 100 + m for m in range(self.task.members)]
        ensemble = self.trained(
            "deep-ensemble-d",
            lambda: shared_backbone_ensemble(
                self.single(), self.task.train, seeds, epochs=self.task.head_epochs, progress=self.progress
            ),
        )
        return ensemble, f"{self.heads}", {}

    def mc_dropout(self):
        return (
            MCDropout(self.single(), samples=self.task.mc_samples, seed=self.seed),
            f"{self.heads}",
            {"samples": self.task.mc_samples},
        )

    def temperature(self):
        val = collect_member_logits(self.single(), self.task.val)
        temperature = fit_temperature(val, labels_of(self.task.val))
        return TemperatureScaled(self.single(), temperature), f"{self.heads}", {"temperature": temperature}

    def lora(self):
        task = self.task
        seeds = [self.seed * 100 + m for m in range(task.members)]

        def build() -> nn.Module:
            base = self.single() if task.lora_from_single else task.new_model(self.seed)
            return lora_ensemble(base, task.train, task.lora_recipe, seeds, progress=self.progress)

        return self.trained("lora", build), f"{self.heads}x{task.members}", {}

    def taylor(self, fine_tune: bool = True):
        budget = self.task.prune_per_layer
        head_maps = sample_members(self.taylor_scores(), num_members=1, budget=budget, pool=budget)
        model = self.fine_tuned_members("taylor", head_maps, fine_tune)[0]
        return model, str(self.heads - budget), {}

    def circuit_row(self, criterion: str, fine_tune: bool = True):
        circuit = self.circuit(criterion)
        head_map = circuit.head_map(self.task.prune_per_layer * self.layers)
        model = self.fine_tuned_members(f"circ{criterion}", [head_map], fine_tune)[0]
        searched = {"circuit_search": _search(circuit)} if criterion == "avg" else {}  # the table names CircAvg's
        return model, f"{self.heads - self.task.prune_per_layer} (avg)", searched

    def hydra_taylor(self, mlp: str):
        task = self.task
        head_maps = sample_members(
            self.taylor_scores(),
            num_members=task.members,
            budget=task.prune_per_layer,
            pool=task.taylor_pool,
            seed=self.seed,
        )
        ensemble, extra = self.fused(self.fine_tuned_members("hydra-taylor", head_maps), mlp)
        heads = f"{self.heads - task.prune_per_layer}x{task.members}"
        return ensemble, heads, extra | {"head_maps": _recorded(head_maps)}

    def hydra_circ(self, mlp: str, fine_tune: bool = True):
        task = self.task
        head_maps = sample_members(
            self.circuit(),
            num_members=task.members,
            budget=task.prune_per_layer * self.layers,
            pool=task.circuit_pool,
            seed=self.seed,
        )
        ensemble, extra = self.fused(self.fine_tuned_members("hydra-circ", head_maps, fine_tune), mlp)
        heads = f"{self.heads - task.prune_per_layer}x{task.members} (avg)"
        return ensemble, heads, extra | {"head_maps": _recorded(head_maps), "circuit_search": _search(self.circuit())}


# ---- Figures 5-6: the number of heads pruned ----

SWEEP_COLUMNS = (("Acc", "id", "acc"), ("AUROC all", "all", "auroc"), ("FPR95 all", "all", "fpr95"))


def head_sweep(
    task: Task,
    seeds: Sequence[int],
    budgets: Sequence[int],
    out_dir: str | os.PathLike,
    cache_dir: str | os.PathLike,
    command: str = "",
    progress: bool = True,
) -> dict:
    """Paper §B.3, Figures 5-6: Taylor and CircAvg models pruning b heads per layer, for each b in `budgets`,
    without fine-tuning (Fig. 5) and fine-tuned (Fig. 6), against Single. Shares the benchmark's cache (the
    single model, the CircAvg circuit, and any pruned model the main table trained). Writes sweep.md,
    sweep.json and head_sweep.png to `out_dir`."""
    started = time.perf_counter()
    out_dir, cache = Path(out_dir), Path(cache_dir) / f"{task.name}-{task.fingerprint()}"
    per_seed = {seed: sweep_seed(task, seed, budgets, cache / f"seed{seed}", progress) for seed in seeds}
    summary = {
        "task": task.name,
        "command": command,
        "seeds": list(seeds),
        "budgets": list(budgets),
        "machine": machine(),
        "rows": aggregate(per_seed),
        "per_seed": per_seed,
        "notes": [note for seed in seeds for note in rebuilt_notes(seed, cache / f"seed{seed}")],
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    write_json_atomic(out_dir / "sweep.json", summary)
    (out_dir / "sweep.md").write_text(sweep_markdown(summary))
    plots.sweep_figure(summary, out_dir / "head_sweep.png")
    return summary


def sweep_seed(task: Task, seed: int, budgets: Sequence[int], cache: Path, progress: bool = True) -> dict[str, dict]:
    """{row: results} for one seed; rows "Single" and "<Taylor|CircAvg>, <b> pruned/layer, <zero-shot|tuned>"."""
    cache.mkdir(parents=True, exist_ok=True)
    record = cache / "sweep.json"
    results: dict[str, dict] = read_json_record(record)
    build = _Builder(task, seed, cache, progress)
    layers = build.layers
    ranked = max(task.circuit_pool, task.prune_per_layer * layers)  # what `_Builder.circuit` extracts
    for budget in budgets:
        if not 0 < budget < build.heads:
            raise ValueError(f"budgets must be between 1 and {build.heads - 1} heads per layer, got {budget}.")
        if budget * layers > ranked:
            raise ValueError(
                f"a budget of {budget} heads per layer needs {budget * layers} heads of the CircAvg circuit, which "
                f"ranks {ranked} (the task's circuit_pool): use budgets up to {ranked // layers}."
            )
    plans = {"Single": lambda: build.single()}
    for budget in budgets:
        taylor = lambda b=budget: sample_members(build.taylor_scores(b), num_members=1, budget=b, pool=b)[0]  # noqa: E731
        circuit = lambda b=budget: build.circuit("avg").head_map(b * layers)  # noqa: E731
        for method, head_map, prefix in (("Taylor", taylor, "taylor"), ("CircAvg", circuit, "circavg")):
            for tuned in (False, True):
                row = f"{method}, {budget} pruned/layer, {'fine-tuned' if tuned else 'zero-shot'}"
                plans[row] = lambda h=head_map, p=prefix, t=tuned: build.fine_tuned_members(p, [h()], t)[0]
    for row, make in plans.items():
        if row in results:
            continue
        print(f"[sweep] {row}", flush=True)
        results[row] = measure(make(), task.test, task.near, task.far, row_file(cache / "sweep-logits", row))
        results[row]["heads"] = row.split(", ")[1] if "pruned" in row else str(build.heads)
        write_json_atomic(record, results)
    return {row: results[row] for row in plans}


def sweep_markdown(summary: dict) -> str:
    header = ["Model", *(c[0] for c in SWEEP_COLUMNS), "Params (M)"]
    body = []
    for row, stats in summary["rows"].items():
        cells = [mean_std(stats.get(f"{where}.{key}"), 100, 1) for _, where, key in SWEEP_COLUMNS]
        body.append([row, *cells, f"{stats['params']['mean'] / 1e6:.2f}"])
    lines = [
        f"# {summary['task']}: pruning b heads per layer (paper Figures 5-6)",
        "",
        f"Command: `{summary['command']}`  ",
        f"Machine: {summary['machine']}  ",
        f"Seeds: {summary['seeds']}; budgets (heads pruned per layer): {summary['budgets']}  ",
        f"Wall time: {summary['wall_time_s'] / 60:.1f} min for this run",
        "",
        *render(header, body, "markdown"),
        "",
        "Taylor: sequential Taylor scores computed for each budget; CircAvg: the first b x layers heads of the "
        "CircAvg circuit. Zero-shot: pruned and evaluated as is; fine-tuned: the task's recipe for pruned models. "
        "Values in %, mean ± std over seeds; OOD by maximum softmax probability, OOD = positive.",
        *(f"\n{note}" for note in summary.get("notes", [])),
    ]
    return "\n".join(lines) + "\n"


def _search(circuit: Circuit) -> str:
    """How a circuit was ranked, as the tables say it: the search, the reason when it is an approximation, and how
    many of its removals were ties."""
    said = circuit.search + (f" ({circuit.note})" if circuit.note else "")
    return said + (f" — {circuit.tie_note()}" if circuit.tie_note() else "")


def _start(seed: int) -> str:
    """The checkpoint folder of a model fine-tuned from the pretrained weights with `seed`."""
    return f"start{seed}"


def _recorded(head_maps: Sequence[Mapping[int, Sequence[int]]]) -> list[dict[str, list[int]]]:
    """Head maps as a results file holds them (JSON keys are strings): the same whether a table is rendered
    right after the run or later from its records."""
    return [{str(layer): list(heads) for layer, heads in head_map.items()} for head_map in head_maps]


def _digest(head_map: Mapping[int, Sequence[int]]) -> str:
    text = json.dumps({str(layer): sorted(heads) for layer, heads in sorted(head_map.items())})
    return hashlib.sha256(text.encode()).hexdigest()[:8]


# ---- tables ----


def figures(task: Task, seed_cache: Path, out_dir: Path) -> None:
    """Reliability diagrams, MSP histograms (ID / near / far) and Taylor / circuit head heatmaps of one seed."""
    paths = {row: row_file(seed_cache / "logits", row) for row in PLOTTED}
    logits = {row: torch.load(path) for row, path in paths.items() if path.exists()}
    if logits:  # none when the seed's rows came from records without their logits: the figures are left as they are
        plots.logit_figures(logits, labels_of(task.test), out_dir, task.name)
    maps = {}
    if (seed_cache / "taylor_scores_sequential.pt").exists():
        maps["Taylor score (sequential)"] = torch.load(seed_cache / "taylor_scores_sequential.pt")
    if (seed_cache / "circuit_avg.json").exists():
        maps["CircAvg removal step (late = useful)"] = Circuit.load(seed_cache / "circuit_avg.json").removal_steps()
    if maps:
        plots.head_heatmap(maps, out_dir / "head_importance.png", title=f"{task.name}: head importance")


def disagreement_lines(rows: Mapping[str, dict]) -> list[str]:
    """Members' disagreement on the test set, run one by one (the stacked-MLP fusion is exact) and fused with the
    merged MLP: does averaging the MLPs make the members agree?"""
    pairs = [
        (r, f"{r}, stacked MLP")
        for r in ("Hydra (Taylor)", "Hydra (Circ)")
        if all("id.disagreement" in rows.get(name, {}) for name in (r, f"{r}, stacked MLP"))
    ]
    if not pairs:
        return []
    lines = [
        "",
        "Members' disagreement on the test set (mean over seeds): the fraction of member pairs whose top-1 classes "
        "differ, and the mean mutual information (nats), for the members run one by one (= stacked MLP, exact) and "
        "after fusion with the merged MLP:",
        "",
    ]
    header = ["Members", "disagreement one by one", "after fusion", "MI one by one", "after fusion"]
    body = [
        [fused]
        + [f"{100 * rows[r]['id.disagreement']['mean']:.1f} %" for r in (separate, fused)]
        + [f"{rows[r]['id.mi']['mean']:.4f}" for r in (separate, fused)]
        for fused, separate in pairs
    ]
    return lines + render(header, body, "markdown")


def measured_on_lines(summary: dict) -> list[str]:
    """Where the rows were measured, when that is not only the machine of this run."""
    machines = summary.get("measured_on", {})
    if list(machines) in ([], [summary["machine"]]):
        return []
    counts = "; ".join(f"{where} ({count})" for where, count in machines.items())
    return [f"Rows (seed, row) measured on: {counts}  "]


def latency_timed_lines(summary: dict) -> list[str]:
    """Where and when the latency column was timed (it may come from the records of an earlier run)."""
    if "latency_timed" not in summary:
        return []
    timed = summary["latency_timed"]
    return [f"Latency: batch of {summary['latency_batch']}, timed {timed['date']} on {timed['machine']}  "]


def markdown(summary: dict) -> str:
    lines = [
        f"# {summary['task']}: Hydra Ensembles vs baselines",
        "",
        f"Command: `{summary['command']}`  ",
        f"Machine (this run): {summary['machine']}  ",
        *measured_on_lines(summary),
        f"Seeds: {summary['seeds']} "
        + ("(mean ± std over seeds)  " if len(summary["seeds"]) > 1 else "(one run: values without a spread)  "),
        f"Wall time: {summary['wall_time_s'] / 60:.1f} min for this run (training compute recorded over all "
        f"runs that filled the cache: {summary['compute_s'] / 60:.1f} min)",
        *latency_timed_lines(summary),
        "",
        *table_lines(summary["rows"], summary.get("latency")),
        "",
        CONVENTIONS,
        "",
    ]
    lines += [f"- {note}" for note in summary["notes"]]
    lines.append(
        "- Hydra (Taylor) and Hydra (Circ) are the paper's method: sequential Taylor scores, circuits by greedy "
        "removal (the search below), members fine-tuned and fused with the merged (averaged) MLP. The rows '…, "
        "stacked MLP' fuse the same members keeping each one's own MLP (exact, more parameters)."
    )
    if summary.get("circuit_search"):
        searches = "; ".join(f"seed {seed}: {search}" for seed, search in summary["circuit_search"].items())
        lines.append(f"- Circuit search (CircAvg ranking): {searches}.")
    lines += [
        "",
        "Per OOD set (AUROC %, mean over seeds):",
        "",
        *per_set_lines(summary["per_seed"], summary.get("ood_sets")),
    ]
    lines += disagreement_lines(summary["rows"])
    return "\n".join(lines) + "\n"
