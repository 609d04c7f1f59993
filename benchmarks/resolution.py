"""Choose image-dinov2's input resolution on validation and state its cost (issue 39, item 4). For each side in px
(a multiple of DINOv2's 14 px patch), the task's single model is fine-tuned with the task's recipe and cached in the
bench cache as `hydra-ens bench image-dinov2 --rows Single` caches it (at the task's default side it is the
benchmark's own model, loaded, not trained again). Per size: validation NLL and accuracy of the epoch kept (the
recipe keeps the best validation NLL), that epoch, the training time and seconds per epoch (a cached model reports
"cached", or the time an earlier report measured), and FLOPs per example; the size is chosen by the
one-standard-error rule (`choose`). Test data is never read: a model is checked against the task's records by its
weights digest only, never measured on the test set. Run it while no benchmark of image-dinov2 trains the same
seed: they share the cache.

    python benchmarks/resolution.py [--pixels 56 84 112] [--seed 0]

Writes benchmarks/results/image-dinov2/resolution.md and .json. Cost on 2 CPU cores: the 56 px Single row took ~17 min
(10 epochs, then measured); 84 px ran at 1.1-1.2 s a step alone (~30 min for 10 epochs; 2.2x the FLOPs); 112 px
(64 patches) is estimated at ~70 min or more.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from hydra_ensembles.bench import cache_dir, runner, suite
from hydra_ensembles.bench.tasks import DINOV2_PATCH, Task, _whole_patches, dinov2_task
from hydra_ensembles.cost import count_flops
from hydra_ensembles.evaluation.compare import machine
from hydra_ensembles.evaluation.tables import render
from hydra_ensembles.io import read_json_record, write_json_atomic, write_text_atomic
from hydra_ensembles.outputs import collect_member_logits, labels_of
from hydra_ensembles.uncertainty import ensemble_probs

OUT = Path(__file__).parent / "results" / "image-dinov2"
RECORDS = Path(__file__).parent / "records"  # the benchmark's records (`hydra-ens bench --records`): read only
PROBE = 8  # validation examples whose forward pass is counted for FLOPs per example


def choose(sizes: Sequence[Mapping]) -> int:
    """The one-standard-error rule (Breiman et al., 1984): the fewest `pixels` whose validation NLL is within one
    standard error of the lowest (`nll_gap` <= `gap_se`, as `paired_gaps` gives them), so that a size is paid for
    (in time: a step costs about in proportion to the patches) only when validation can tell its gain from noise.
    Sizes with a non-finite `val_nll` are skipped."""
    finite = [size for size in sizes if math.isfinite(size["val_nll"])]
    if not finite:
        raise ValueError(f"no size has a finite validation NLL: {[size['val_nll'] for size in sizes]}.")
    return min(size["pixels"] for size in finite if size["nll_gap"] <= size["gap_se"])


def paired_gaps(example_nll: Mapping[int, Tensor]) -> dict[int, dict[str, float]]:
    """For each size (pixels -> per-example validation NLL, shape (N,), the same examples in the same order): the
    gap of its mean NLL to the lowest mean (`nll_gap`, >= 0) and the standard error of that paired difference
    (`gap_se`; 0 for the lowest itself). Sizes with a non-finite mean get an infinite gap."""
    means = {side: nll.mean().item() for side, nll in example_nll.items()}
    finite = [side for side in means if math.isfinite(means[side])]
    best = min(finite, key=lambda side: (means[side], side), default=None)
    gaps = {}
    for side, nll in example_nll.items():
        if best is None or not math.isfinite(means[side]):
            gaps[side] = {"nll_gap": math.inf, "gap_se": 0.0}
            continue
        difference = (nll - example_nll[best]).double()
        se = difference.std().item() / math.sqrt(len(difference)) if side != best else 0.0
        gaps[side] = {"nll_gap": means[side] - means[best], "gap_se": se}
    return gaps


def example_nll(model: nn.Module, batches: list[dict]) -> Tensor:
    """Each validation example's NLL (nats) under `model`'s probability, shape (N,)."""
    model.eval()
    probs = ensemble_probs(collect_member_logits(model, batches).double())
    labels = labels_of(batches)
    return -probs[torch.arange(len(labels)), labels].log()


def kept_epoch(training: Mapping) -> dict:
    """The epoch kept of a model's `suite.TRAINING` record ({"epochs": [...], "kept_epoch": k}): its number,
    validation NLL and accuracy, and the epochs run."""
    epoch = next(e for e in training["epochs"] if e["epoch"] == training["kept_epoch"])
    return {
        "kept_epoch": epoch["epoch"],
        "epochs_run": len(training["epochs"]),
        "val_nll": epoch["val_nll"],
        "val_acc": epoch["val_acc"],
    }


def single_on_validation(
    task: Task, seed: int, cache: Path, records: Path = RECORDS, progress: bool = True
) -> tuple[dict, Tensor]:
    """`task`'s single model for `seed`, trained now or loaded from the bench cache `cache`, described on
    validation data only: (`kept_epoch`'s fields, `training` ("trained", "resumed" from a checkpoint, or "cached"),
    `train_seconds` and `seconds_per_epoch` (when trained now, else None), `flops_per_example`, `max_epochs` and the
    task's `fingerprint`; each validation example's NLL, shape (N,))."""
    # the records' batch layout and digests first, as `hydra-ens bench` reads them: batches cut otherwise are refused
    seed_cache = runner.prepared_seed_dir(cache, task, seed, records)
    pieces = suite.Pieces(runner.SeedRun(task, seed, seed_cache, progress=progress))
    train, checkpoint = pieces.from_start(seed)
    training = _training_state(seed_cache, checkpoint)
    started = time.perf_counter()
    # `trained`, not `single`: `single` measures a rebuilt model on the test set to compare it with its row
    model = pieces.trained("single", train, checkpoint=checkpoint)
    seconds = time.perf_counter() - started if training != "cached" else None
    kept = kept_epoch(pieces.training_of("single", model))  # this build's: a rebuild trains to other epochs
    probe = {k: v[:PROBE] for k, v in task.val[0].items() if k != "labels"}
    record = kept | {
        "training": training,
        "train_seconds": seconds,
        "seconds_per_epoch": seconds / kept["epochs_run"] if training == "trained" else None,
        "flops_per_example": count_flops(model, probe) / len(next(iter(probe.values()))),
        "max_epochs": task.recipe.epochs,
        "fingerprint": task.fingerprint(),
    }
    return record, example_nll(model, task.val)


def _training_state(seed_cache: Path, checkpoint: str) -> str:
    if (seed_cache / "models" / "single").exists():
        return "cached"
    return "resumed" if (seed_cache / "checkpoints" / checkpoint).exists() else "trained"


def compare_sizes(pixels: Sequence[int], seed: int, cache: Path, command: str) -> dict:
    """Every size's single model on validation (one task built at a time: 112 px inputs take ~1.4 GB) and the
    size chosen."""
    sizes, nll = [], {}
    for side in pixels:
        print(f"[{side} px]", flush=True)
        record, nll[side] = single_on_validation(dinov2_task("full", pixels=side), seed, cache)
        sizes.append({"pixels": side, "patches": (side // DINOV2_PATCH) ** 2} | record)
    gaps = paired_gaps(nll)
    sizes = [size | gaps[size["pixels"]] for size in sizes]
    return {
        "task": "image-dinov2",
        "seed": seed,
        "command": command,
        "machine": machine(),
        "sizes": sizes,
        "chosen": choose(sizes),
    }


def markdown(record: dict) -> str:
    default = min(record["sizes"], key=lambda s: s["pixels"])  # the cheapest: FLOPs are relative to it
    header = ["Pixels", "Patches", "Val NLL", "- lowest (SE)", "Val acc", "Epoch kept", "Training", "s / epoch"]
    header += ["GFLOPs / ex.", "FLOPs"]
    body = [
        [
            f"{s['pixels']}{' (chosen)' if s['pixels'] == record['chosen'] else ''}",
            str(s["patches"]),
            f"{s['val_nll']:.4f}",
            f"{s['nll_gap']:+.4f} ({s['gap_se']:.4f})",
            f"{100 * s['val_acc']:.2f}",
            f"{s['kept_epoch']} of {s['epochs_run']} run (at most {s['max_epochs']})",
            s["training"] if s["train_seconds"] is None else f"{s['training']}, {s['train_seconds'] / 60:.1f} min",
            "-" if s["seconds_per_epoch"] is None else f"{s['seconds_per_epoch']:.0f}",
            f"{s['flops_per_example'] / 1e9:.2f}",
            f"{s['flops_per_example'] / default['flops_per_example']:.2f}x",
        ]
        for s in record["sizes"]
    ]
    return "\n".join(
        [
            f"# image-dinov2: the input resolution, chosen on validation (seed {record['seed']})",
            "",
            f"Command: `{record['command']}`  ",
            f"Machine: {record['machine']}",
            "",
            "Fashion-MNIST's 28 px images upsampled (bicubic) to each side for DINOv2-S (14 px patches); the task's "
            "single model fine-tuned with its recipe at each size, the epoch with the best validation NLL kept. "
            "Validation data only (no test data read); NLL in nats, accuracy in %. FLOPs: one forward pass per "
            f"example, relative to {default['pixels']} px. Training: 'cached' when the model was in the bench cache "
            "(its time is not known here); 'resumed' when it went on from a checkpoint (time of the rest only).",
            "",
            *render(header, body, "markdown"),
            "",
            f"Chosen: **{record['chosen']} px**, by the one-standard-error rule: the fewest pixels whose validation "
            "NLL is within one standard error of the lowest (the standard error of the paired per-example "
            "difference over the validation images), since a step's cost grows with the patches.",
        ]
    )


def with_earlier_times(sizes: Sequence[dict], earlier_path: Path) -> list[dict]:
    """`sizes`, where a model came from the cache, with the training time an earlier report measured for the same
    side and task fingerprint ("trained earlier"), so that running the script again keeps the cost it measured."""
    earlier = read_json_record(earlier_path)["sizes"] if earlier_path.exists() else []
    timed = {(s["pixels"], s["fingerprint"]): s for s in earlier if s.get("train_seconds") is not None}
    kept = []
    for size in sizes:
        before = timed.get((size["pixels"], size["fingerprint"]))
        if size["training"] == "cached" and before is not None:
            times = {key: before[key] for key in ("train_seconds", "seconds_per_epoch")}
            size = size | times | {"training": "trained earlier"}
        kept.append(size)
    return kept


def _side(text: str) -> int:
    """An input side from the command line, refused (every size before any is trained) unless whole patches."""
    try:
        return _whole_patches(int(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pixels", type=_side, nargs="+", default=[56, 84, 112], help="input sides, multiples of 14")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    command = shlex.join(["python", "benchmarks/resolution.py", *(sys.argv[1:] if argv is None else argv)])
    record = compare_sizes(args.pixels, args.seed, cache_dir() / "bench" / "full", command)
    record["sizes"] = with_earlier_times(record["sizes"], args.out / "resolution.json")
    write_json_atomic(args.out / "resolution.json", record)
    write_text_atomic(args.out / "resolution.md", markdown(record) + "\n")
    print(markdown(record))


if __name__ == "__main__":
    main()
