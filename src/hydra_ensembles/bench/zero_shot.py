"""Zero-shot Hydra Ensembles of a two-tower model, without any training (paper 000 §5.3, §C.3, §D.3, §E.3.2; the shape
of Table 3): the rows of `ROWS`, all from one two-tower model and the task's class prompts. Circuits are exact (the
fast search): one joint circuit over both towers' heads, and one over the image tower's for the image-only row;
their ties are decided by (layer, head) order, the rule the recorded circuits were ranked by. Seeds are pruning
seeds: the rows that sample members change with the seed; Single, Temp. scaling, Taylor and CircAvg do not (their ±
is 0 by construction). Everything is cached, so a run resumes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from torch import Tensor, nn

from ..evaluation.compare import Built
from ..evaluation.tables import CONVENTIONS, per_set_lines, table_lines
from ..importance import JointCircuit, extract_joint_circuit, taylor_head_scores
from ..io import torch_save_atomic
from ..members import sample_members
from ..outputs import collect_member_logits, labels_of
from ..predictors import Calibrated, TemperatureScaling, TwoTowerModel, fit_temperature, zero_shot_ensemble
from ..predictors.clip_zero_shot import prompt_batches
from .runner import SeedRun, Table, fixed

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
        """A short hash of every setting, the data as its tensors' shapes: the cache key."""
        settings = {f.name: _shapes(getattr(self, f.name)) for f in fields(self) if f.name != "notes"}
        settings = {name: value for name, value in settings.items() if not callable(value)}
        return hashlib.sha256(repr(sorted(settings.items())).encode()).hexdigest()[:10]


def _shapes(value):
    """Batches (or a dict of them) as their tensors' shapes; any other setting as it is."""
    if isinstance(value, dict):
        return {name: _batch_shapes(batches) for name, batches in value.items()}
    return _batch_shapes(value) if isinstance(value, list) and value and isinstance(value[0], dict) else value


def _batch_shapes(batches: Batches) -> tuple:
    return tuple(tuple(sorted((k, tuple(v.shape)) for k, v in batch.items())) for batch in batches)


class _Pieces:
    """The model, its tokenizer, Taylor scores and circuits: shared by all seeds, cached in the task's directory
    (`task_dir`, the seeds' folders' parent)."""

    def __init__(self, run: SeedRun):
        self.task, self.seed, self.task_dir, self.progress = run.task, run.seed, run.cache.parent, run.progress
        self.model = self.task.two_tower(self.task_dir / "two_tower", self.progress)
        self.tokenizer = self.task.tokenizer(self.task_dir / "two_tower")

    def ensemble(self, image_maps=None, text_maps=None) -> nn.Module:
        task = self.task
        return zero_shot_ensemble(self.model, task.classes, self.tokenizer, task.templates, image_maps, text_maps)

    def temperature(self) -> nn.Module:
        single, val = self.ensemble(), self.task.val
        temperature = fit_temperature(collect_member_logits(single, val), labels_of(val))
        return Calibrated(single, TemperatureScaling(temperature))

    def taylor(self, members: int, pool: int) -> nn.Module:
        """`members` members, each pruning `taylor_per_layer` heads per image layer drawn from the `pool` least
        useful by sequential Taylor scores of the zero-shot cross-entropy (image tower only: the towers' scores
        differ in scale, §C.3)."""
        path, per_layer = self.task_dir / "taylor_scores_sequential.pt", self.task.taylor_per_layer
        if not path.exists():
            image, readout = self.model.image.encoder, self.ensemble().readout()
            scores = taylor_head_scores(
                image,
                self.task.val,
                loss="cross_entropy",
                readout=readout,
                sequential_budget=per_layer,
                progress=self.progress,
            )
            torch_save_atomic(scores, path)
        maps = sample_members(torch.load(path), num_members=members, budget=per_layer, pool=pool, seed=self.seed)
        return self.ensemble(image_maps=maps)

    def circuit(self, towers: Sequence[str]) -> JointCircuit:
        """The exact joint circuit (S_avg, §D.3) of `towers`, its first `pool` heads ranked."""
        name, task = "circuit_" + "_".join(towers), self.task
        if not (self.task_dir / f"{name}.json").exists():
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
                tie_break="order",  # the rule its recorded circuits were ranked by
                state_path=self.task_dir / f"{name}_state.json",
                progress=self.progress,
            )
            circuit.save(self.task_dir / f"{name}.json")
        return JointCircuit.load(self.task_dir / f"{name}.json")

    def circ_avg(self) -> nn.Module:
        maps = self.circuit(("image", "text")).head_maps(self.task.budget)
        return self.ensemble([maps["image"]], [maps["text"]])

    def hydra_circ(self, towers: Sequence[str]) -> nn.Module:
        """Members of `budget` heads each drawn from the first `pool` of the circuit of `towers`, each tower fused
        (a tower not in `towers` unpruned)."""
        task = self.task
        members = sample_members(
            self.circuit(towers), num_members=task.members, budget=task.budget, pool=task.pool, seed=self.seed
        )
        text = [m["text"] for m in members] if "text" in towers else None
        return self.ensemble([m["image"] for m in members], text)


