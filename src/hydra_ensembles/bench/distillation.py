"""Paper 001's experiments: Hydra distillation against knowledge distillation (KD), in the shape of its Tables 1-4.

spiral      a 10-member MLP ensemble on the 3-class spiral, distilled; model-uncertainty maps (Fig. 2)
regression  a 5-member heteroscedastic MLP ensemble on scikit-learn's diabetes set; test NLL (Table 4)
text|image  the benchmark tasks' Deep Ensemble and Hydra Ensemble distilled into transformer students (body =
            the first L - k layers, each head = the last k layers + classifier), against the single model

Every student starts from one head trained on the ensemble mean (the KD row), then grows one head per member.
Chosen on validation only: the temperature (per student kind, lowest validation NLL) and each phase's length
(best validation NLL, early stopping).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from ..cost import count_flops, count_parameters, machine, predictor_latency
from ..distill import MultiHeadMLP, attach_teacher, distill
from ..evaluation.plots import uncertainty_maps
from ..evaluation.report import classification_metrics, ood_metrics
from ..evaluation.tables import mean_std, over_seeds, render
from ..fusion import HydraEnsemble
from ..io import write_json_atomic
from ..metrics import gaussian_mixture_nll
from ..outputs import collect_member_logits, labels_of
from ..predictors import load_predictor, save_predictor
from ..training import CrossEntropy, GaussianNLL, TrainConfig, train, validate
from ..uncertainty import decompose
from ..version import __version__
from .datasets.toy import diabetes_splits, spiral_ood, spiral_splits
from .suite import suite_predictor
from .tasks import Task

TEMPERATURES = (1.0, 2.0, 4.0)
MLP_CONFIG = TrainConfig(epochs=300, lr=1e-2, warmup=0.0, weight_decay=0.0)


def _batches(x: Tensor, y: Tensor, size: int = 64) -> list[dict[str, Tensor]]:
    return [{"inputs": x[i : i + size], "labels": y[i : i + size]} for i in range(0, len(x), size)]


def distil_both(
    teacher: nn.Module,
    new_student: Callable[[], nn.Module],
    train_batches: list[dict],
    val_batches: list[dict],
    config: TrainConfig,
    *,
    temperatures: Sequence[float] = TEMPERATURES,
    head_layers: int = 0,
    cache: Path | None = None,
    progress: bool = False,
) -> dict[str, tuple[nn.Module, float]]:
    """{"KD": (student, T), "Hydra": (student, T)}: each kind at the temperature with its lowest validation NLL
    (regression: one run, no temperature). With `cache`, each temperature's two students are saved under
    `cache/T<t>/{KD,Hydra}` (checkpointed under `cache/T<t>/checkpoints` while they train) and reused."""
    regression = getattr(teacher, "regression", False)
    best: dict[str, tuple[float, nn.Module, float]] = {}
    transfer = None  # the teacher's outputs, computed once, and only if a student is still to be trained
    for temperature in [1.0] if regression else temperatures:
        where = cache / f"T{temperature:g}" if cache is not None else None
        if where is not None and all((where / kind).exists() for kind in ("KD", "Hydra")):
            students = {kind: load_predictor(where / kind) for kind in ("KD", "Hydra")}
        else:
            transfer = transfer or attach_teacher(train_batches, teacher, progress=progress)
            result = distill(
                new_student(),
                transfer,
                phase1=config,
                phase2=config,
                temperature=temperature,
                head_layers=head_layers,
                val_loader=val_batches,
                checkpoint_dir=where / "checkpoints" if where is not None else None,
                progress=progress,
            )
            students = {"KD": result.kd, "Hydra": result.hydra}
            if where is not None:
                for kind, model in students.items():
                    save_predictor(model, where / kind)
                shutil.rmtree(where / "checkpoints", ignore_errors=True)
        for kind, model in students.items():
            score = validate(model, val_batches)["val_nll"]
            if kind not in best or score < best[kind][0]:
                best[kind] = (score, model, temperature)
    return {kind: (model, t) for kind, (_, model, t) in best.items()}


# ---- (a) spiral ----


def spiral_seed(
    seed: int,
    members: int = 10,
    config: TrainConfig = MLP_CONFIG,
    temperatures: Sequence[float] = TEMPERATURES,
    progress: bool = False,
) -> tuple[dict[str, dict], dict[str, nn.Module]]:
    """One seed of the spiral experiment: rows {name: metrics} and the three models."""
    splits = spiral_splits(seed)
    train_batches, val_batches = _batches(*splits.train), _batches(*splits.val)
    ensemble = MultiHeadMLP(2, 3, body=(), head=(64, 64), heads=members, seed=seed)  # M independent MLPs
    train(
        ensemble,
        train_batches,
        config.with_(seed=seed),
        loss=CrossEntropy(),
        val_loader=val_batches,
        progress=progress,
        desc="ensemble",
    )

    def student() -> MultiHeadMLP:
        return MultiHeadMLP(2, 3, body=(64, 64), head=(32,), heads=1, seed=1000 + seed)

    students = distil_both(
        ensemble, student, train_batches, val_batches, config.with_(seed=seed), temperatures=temperatures
    )
    models = {f"Ensemble ({members} MLPs)": ensemble, **{k: m for k, (m, _) in students.items()}}
    test_x, test_y = splits.test
    ood = spiral_ood(seed=seed)
    teacher_mu = {name: decompose(_logits(ensemble, x))["model"] for name, x in (("id", test_x), ("ood", ood))}
    rows = {}
    for name, model in models.items():
        test_logits, ood_logits = _logits(model, test_x), _logits(model, ood)
        rows[name] = classification_metrics(test_logits, test_y) | {
            "mu_gap_id": (decompose(test_logits)["model"] - teacher_mu["id"]).abs().mean().item(),
            "mu_gap_ood": (decompose(ood_logits)["model"] - teacher_mu["ood"]).abs().mean().item(),
            "mi_ood": decompose(ood_logits)["model"].mean().item(),
            "auroc_ood": ood_metrics(test_logits, ood_logits)["auroc"],
            "auroc_ood_mi": ood_metrics(test_logits, ood_logits, score="mutual_information")["auroc"],
            "params": count_parameters(model),
            "temperature": students[name][1] if name in students else None,
        }
    return rows, models


SPIRAL_COLUMNS = (
    ("Acc", "acc", 100, 1),
    ("NLL", "nll", 1, 3),
    ("Brier", "brier", 1, 3),
    ("ECE", "ece", 100, 1),
    ("MU test", "mi", 1, 4),
    ("|ΔMU| test", "mu_gap_id", 1, 4),
    ("MU OOD", "mi_ood", 1, 3),
    ("|ΔMU| OOD", "mu_gap_ood", 1, 3),
    ("AUROC OOD (MSP)", "auroc_ood", 100, 1),
    ("AUROC OOD (MI)", "auroc_ood_mi", 100, 1),
    ("Params", "params", 1, 0),
    ("T", "temperature", 1, 1),
)


def spiral_experiment(seeds: Sequence[int], out_dir: str | os.PathLike, command: str = "") -> dict:
    """Table (mean ± std over seeds) and the uncertainty maps of seed `seeds[0]`, written to `out_dir`."""
    started, out_dir = time.perf_counter(), Path(out_dir)
    per_seed = {}
    for seed in seeds:
        per_seed[seed], models = spiral_seed(seed)
        if seed == seeds[0]:
            spiral_maps(models, spiral_splits(seed).train, out_dir / "spiral_uncertainty.png")
    return _write(out_dir, "spiral", command, seeds, per_seed, SPIRAL_COLUMNS, started)


def spiral_maps(models: Mapping[str, nn.Module], train: tuple[Tensor, Tensor], path: Path, extent: float = 8.0) -> Path:
    side = torch.linspace(-extent, extent, 160)
    grid = torch.stack(torch.meshgrid(side, side, indexing="xy"), dim=-1).reshape(-1, 2)  # rows: y ascending
    return uncertainty_maps({name: _logits(m, grid) for name, m in models.items()}, extent, train, path)


# ---- (c) regression ----


def regression_seed(seed: int, members: int = 5, progress: bool = False) -> dict[str, dict]:
    splits, y_std = diabetes_splits(seed)
    train_batches, val_batches = _batches(*splits.train, size=32), _batches(*splits.val, size=32)
    config = MLP_CONFIG.with_(epochs=200, lr=1e-3, seed=seed, weight_decay=1e-4)
    ensemble = MultiHeadMLP(10, 2, body=(), head=(50,), heads=members, regression=True, seed=seed)
    train(
        ensemble, train_batches, config, loss=GaussianNLL(), val_loader=val_batches, progress=progress, desc="ensemble"
    )

    def student() -> MultiHeadMLP:
        return MultiHeadMLP(10, 2, body=(50,), head=(10,), heads=1, regression=True, seed=1000 + seed)

    students = distil_both(ensemble, student, train_batches, val_batches, config)
    models = {f"Ensemble ({members} MLPs)": ensemble, **{k: m for k, (m, _) in students.items()}}
    test_x, test_y = splits.test
    return {
        name: {  # NLL in the target's own units: the standardised NLL + log(std)
            "nll": gaussian_mixture_nll(_gaussians(model, test_x), test_y) + math.log(y_std),
            "params": count_parameters(model),
        }
        for name, model in models.items()
    }


REGRESSION_COLUMNS = (("Test NLL (diabetes)", "nll", 1, 4), ("Params", "params", 1, 0))


def regression_experiment(seeds: Sequence[int], out_dir: str | os.PathLike, command: str = "") -> dict:
    started = time.perf_counter()
    per_seed = {seed: regression_seed(seed) for seed in seeds}
    return _write(Path(out_dir), "regression", command, seeds, per_seed, REGRESSION_COLUMNS, started)


# ---- (b) the benchmark tasks: transformer students ----

TEACHERS = ("Deep Ensembles", "Hydra (Taylor)")
BENCH_COLUMNS = (
    ("Acc", "acc", 100, 1),
    ("NLL", "nll", 1, 3),
    ("Brier", "brier", 1, 3),
    ("ECE", "ece", 100, 1),
    ("MU test", "mi", 1, 3),
    ("|ΔMU| test", "mu_gap_id", 1, 3),
    ("|ΔMU| near", "mu_gap_near", 1, 3),
    ("|ΔMU| far", "mu_gap_far", 1, 3),
    ("AUROC near", "auroc_near", 100, 1),
    ("AUROC far", "auroc_far", 100, 1),
    ("Params x", "params_x", 1, 2),
    ("FLOPs x", "flops_x", 1, 2),
    ("Latency x", "latency_x", 1, 2),
    ("T", "temperature", 1, 1),
)


def benchmark_seed(
    task: Task,
    seed: int,
    cache: Path,
    head_layers: int = 1,
    temperatures: Sequence[float] = (1.0, 2.0),
    progress: bool = True,
) -> dict[str, dict]:
    """One seed: Single, each teacher of `TEACHERS` (from the benchmark suite's cache), its KD student and its
    Hydra student (body: the first L - head_layers layers, run once). Trained students are cached."""
    single = suite_predictor(task, seed, cache, "Single", progress)
    predictors: dict[str, nn.Module] = {"Single": single}
    temperature: dict[str, float] = {}
    for teacher_row in TEACHERS:
        teacher = suite_predictor(task, seed, cache, teacher_row, progress)
        predictors[teacher_row] = teacher
        for kind, (model, t) in _students(
            task, seed, cache, teacher_row, teacher, head_layers, temperatures, progress
        ).items():
            predictors[f"{kind} ← {teacher_row}"] = model
            temperature[f"{kind} ← {teacher_row}"] = t
    logits = {name: _task_logits(model, task) for name, model in predictors.items()}
    latency = predictor_latency(predictors, {name: task.test[0] for name in predictors}, repeats=5)
    probe = {k: v[:8] for k, v in task.test[0].items() if k != "labels"}
    flops = {name: count_flops(m, probe) for name, m in predictors.items()}
    rows = {}
    for name, model in predictors.items():
        teacher_row = next((t for t in TEACHERS if name.endswith(t)), None)
        reference = logits[teacher_row] if teacher_row else None
        rows[name] = _benchmark_row(logits[name], reference, labels_of(task.test))
        rows[name] |= {
            "params_x": count_parameters(model) / count_parameters(single),
            "flops_x": flops[name] / flops["Single"],
            "latency_x": latency[name]["median"],
            "temperature": temperature.get(name),
        }
    return rows


def _students(task, seed, cache, teacher_row, teacher, head_layers, temperatures, progress):
    """The KD and Hydra students of one teacher, each at its best validation temperature (cached)."""
    slug = teacher_row.lower().replace(" ", "-").replace("(", "").replace(")", "")
    students = distil_both(
        teacher,
        lambda: HydraEnsemble.fuse([task.new_model(seed)]),
        task.train,
        task.val,
        task.recipe.with_(seed=seed, monitor="nll", freeze_embeddings=False),
        temperatures=temperatures,
        head_layers=head_layers,
        cache=cache / "distill" / f"{slug}-k{head_layers}",
        progress=progress,
    )
    return {"KD": students["KD"], "Hydra distil.": students["Hydra"]}


def _task_logits(model: nn.Module, task: Task) -> dict[str, Tensor]:
    """Member logits on the test set and on all near / all far OOD inputs together."""
    return {
        "test": collect_member_logits(model, task.test),
        "near": torch.cat([collect_member_logits(model, data) for data in task.near.values()]),
        "far": torch.cat([collect_member_logits(model, data) for data in task.far.values()]),
    }


def _benchmark_row(logits: dict[str, Tensor], teacher: dict[str, Tensor] | None, labels: Tensor) -> dict:
    row = classification_metrics(logits["test"], labels)
    for where, key in (("near", "auroc_near"), ("far", "auroc_far")):
        row[key] = ood_metrics(logits["test"], logits[where])["auroc"]
    for where in ("test", "near", "far"):
        gap = None
        if teacher is not None:
            gap = (decompose(logits[where])["model"] - decompose(teacher[where])["model"]).abs().mean().item()
        row[f"mu_gap_{'id' if where == 'test' else where}"] = gap
    return row


def benchmark_experiment(task: Task, seeds: Sequence[int], out_dir, cache, command: str = "", progress: bool = True):
    started = time.perf_counter()
    cache = Path(cache) / f"{task.name}-{task.fingerprint()}"
    per_seed = {seed: benchmark_seed(task, seed, cache / f"seed{seed}", progress=progress) for seed in seeds}
    return _write(Path(out_dir), f"distill-{task.name}", command, seeds, per_seed, BENCH_COLUMNS, started)


# ---- shared ----


@torch.no_grad()
def _logits(model: nn.Module, x: Tensor) -> Tensor:
    return collect_member_logits(model, [{"inputs": x}])


def _gaussians(model: nn.Module, x: Tensor) -> Tensor:
    return _logits(model, x)  # a regressor's member outputs are its Gaussians (B, M, 2)


def _write(out_dir: Path, name: str, command: str, seeds, per_seed: dict, columns, started: float) -> dict:
    rows = {}
    for row in dict.fromkeys(r for results in per_seed.values() for r in results):
        values = [results[row] for results in per_seed.values()]
        rows[row] = {
            key: over_seeds([v[key] for v in values]) for key in values[0] if all(v[key] is not None for v in values)
        }
    summary = {
        "experiment": name,
        "command": command,
        "seeds": list(seeds),
        "machine": machine(),
        "library_version": __version__,
        "rows": rows,
        "per_seed": per_seed,
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / f"{name}.json", summary)
    header = ["Model", *(c[0] for c in columns)]
    body = [
        [row, *(mean_std(stats.get(key), scale, digits) for _, key, scale, digits in columns)]
        for row, stats in rows.items()
    ]
    lines = [
        f"# Hydra distillation: {name}",
        "",
        f"Command: `{command}`  ",
        f"Machine: {summary['machine']}  ",
        f"Seeds: {list(seeds)} (mean ± std over seeds)  ",
        f"Wall time: {summary['wall_time_s'] / 60:.1f} min",
        "",
        *render(header, body, "markdown"),
        "",
    ]
    (out_dir / f"{name}.md").write_text("\n".join(lines))
    return summary


EXPERIMENTS: Mapping[str, Callable[..., dict]] = {"spiral": spiral_experiment, "regression": regression_experiment}
