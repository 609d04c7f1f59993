"""Zero-shot Hydra Ensembles of a two-tower model, without any training (paper 000 §5.3, §C.3, §D.3, §E.3.2;
the shape of Table 3).

Rows (`ROWS`), all zero-shot from one two-tower model and the task's class prompts:
    Single                           the unpruned model
    Temp. scaling                    Single with a temperature fit on the validation images (§C.3)
    Taylor                           the image tower pruned by sequential Taylor scores of the zero-shot
                                     cross-entropy (image tower only: the towers' scores differ in scale, §C.3)
    CircAvg                          the first `budget` heads of the joint circuit (both towers, S_avg, §D.3)
    Hydra (Taylor)                   M members, each pruning `taylor_per_layer` heads per image layer drawn
                                     from the `taylor_pool` least useful
    Hydra (Circ)                     M members drawn from the joint circuit (`budget` heads of the first
                                     `pool`), both towers pruned, each tower fused
    Hydra (Circ), image tower only   the same from an image-only circuit (§E.3.2), the text tower unpruned

Circuits are exact (the fast search, per tower). Seeds are pruning seeds: the rows that sample members change
with the seed; Single, Temp. scaling, Taylor and CircAvg do not (their ± is 0 by construction). Everything is
cached, so a run resumes.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from torch import Tensor, nn

from ..evaluation.report import measure
from ..evaluation.tables import CONVENTIONS, aggregate, per_set_lines, table_lines
from ..importance import JointCircuit, extract_joint_circuit, taylor_head_scores
from ..io import read_json_record, row_file, torch_save_atomic, write_json_atomic
from ..members import sample_members
from ..outputs import collect_member_logits, labels_of
from ..predictors import TemperatureScaled, TwoTowerModel, fit_temperature, zero_shot_ensemble
from ..predictors.clip_zero_shot import prompt_batches
from .suite import run_record, time_predictors

ROWS = (
    "Single",
    "Temp. scaling",
    "Taylor",
    "CircAvg",
    "Hydra (Taylor)",
    "Hydra (Circ)",
    "Hydra (Circ), image tower only",
)
Batches = list[dict[str, Tensor]]


@dataclass
class ZeroShotTask:
    """A zero-shot benchmark: the model, the classes and prompts, the data, the pruning settings."""

    name: str
    two_tower: Callable[[Path, bool], TwoTowerModel]  # (a directory, progress) -> the model (built there once)
    tokenizer: Callable[[Path], object]  # the same directory -> its text tokenizer
    classes: list[str]
    templates: list[str]
    test: Batches
    near: dict[str, Batches]
    far: dict[str, Batches]
    val: Batches  # labelled: temperature fitting and Taylor scores
    circuit_id: Batches
    circuit_ood: Batches
    budget: int  # heads each circuit member prunes (both towers together)
    pool: int  # first heads of the circuit's ranking that members draw from
    taylor_per_layer: int
    taylor_pool: int
    members: int = 3
    model_version: int = 1  # bump when the model the task builds changes (the cache key)
    notes: list[str] = field(default_factory=list)

    def fingerprint(self) -> str:
        settings = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "notes" or callable(value):
                continue
            if isinstance(value, dict):
                value = {k: _shape(v) for k, v in value.items()}
            elif isinstance(value, list) and value and isinstance(value[0], dict):
                value = _shape(value)
            settings[f.name] = value
        return hashlib.sha256(repr(sorted(settings.items())).encode()).hexdigest()[:10]


def _shape(batches: Batches) -> tuple:
    return tuple(tuple(sorted((k, tuple(v.shape)) for k, v in b.items())) for b in batches)


class _Builder:
    """Builds each row's predictor for one seed; the model, scores and circuits are shared by all seeds."""

    def __init__(self, task: ZeroShotTask, seed: int, cache: Path, progress: bool):
        self.task, self.seed, self.cache, self.progress = task, seed, cache, progress
        self.model = task.two_tower(cache / "two_tower", progress)
        self.tokenizer = task.tokenizer(cache / "two_tower")

    def row(self, name: str) -> nn.Module:
        return {
            "Single": self.single,
            "Temp. scaling": self.temperature,
            "Taylor": lambda: self.taylor(1, pool=self.task.taylor_per_layer),
            "CircAvg": self.circ_avg,
            "Hydra (Taylor)": lambda: self.taylor(self.task.members, pool=self.task.taylor_pool),
            "Hydra (Circ)": lambda: self.hydra_circ(("image", "text")),
            "Hydra (Circ), image tower only": lambda: self.hydra_circ(("image",)),
        }[name]()

    def ensemble(self, image_maps=None, text_maps=None) -> nn.Module:
        task = self.task
        return zero_shot_ensemble(self.model, task.classes, self.tokenizer, task.templates, image_maps, text_maps)

    def single(self) -> nn.Module:
        return self.ensemble()

    def temperature(self) -> nn.Module:
        single = self.single()
        value = fit_temperature(collect_member_logits(single, self.task.val), labels_of(self.task.val))
        return TemperatureScaled(single, value)

    def taylor_scores(self) -> Tensor:
        path = self.cache / "taylor_scores_sequential.pt"
        if not path.exists():
            image = self.model.image.encoder
            readout = self.single().readout()
            scores = taylor_head_scores(
                image,
                self.task.val,
                loss="cross_entropy",
                readout=readout,
                sequential_budget=self.task.taylor_per_layer,
                progress=self.progress,
            )
            torch_save_atomic(scores, path)
        return torch.load(path)

    def taylor(self, members: int, pool: int) -> nn.Module:
        maps = sample_members(
            self.taylor_scores(), num_members=members, budget=self.task.taylor_per_layer, pool=pool, seed=self.seed
        )
        return self.ensemble(image_maps=maps)

    def circuit(self, towers: Sequence[str]) -> JointCircuit:
        name = "circuit_" + "_".join(towers)
        path = self.cache / f"{name}.json"
        if not path.exists():
            task = self.task
            prompts = prompt_batches(self.tokenizer, task.classes, task.templates, self.model.text)
            circuit = extract_joint_circuit(
                self.model,
                task.circuit_id,
                task.circuit_ood,
                prompts,
                len(task.classes),
                "avg",
                task.pool,
                towers=towers,
                state_path=self.cache / f"{name}_state.json",
                progress=self.progress,
            )
            circuit.save(path)
        return JointCircuit.load(path)

    def circ_avg(self) -> nn.Module:
        maps = self.circuit(("image", "text")).head_maps(self.task.budget)
        return self.ensemble([maps["image"]], [maps["text"]])

    def hydra_circ(self, towers: Sequence[str]) -> nn.Module:
        task = self.task
        members = sample_members(
            self.circuit(towers), num_members=task.members, budget=task.budget, pool=task.pool, seed=self.seed
        )
        text = [m["text"] for m in members] if "text" in towers else None
        return self.ensemble([m["image"] for m in members], text)


