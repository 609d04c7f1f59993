"""Paper 001's experiments: Hydra distillation against knowledge distillation (KD), in the shape of its Tables 1-4.

spiral      a 10-member MLP ensemble on the 3-class spiral, distilled; model-uncertainty maps (Fig. 2)
regression  a 5-member heteroscedastic MLP ensemble on scikit-learn's diabetes set; test NLL (Table 4)
text|image  the benchmark tasks' Deep Ensemble and Hydra Ensemble distilled into transformer students (body =
            the first L - k layers, each head = the last k layers + classifier), against the single model

Every student starts from one head trained on the ensemble mean (the KD row), then grows one head per member.
Chosen on validation only: the temperature (per student kind, lowest validation NLL) and each phase's kept
epoch (best validation NLL; early stopping where the recipe sets a patience). Each experiment is a seed
function ({row: values}) run by `experiment`: its rows are not recorded (the trained students are cached) and its
values are its own (the gap in model uncertainty to the row's teacher, cost as ratios to Single), so it does not
go through `evaluation.compare`.
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

from ..cost import count_flops, count_parameters
from ..distill import MultiHeadMLP, attach_teacher, distill
from ..evaluation.compare import time_rows
from ..evaluation.plots import uncertainty_maps
from ..evaluation.report import classification_metrics, ood_metrics
from ..evaluation.tables import mean_std, over_seeds, render
from ..fusion import HydraEnsemble
from ..io import read_json_record, weights_digest, write_json_atomic, write_text_atomic
from ..metrics import gaussian_mixture_nll
from ..outputs import collect_member_logits, labels_of
from ..predictors import load_predictor, save_predictor
from ..training import CrossEntropy, GaussianNLL, TrainConfig, train, validate
from ..uncertainty import decompose
from . import runner, suite
from .datasets.toy import diabetes_splits, spiral_ood, spiral_splits
from .tasks import Task

TEMPERATURES = (1.0, 2.0, 4.0)
# clip=None: the loop clips the norm of all parameters together, which would tie each member's step to the others'
MLP_CONFIG = TrainConfig(epochs=300, lr=1e-2, warmup=0.0, weight_decay=0.0, clip=None)
Columns = Sequence[tuple[str, str, float, int]]  # (header, key, scale, digits)
QUALITY = (("Acc", "acc", 100, 1), ("NLL", "nll", 1, 3), ("Brier", "brier", 1, 3), ("ECE", "ece", 100, 1))


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
    `cache/T<t>/{KD,Hydra}` (checkpointed under `cache/T<t>/checkpoints` while they train) and reused, once
    `cache/teacher.json` shows they were distilled from this teacher's weights."""
    if cache is not None:
        _check_teacher(cache, teacher)
    best: dict[str, tuple[float, nn.Module, float]] = {}
    transfer = None  # the teacher's outputs, computed once, and only if a student is still to be trained
    for temperature in [1.0] if getattr(teacher, "regression", False) else temperatures:
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
            score = math.inf if math.isnan(score) else score  # a diverged student: never better than another
            if kind not in best or score < best[kind][0]:
                best[kind] = (score, model, temperature)
    return {kind: (model, t) for kind, (_, model, t) in best.items()}


def _check_teacher(cache: Path, teacher: nn.Module) -> None:
    """Refuse students cached under `cache` from a teacher other than `teacher` (a teacher rebuilt under the same
    task fingerprint with other weights); record the teacher's digest when none is (a new cache, or students
    cached before digests were kept)."""
    digest, record = weights_digest(teacher), cache / "teacher.json"
    recorded = read_json_record(record).get("weights")
    if recorded is None:
        write_json_atomic(record, {"weights": digest})
    elif recorded != digest:
        raise RuntimeError(
            f"the students cached in {cache} were distilled from a teacher with weights digest {recorded}, "
            f"and this teacher's is {digest}: delete {cache} to distil this teacher's students"
        )


def _mlp_models(
    ensemble, student, splits, config, loss, batch=64, **distil
) -> dict[str, tuple[nn.Module, float | None]]:
    """A toy set's ensemble of MLPs, trained, and its KD and Hydra students: {row: (model, temperature)}."""
    train_batches, val_batches = _batches(*splits.train, batch), _batches(*splits.val, batch)
    train(ensemble, train_batches, config, loss=loss, val_loader=val_batches, progress=False, desc="ensemble")
    students = distil_both(ensemble, student, train_batches, val_batches, config, **distil)
    return {f"Ensemble ({ensemble.num_members} MLPs)": (ensemble, None), **students}


