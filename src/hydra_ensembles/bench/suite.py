"""The comparison of the paper's Tables 1-2 on one task: every baseline and both Hydra Ensembles, per seed,
then mean +- std over seeds as markdown and JSON tables, plus figures.

Rows: Single, Deep Ensembles, Deep Ensembles (D), MC Dropout, Temp. scaling, LoRA Ens., Taylor, CircAvg,
Hydra (Taylor), Hydra (Circ). Everything trained is cached under `cache_dir/<task>-<fingerprint>/seed<k>/`
and reused, and each seed's finished rows are recorded there, so an interrupted benchmark resumes where it
stopped. The cache key includes `Task.fingerprint()`, so a changed recipe or split retrains instead of reusing.

Choices made on validation data only: early stopping of the single and deep-ensemble models, the temperature,
and whether a Hydra Ensemble averages its members' MLPs (the paper's merged MLP) or keeps each member's own
(the lower validation NLL wins; the choice is recorded in the JSON).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from .. import metrics
from ..adapters import get_adapter
from ..cost import predictor_latency
from ..evaluation import plots
from ..evaluation.report import measure
from ..evaluation.tables import CONVENTIONS, aggregate, per_set_lines, table_lines
from ..fusion import HydraEnsemble
from ..importance import Circuit, extract_circuit, taylor_head_scores
from ..io import write_json_atomic
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
from ..training import finetune
from ..uncertainty import ensemble_probs
from ..version import __version__
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
)
PLOTTED = ("Single", "Deep Ensembles", "Hydra (Taylor)", "Hydra (Circ)")


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
    summary = {
        "task": task.name,
        "command": command,
        "seeds": list(seeds),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
        "library_version": __version__,
        "task_fingerprint": task.fingerprint(),
        "notes": task.notes,
        "rows": aggregate(per_seed),
        "per_seed": per_seed,
    }
    if latency_repeats:
        summary["latency"] = timed_rows(task, seeds[0], cache / f"seed{seeds[0]}", per_seed[seeds[0]], latency_repeats)
        summary["latency_batch"] = len(task.test[0]["labels"])
    figures(task, cache / f"seed{seeds[0]}", out_dir)
    summary["wall_time_s"] = round(time.perf_counter() - started, 1)
    summary["compute_s"] = round(sum(r["_seconds"] for s in per_seed.values() for r in s.values()), 1)
    write_json_atomic(out_dir / "table.json", summary)
    (out_dir / "table.md").write_text(markdown(summary))
    return summary


def run_seed(task: Task, seed: int, cache: Path, progress: bool = True, rows: Sequence[str] = ROWS) -> dict[str, dict]:
    """Train (or load) and evaluate `rows` for one seed; returns {row: results}."""
    rows = _check_rows(rows)
    cache.mkdir(parents=True, exist_ok=True)
    record = cache / "results.json"
    results: dict[str, dict] = json.loads(record.read_text()) if record.exists() else {}
    build = _Builder(task, seed, cache, progress)
    for row in rows:
        if row in results:
            continue
        print(f"[{rows.index(row) + 1}/{len(rows)}] {row}", flush=True)
        started = time.perf_counter()
        predictor, heads, extra = build.row(row)
        results[row] = measure(predictor, task.test, task.near, task.far, cache / "logits" / f"{row}.pt") | {
            "heads": heads,
            **extra,
        }
        results[row]["_seconds"] = round(time.perf_counter() - started, 1)
        write_json_atomic(record, results)
    return {row: results[row] for row in rows}


def timed_rows(task: Task, seed: int, cache: Path, results: Mapping[str, dict], repeats: int) -> dict[str, dict]:
    """Latency of every row relative to Single on the first test batch: the rows' predictors (from the cache)
    timed interleaved, `repeats` rounds (`cost.predictor_latency`)."""
    build = _Builder(task, seed, cache, progress=False, mlp_choices={r: v.get("mlp") for r, v in results.items()})
    predictors = {row: build.row(row)[0] for row in results}
    print(f"timing {len(predictors)} rows, interleaved, {repeats} rounds", flush=True)
    return predictor_latency(predictors, {row: task.test[0] for row in predictors}, repeats)


def _check_rows(rows: Sequence[str]) -> list[str]:
    unknown = [row for row in rows if row not in ROWS]
    if unknown:
        raise ValueError(f"unknown row(s) {unknown}; choose from {list(ROWS)}.")
    if "Single" not in rows:
        raise ValueError("rows must include 'Single': every cost ratio is relative to it.")
    return [row for row in ROWS if row in rows]


class _Builder:
    """Builds each row's predictor for one seed, caching every trained model."""

    def __init__(self, task: Task, seed: int, cache: Path, progress: bool, mlp_choices: Mapping | None = None):
        self.task, self.seed, self.cache, self.progress = task, seed, cache, progress
        self._single: nn.Module | None = None
        self.mlp_choices = dict(mlp_choices or {})  # row -> MLP mode chosen before (skips choosing again)

    def row(self, name: str) -> tuple[nn.Module, str, dict]:
        return {
            "Single": self.single_row,
            "Deep Ensembles": self.deep_ensemble,
            "Deep Ensembles (D)": self.deep_ensemble_d,
            "MC Dropout": self.mc_dropout,
            "Temp. scaling": self.temperature,
            "LoRA Ens.": self.lora,
            "Taylor": self.taylor,
            "CircAvg": self.circavg,
            "Hydra (Taylor)": self.hydra_taylor,
            "Hydra (Circ)": self.hydra_circ,
        }[name]()

    # ---- shared pieces ----

    @property
    def heads(self) -> int:
        return get_adapter(self.single()).num_heads(self.single())

    @property
    def layers(self) -> int:
        return get_adapter(self.single()).num_layers(self.single())

    def trained(self, name: str, build: Callable[[], nn.Module]) -> nn.Module:
        """The predictor cached under `name`, built (and cached) on first use."""
        path = self.cache / "models" / name
        if path.exists():
            return load_predictor(path)
        model = build()
        save_predictor(model, path)
        return model

    def single(self) -> nn.Module:
        if self._single is None:
            self._single = self.trained("single", lambda: self.train_from_start(self.seed))
        return self._single

    def train_from_start(self, seed: int) -> nn.Module:
        task = self.task
        return finetune(
            task.new_model(seed),
            task.train,
            task.recipe.with_(seed=seed),
            val_loader=task.val,
            checkpoint_dir=self.cache / "checkpoints" / f"start{seed}",
            progress=self.progress,
        )

    def taylor_scores(self) -> Tensor:
        path = self.cache / "taylor_scores.pt"
        if not path.exists():
            calibration = self.task.train[: max(1, len(self.task.val))]
            torch.save(taylor_head_scores(self.single(), calibration, progress=self.progress), path)
        return torch.load(path)

    def circuit(self) -> Circuit:
        path = self.cache / "circuit_avg.json"
        if not path.exists():
            task = self.task
            budget = max(task.circuit_pool, task.prune_per_layer * self.layers)
            circuit = extract_circuit(
                self.single(),
                task.circuit_id,
                task.circuit_ood,
                "avg",
                budget,
                method=task.circuit_method,
                top=task.circuit_top,
                state_path=self.cache / "circuit_state.json",
                progress=self.progress,
            )
            circuit.save(path)
        return Circuit.load(path)

    def fine_tuned_members(self, prefix: str, head_maps) -> list[nn.Module]:
        members = []
        for m, head_map in enumerate(head_maps):
            seed = self.seed * 100 + m

            def build(head_map=head_map, seed=seed, m=m) -> nn.Module:
                member = build_members(self.single(), [head_map])[0]
                return finetune(
                    member,
                    self.task.train,
                    self.task.member_recipe.with_(seed=seed),
                    checkpoint_dir=self.cache / "checkpoints" / f"{prefix}{m}",
                    progress=self.progress,
                )

            members.append(self.trained(f"{prefix}{m}", build))
        return members

    def fused(self, members: list[nn.Module], row: str) -> tuple[HydraEnsemble, dict]:
        """Average or stack the members' MLPs, whichever gives the lower validation NLL."""
        if self.mlp_choices.get(row):
            return HydraEnsemble.fuse(members, mlp=self.mlp_choices[row]), {"mlp": self.mlp_choices[row]}
        val_labels = labels_of(self.task.val)
        options = {}
        for mode in ("average", "stack"):
            ensemble = HydraEnsemble.fuse(members, mlp=mode)
            probs = ensemble_probs(collect_member_logits(ensemble, self.task.val))
            options[mode] = (metrics.nll(probs, val_labels), ensemble)
        mode = min(options, key=lambda k: options[k][0])
        return options[mode][1], {"mlp": mode, "val_nll": {k: v[0] for k, v in options.items()}}

    # ---- rows ----

    def single_row(self):
        return self.single(), str(self.heads), {}

    def deep_ensemble(self):
        others = [
            self.trained(f"start{self.seed}-{m}", lambda m=m: self.train_from_start(self.seed * 100 + 50 + m))
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

    def taylor(self):
        budget = self.task.prune_per_layer
        head_maps = sample_members(self.taylor_scores(), num_members=1, budget=budget, pool=budget)
        model = self.fine_tuned_members("taylor", head_maps)[0]
        return model, str(self.heads - budget), {}

    def circavg(self):
        head_map = self.circuit().head_map(self.task.prune_per_layer * self.layers)
        model = self.fine_tuned_members("circavg", [head_map])[0]
        return model, f"{self.heads - self.task.prune_per_layer} (avg)", {}

    def hydra_taylor(self):
        task = self.task
        head_maps = sample_members(
            self.taylor_scores(),
            num_members=task.members,
            budget=task.prune_per_layer,
            pool=task.taylor_pool,
            seed=self.seed,
        )
        ensemble, extra = self.fused(self.fine_tuned_members("hydra-taylor", head_maps), "Hydra (Taylor)")
        return ensemble, f"{self.heads - task.prune_per_layer}x{task.members}", extra | {"head_maps": head_maps}

    def hydra_circ(self):
        task = self.task
        head_maps = sample_members(
            self.circuit(),
            num_members=task.members,
            budget=task.prune_per_layer * self.layers,
            pool=task.circuit_pool,
            seed=self.seed,
        )
        ensemble, extra = self.fused(self.fine_tuned_members("hydra-circ", head_maps), "Hydra (Circ)")
        heads = f"{self.heads - task.prune_per_layer}x{task.members} (avg)"
        return ensemble, heads, extra | {"head_maps": head_maps}


# ---- tables ----


def figures(task: Task, seed_cache: Path, out_dir: Path) -> None:
    """Reliability diagrams, MSP histograms (ID / near / far) and Taylor / circuit head heatmaps of one seed."""
    logits = {
        row: torch.load(seed_cache / "logits" / f"{row}.pt")
        for row in PLOTTED
        if (seed_cache / "logits" / f"{row}.pt").exists()
    }
    plots.logit_figures(logits, labels_of(task.test), out_dir, task.name)
    maps = {}
    if (seed_cache / "taylor_scores.pt").exists():
        maps["Taylor score"] = torch.load(seed_cache / "taylor_scores.pt")
    if (seed_cache / "circuit_avg.json").exists():
        maps["CircAvg removal step (late = useful)"] = Circuit.load(seed_cache / "circuit_avg.json").removal_steps()
    if maps:
        plots.head_heatmap(maps, out_dir / "head_importance.png", title=f"{task.name}: head importance")


def markdown(summary: dict) -> str:
    lines = [
        f"# {summary['task']}: Hydra Ensembles vs baselines",
        "",
        f"Command: `{summary['command']}`  ",
        f"Machine: {summary['machine']}  ",
        f"Seeds: {summary['seeds']} "
        + ("(mean ± std over seeds)  " if len(summary["seeds"]) > 1 else "(one run: values without a spread)  "),
        f"Wall time: {summary['wall_time_s'] / 60:.1f} min for this run (training compute recorded over all "
        f"runs that filled the cache: {summary['compute_s'] / 60:.1f} min)",
        "",
        *table_lines(summary["rows"], summary.get("latency")),
        "",
        CONVENTIONS,
        "",
    ]
    lines += [f"- {note}" for note in summary["notes"]]
    chosen = {s: r["Hydra (Circ)"].get("mlp") for s, r in summary["per_seed"].items() if "Hydra (Circ)" in r}
    chosen_t = {s: r["Hydra (Taylor)"].get("mlp") for s, r in summary["per_seed"].items() if "Hydra (Taylor)" in r}
    lines.append(f"- MLP fusion chosen on validation NLL per seed: Hydra (Taylor) {chosen_t}, Hydra (Circ) {chosen}.")
    lines += ["", "Per OOD set (AUROC %, mean over seeds):", "", *per_set_lines(summary["per_seed"])]
    return "\n".join(lines) + "\n"