def run(
    task: ZeroShotTask,
    seeds: Sequence[int],
    out_dir: str | os.PathLike,
    cache_dir: str | os.PathLike,
    command: str = "",
    rows: Sequence[str] = ROWS,
    latency_repeats: int = 7,
    progress: bool = True,
) -> dict:
    """Every row for every seed (reusing the cache); writes table.md and table.json to `out_dir`."""
    started = time.perf_counter()
    unknown = [row for row in rows if row not in ROWS]
    if unknown or "Single" not in rows:
        raise ValueError(f"rows must include 'Single' and come from {list(ROWS)}; unknown: {unknown}.")
    out_dir, cache = Path(out_dir), Path(cache_dir) / f"{task.name}-{task.fingerprint()}"
    cache.mkdir(parents=True, exist_ok=True)
    per_seed = {seed: _run_seed(task, seed, cache, rows, progress) for seed in seeds}
    summary = run_record(task.name, command, seeds) | {
        "task_fingerprint": task.fingerprint(),
        "notes": task.notes,
        "ood_sets": [*task.near, *task.far],
        "rows": aggregate(per_seed),
        "per_seed": per_seed,
    }
    if latency_repeats:
        build = _Builder(task, seeds[0], cache, progress=False)
        summary["latency"] = time_predictors({row: build.row(row) for row in rows}, task.test[0], latency_repeats)
    summary["wall_time_s"] = round(time.perf_counter() - started, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "table.json", summary)
    (out_dir / "table.md").write_text(markdown(summary))
    return summary


def _run_seed(task: ZeroShotTask, seed: int, cache: Path, rows: Sequence[str], progress: bool) -> dict[str, dict]:
    record = cache / f"seed{seed}" / "results.json"
    results = read_json_record(record)
    build = _Builder(task, seed, cache, progress)
    for row in rows:
        if row in results:
            continue
        print(f"[seed {seed}] {row}", flush=True)
        started = time.perf_counter()
        predictor = build.row(row)
        logits_path = row_file(cache / f"seed{seed}" / "logits", row)
        results[row] = measure(predictor, task.test, task.near, task.far, logits_path) | {
            "heads": _heads(predictor),
            "_seconds": round(time.perf_counter() - started, 1),
        }
        write_json_atomic(record, results)
    return {row: results[row] for row in rows}