# ---- (a) spiral ----


def spiral_seed(
    seed: int, members: int = 10, config: TrainConfig = MLP_CONFIG, temperatures: Sequence[float] = TEMPERATURES
) -> tuple[dict[str, dict], dict[str, nn.Module]]:
    """One seed of the spiral experiment: rows {name: metrics} and the three models."""
    splits, config = spiral_splits(seed), config.with_(seed=seed)
    ensemble = MultiHeadMLP(2, 3, body=(), head=(64, 64), heads=members, seed=seed)  # M independent MLPs

    def student() -> MultiHeadMLP:
        return MultiHeadMLP(2, 3, body=(64, 64), head=(32,), heads=1, seed=1000 + seed)

    models = _mlp_models(ensemble, student, splits, config, CrossEntropy(), temperatures=temperatures)
    (test_x, test_y), ood = splits.test, spiral_ood(seed=seed)
    teacher_mu = {name: decompose(_logits(ensemble, x))["model"] for name, x in (("id", test_x), ("ood", ood))}
    rows = {}
    for name, (model, temperature) in models.items():
        test_logits, ood_logits = _logits(model, test_x), _logits(model, ood)
        rows[name] = classification_metrics(test_logits, test_y) | {
            "mu_gap_id": (decompose(test_logits)["model"] - teacher_mu["id"]).abs().mean().item(),
            "mu_gap_ood": (decompose(ood_logits)["model"] - teacher_mu["ood"]).abs().mean().item(),
            "mi_ood": decompose(ood_logits)["model"].mean().item(),
            "auroc_ood": ood_metrics(test_logits, ood_logits)["auroc"],
            "auroc_ood_mi": ood_metrics(test_logits, ood_logits, score="mutual_information")["auroc"],
            "params": count_parameters(model),
            "temperature": temperature,
        }
    return rows, {name: model for name, (model, _) in models.items()}