ROWS: dict[str, Callable[[_Pieces], nn.Module]] = {
    "Single": lambda p: p.ensemble(),
    "Temp. scaling": lambda p: p.temperature(),  # fit on the validation images (§C.3)
    "Taylor": lambda p: p.taylor(1, pool=p.task.taylor_per_layer),
    "CircAvg": lambda p: p.circ_avg(),  # the first `budget` heads of the joint circuit
    "Hydra (Taylor)": lambda p: p.taylor(p.task.members, pool=p.task.taylor_pool),
    "Hydra (Circ)": lambda p: p.hydra_circ(("image", "text")),
    "Hydra (Circ), image tower only": lambda p: p.hydra_circ(("image",)),  # from an image-only circuit (§E.3.2)
}


def _row(build: Callable[[_Pieces], nn.Module]) -> Callable[[_Pieces], Built]:
    """`build` recording the heads kept (image + text) by the first member, x members: e.g. "60+72 x3"."""

    def built(pieces: _Pieces) -> Built:
        predictor = build(pieces)
        model = getattr(predictor, "model", predictor)  # a temperature-scaled wrapper
        image, text = model.head_counts()[0]
        return Built(
            predictor, {"heads": f"{image}+{text}" + (f" x{model.num_members}" if model.num_members > 1 else "")}
        )

    return built


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
    circuit_count = 64 if size == "quick" else 96
    data, batches = image_splits(size == "quick", circuit_count // 10), _image_batches(dinov2_pixels)
    ids = [c for c in range(10) if c not in HELD_OUT]
    val_x, val_y = data.val
    held_out = ("bag",)
    return ZeroShotTask(
        name="zero-shot-fmnist",
        two_tower=lambda path, progress: lit_model(path, data, held_out=held_out, progress=progress),
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
            f"images of 7 of its 8 ID classes ({', '.join(held_out)} held out) and of the MNIST digits (of 5,000) "
            "that are not among its OOD images; never on the validation or test images, the OOD sets or the "
            "evaluation templates.",
            f"Zero-shot classes: the 8 ID class names (one, '{held_out[0]}', never captioned in training); "
            f"templates: {list(EVAL_TEMPLATES)}. Near-OOD: shirt, sneaker (held-out classes); far-OOD: MNIST "
            "(other digits captioned in training, as digits), scikit-learn digits, solar cells.",
            "Pruning: 12 of the 144 heads (72 image + 72 text; the paper prunes 24 of 240), drawn per member from "
            f"the first 24 of the exact joint circuit (S_avg on {circuit_count} validation images and the OOD "
            f"validation images, {len(data.circuit_ood)} from the OOD sources, disjoint from their test parts); "
            "Taylor: 1 head per image layer (sequential scores of the zero-shot cross-entropy on the validation "
            "images), Hydra (Taylor) drawn from each layer's 2 least useful. Temperature fit on the validation "
            "images.",
        ],
    )


TASKS = {"zero-shot": fmnist_task}
TABLE = Table(rows=fixed({row: _row(build) for row, build in ROWS.items()}), pieces=_Pieces, markdown=markdown)