def _heads(predictor: nn.Module) -> str:
    """Heads kept (image + text) by the first member, x members: e.g. "60+72 x3"."""
    model = getattr(predictor, "model", predictor)  # a temperature-scaled wrapper
    image, text = model.head_counts()[0]
    return f"{image}+{text}" + (f" x{model.num_members}" if model.num_members > 1 else "")


def markdown(summary: dict) -> str:
    seeds = summary["seeds"]
    lines = [
        f"# {summary['task']}: zero-shot Hydra Ensembles (no training)",
        "",
        f"Command: `{summary['command']}`  ",
        f"Machine: {summary['machine']}  ",
        f"Seeds (pruning seeds): {seeds} " + ("(mean ± std)  " if len(seeds) > 1 else "(one run)  "),
        f"Wall time: {summary['wall_time_s'] / 60:.1f} min for this run",
        "",
        *table_lines(summary["rows"], summary.get("latency")),
        "",
        CONVENTIONS + " Heads: image + text heads kept per member (x members).",
        "",
        *[f"- {note}" for note in summary["notes"]],
        "",
        "Per OOD set (AUROC %, mean over seeds):",
        "",
        *per_set_lines(summary["per_seed"], summary.get("ood_sets")),
    ]
    return "\n".join(lines) + "\n"


def fmnist_task(size: str = "full") -> ZeroShotTask:
    """The LiT-style DINOv2-S + MiniLM model (`bench.two_tower`) classifying the image task's Fashion-MNIST
    test images zero-shot from class names; OOD sets as the image benchmark's."""
    import transformers

    from .tasks import HELD_OUT, _image_batches, dinov2_pixels, image_splits
    from .two_tower import EVAL_TEMPLATES, FASHION_NAMES, LIT_LABEL, LIT_VERSION, lit_model

    if size not in ("full", "quick"):
        raise ValueError(f"unknown zero-shot task size {size!r}; choose 'full' or 'quick'.")
    quick = size == "quick"
    circuit_count = 64 if quick else 96
    data = image_splits(quick, circuit_count)
    batches = _image_batches(dinov2_pixels)
    ids = [c for c in range(10) if c not in HELD_OUT]
    val_x, val_y = data.val
    held_out = ("bag",)
    return ZeroShotTask(
        name="zero-shot-fmnist",
        two_tower=lambda path, progress: lit_model(path, held_out=held_out, progress=progress),
        tokenizer=lambda path: transformers.AutoTokenizer.from_pretrained(path / "model" / "text"),
        classes=[FASHION_NAMES[c] for c in ids],
        templates=list(EVAL_TEMPLATES),
        test=batches(*data.test),
        near={name: batches(x) for name, x in data.near.items()},
        far={name: batches(x) for name, x in data.far.items()},
        val=batches(val_x, val_y),
        circuit_id=batches(val_x[:circuit_count], val_y[:circuit_count]),
        circuit_ood=batches(data.circuit_ood),
        budget=12,
        pool=24,
        taylor_per_layer=1,
        taylor_pool=2,
        model_version=LIT_VERSION,
        notes=[
            f"{LIT_LABEL}: trained contrastively (3 epochs) on captions of the image task's Fashion-MNIST training "
            f"images of 7 of its 8 ID classes ({', '.join(held_out)} held out) and of 5,000 MNIST digits; never "
            "on the test images, the OOD sets or the evaluation templates.",
            f"Zero-shot classes: the 8 ID class names (one, '{held_out[0]}', never captioned in training); "
            f"templates: {list(EVAL_TEMPLATES)}. Near-OOD: shirt, sneaker (held-out classes); far-OOD: MNIST "
            "(seen in training, as digits), scikit-learn digits, solar cells.",
            "Pruning: 12 of the 144 heads (72 image + 72 text; the paper prunes 24 of 240), drawn per member from "
            "the first 24 of the exact joint circuit (S_avg on 96 validation images and 48 photo crops as OOD "
            "validation); Taylor: 1 head per image layer (sequential scores of the zero-shot cross-entropy on the "
            "validation images), Hydra (Taylor) drawn from each layer's 2 least useful. Temperature fit on the "
            "validation images.",
        ],
    )


TASKS = {"zero-shot": fmnist_task}