SPIRAL_COLUMNS = (
    *QUALITY,
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
    """The table over seeds and the uncertainty maps of seed `seeds[0]`, written to `out_dir`."""

    def seed_rows(seed: int) -> dict[str, dict]:
        rows, models = spiral_seed(seed)
        if seed == seeds[0]:
            spiral_maps(models, spiral_splits(seed).train, Path(out_dir) / "spiral_uncertainty.png")
        return rows

    return experiment("spiral", seeds, seed_rows, SPIRAL_COLUMNS, out_dir, command)


def spiral_maps(models: Mapping[str, nn.Module], train: tuple[Tensor, Tensor], path: Path, extent: float = 8.0) -> Path:
    side = torch.linspace(-extent, extent, 160)
    grid = torch.stack(torch.meshgrid(side, side, indexing="xy"), dim=-1).reshape(-1, 2)  # rows: y ascending
    return uncertainty_maps({name: _logits(m, grid) for name, m in models.items()}, extent, train, path)


# ---- (c) regression ----

REGRESSION_COLUMNS = (("Test NLL (diabetes)", "nll", 1, 4), ("Params", "params", 1, 0))


def regression_seed(seed: int, members: int = 5) -> dict[str, dict]:
    splits, y_std = diabetes_splits(seed)
    config = MLP_CONFIG.with_(epochs=200, lr=1e-3, seed=seed, weight_decay=1e-4)
    ensemble = MultiHeadMLP(10, 2, body=(), head=(50,), heads=members, regression=True, seed=seed)

    def student() -> MultiHeadMLP:
        return MultiHeadMLP(10, 2, body=(50,), head=(10,), heads=1, regression=True, seed=1000 + seed)

    models = _mlp_models(ensemble, student, splits, config, GaussianNLL(), batch=32)
    test_x, test_y = splits.test
    return {  # NLL in the target's own units: the standardised NLL + log(std); a regressor's outputs are Gaussians
        name: {"nll": gaussian_mixture_nll(_logits(m, test_x), test_y) + math.log(y_std), "params": count_parameters(m)}
        for name, (m, _) in models.items()
    }


def regression_experiment(seeds: Sequence[int], out_dir: str | os.PathLike, command: str = "") -> dict:
    return experiment("regression", seeds, regression_seed, REGRESSION_COLUMNS, out_dir, command)


# ---- (b) the benchmark tasks: transformer students ----

ENGINE = suite.ENGINE  # Single on the engine the students run on: their cost without the engine's saving
TEACHERS = ("Deep Ensembles", "Hydra (Circ)")  # protocol 2: Hydra (Circ), the suite rows issue 44 names
BENCH_COLUMNS = (
    *QUALITY,
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
    """One seed: Single, each teacher of `TEACHERS` (the suite's rows, from its cache), its KD student and its
    Hydra student (body: the first L - head_layers layers, run once). Trained students are cached."""
    single = runner.predictor(task, suite.TABLE, seed, cache, row="Single", progress=progress)
    predictors = {"Single": single, ENGINE: HydraEnsemble.fuse([single])}  # the students' engine, Single's weights
    temperature: dict[str, float] = {}
    for teacher_row in TEACHERS:
        teacher = predictors[teacher_row] = runner.predictor(
            task, suite.TABLE, seed, cache, row=teacher_row, progress=progress
        )
        slug = "".join(c for c in teacher_row.lower().replace(" ", "-") if c not in "()")
        students = distil_both(
            teacher,
            lambda: HydraEnsemble.fuse([task.new_model(seed)]),
            task.train,
            task.val,
            # the embeddings frozen where Single's recipe freezes them; no augmentation: the teacher's outputs
            # are computed once, on the images as they are
            task.recipe.with_(seed=seed, monitor="nll", augment=None),
            temperatures=temperatures,
            head_layers=head_layers,
            cache=cache / "distill" / f"{slug}-k{head_layers}",
            progress=progress,
        )
        for kind, (model, t) in (("KD", students["KD"]), ("Hydra distil.", students["Hydra"])):
            predictors[f"{kind} ← {teacher_row}"], temperature[f"{kind} ← {teacher_row}"] = model, t
    logits = {name: _task_logits(model, task) for name, model in predictors.items()}
    latency = time_rows(predictors, {name: task.test[0] for name in predictors}, repeats=5)
    probe = {k: v[:8] for k, v in task.test[0].items() if k != "labels"}
    flops = {name: count_flops(m, probe) for name, m in predictors.items()}
    rows = {}
    for name, model in predictors.items():
        teacher_row = next((t for t in TEACHERS if name.endswith(t)), None)
        rows[name] = _benchmark_row(logits[name], logits.get(teacher_row), labels_of(task.test)) | {
            "params_x": count_parameters(model) / count_parameters(predictors["Single"]),
            "flops_x": flops[name] / flops["Single"],
            "latency_x": latency[name]["median"],
            "temperature": temperature.get(name),
        }
    return rows


def _task_logits(model: nn.Module, task: Task) -> dict:
    """Member logits on the test set ("test": (N, M, C)) and on each near and far OOD set ({set: (N', M, C)})."""
    return {
        "test": collect_member_logits(model, task.test),
        "near": {name: collect_member_logits(model, data) for name, data in task.near.items()},
        "far": {name: collect_member_logits(model, data) for name, data in task.far.items()},
    }


def _benchmark_row(logits: dict, teacher: dict | None, labels: Tensor) -> dict:
    """The row's metrics; near / far AUROC and model-uncertainty gap averaged over the sets of each group (as the
    suite's tables average them), not pooled (pooling weighs the sets by their sizes)."""
    row = classification_metrics(logits["test"], labels)
    for where in ("near", "far"):
        row[f"auroc_{where}"] = _mean(ood_metrics(logits["test"], ood)["auroc"] for ood in logits[where].values())
    row["mu_gap_id"] = _mu_gap(logits["test"], teacher["test"]) if teacher is not None else None
    for where in ("near", "far"):
        row[f"mu_gap_{where}"] = (
            _mean(_mu_gap(logits[where][name], teacher[where][name]) for name in logits[where])
            if teacher is not None
            else None
        )
    return row


def _mu_gap(student: Tensor, teacher: Tensor) -> float:
    """|ΔMU|: the mean over inputs of the absolute difference of the two model uncertainties (mutual information)."""
    return (decompose(student)["model"] - decompose(teacher)["model"]).abs().mean().item()


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def benchmark_experiment(
    task: Task,
    seeds: Sequence[int],
    out_dir,
    cache,
    command: str = "",
    progress: bool = True,
    head_layers: int = 1,
):
    """`benchmark_seed` of every seed, as distill-<task> (distill-<task>-k<k> for `head_layers` k other than 1)."""

    def seed_rows(seed: int) -> dict[str, dict]:
        seed_cache = runner.prepared_seed_dir(cache, task, seed)
        return benchmark_seed(task, seed, seed_cache, head_layers=head_layers, progress=progress)

    name = f"distill-{task.name}" + (f"-k{head_layers}" if head_layers != 1 else "")
    return experiment(name, seeds, seed_rows, BENCH_COLUMNS, out_dir, command)


# ---- shared ----


def _batches(x: Tensor, y: Tensor, size: int = 64) -> list[dict[str, Tensor]]:
    return [{"inputs": x[i : i + size], "labels": y[i : i + size]} for i in range(0, len(x), size)]


@torch.no_grad()
def _logits(model: nn.Module, x: Tensor) -> Tensor:
    return collect_member_logits(model, [{"inputs": x}])


def experiment(
    name: str,
    seeds: Sequence[int],
    seed_rows: Callable[[int], dict[str, dict]],
    columns: Columns,
    out_dir: str | os.PathLike,
    command: str = "",
) -> dict:
    """`seed_rows(seed)` ({row: {key: value}}) of every seed, each value's mean and std over seeds (a value that
    some seed leaves None is left out); writes `<name>.json` and `<name>.md` to `out_dir`."""
    started, out_dir = time.perf_counter(), Path(out_dir)
    per_seed = {seed: seed_rows(seed) for seed in seeds}
    rows = {}
    for row in dict.fromkeys(r for results in per_seed.values() for r in results):
        values = [results[row] for results in per_seed.values()]
        rows[row] = {k: over_seeds([v[k] for v in values]) for k in values[0] if all(v[k] is not None for v in values)}
    summary = {"experiment": name} | runner.run_record(name, command, seeds) | {"rows": rows, "order": list(rows)}
    summary |= {"per_seed": per_seed, "wall_time_s": round(time.perf_counter() - started, 1)}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / f"{name}.json", summary)
    write_text_atomic(out_dir / f"{name}.md", markdown(summary, columns))
    return summary


def markdown(summary: dict, columns: Columns) -> str:
    body = [
        [row, *(mean_std(stats.get(key), scale, digits) for _, key, scale, digits in columns)]
        for row, stats in ((row, summary["rows"][row]) for row in summary.get("order", summary["rows"]))
    ]
    lines = [
        f"# Hydra distillation: {summary['experiment']}",
        "",
        f"Command: `{summary['command']}`  ",
        f"Machine: {summary['machine']}  ",
        f"Seeds: {summary['seeds']} (mean ± std over seeds)  ",
        f"Wall time: {summary['wall_time_s'] / 60:.1f} min",
        "",
        *render(["Model", *(c[0] for c in columns)], body, "markdown"),
        "",
        *engine_note(summary["rows"]),
    ]
    return "\n".join(lines)


def engine_note(rows: Mapping[str, dict]) -> list[str]:
    """The students' FLOPs x `ENGINE` (Single on their engine, whose last layer computes only the tokens the head
    reads), when the table has it: x Single (the HF model) understates what the extra heads cost."""
    if ENGINE not in rows or "flops_x" not in rows[ENGINE]:
        return []
    engine = rows[ENGINE]["flops_x"]["mean"]
    students = [row for row in rows if "←" in row and "flops_x" in rows[row]]
    ratios = "; ".join(f"{row} {rows[row]['flops_x']['mean'] / engine:.2f}x" for row in students)
    return [
        f"{ENGINE}: Single's weights on the students' engine, {engine:.2f}x Single's FLOPs. The students' FLOPs x "
        f"it (their cost on one engine): {ratios}.",
        "",
    ]


EXPERIMENTS: Mapping[str, Callable[..., dict]] = {"spiral": spiral_experiment, "regression": regression_experiment}
