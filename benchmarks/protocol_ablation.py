"""Which protocol change moved what (issue 39, item 7): one seed of image-dinov2 under the protocol before issue 39,
then each change added in turn, every step tested on the same (current) test and OOD test sets:

0. protocol 1: circuits on photo crops as OOD validation, ties by (layer, head) order, half the heads pruned with
   pools of 2/3 of them, the single model 4 epochs with dropout and label smoothing, members 2 epochs;
1. + OOD validation: the validation parts of the OOD sources (disjoint from their test parts);
2. + informative circuits: ties decided by the secondary score;
3. + diversity: a third of the heads pruned, pools twice the budget;
4. + training (§C.1.2, §D.2): no dropout or label smoothing in the base, crop+flip, more epochs;
   this is the current task (`hydra-ens bench image-dinov2`): it shares that run's cache;
5. + fine-tuning after fusing: "Hydra (Circ), fused then fine-tuned" next to fine-tune-then-average (Hydra (Circ))
   and fine-tune-then-stack ("…, stacked MLP"), in step 4's run.

Steps 1-3 start from step 0's single model (the same training), so they differ only in what the step changes.
Step 0 is protocol 1 in what these steps change, not in two things it cannot undo here: it runs at the current
84 px (protocol 1: 56 px) and keeps its best validation epoch (the suite always validates; protocol 1 kept the
last). Neither the resolution nor validation selection is credited to any step. Each step's rows are compared
with the same rows of the step above by the paired bootstrap over the test examples (one seed).

    python benchmarks/protocol_ablation.py [--seed 0] [--steps 0 1 2 3 4]

Writes benchmarks/results/image-dinov2/ablation/ablation.md and .json, and each step's own table in step<k>/.
Cost: at 84 px an exact circuit search of 48 removals is ~2,300 candidate evaluations on 260 validation images,
about 2 h on one core (image-dinov2 seed 1, 2026-11-27); members and evaluation about as long again. Steps 2 and 3
search the same circuit (`same_circuit`): step 3 takes step 2's. Step 2 changes the circuit search alone: where its
circuit removes the same heads in the same order as step 1's (step 1's search left no tie for the rule to decide),
it would build step 1's models, so its rows are step 1's, not trained again, and its table says so (`same_models`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hydra_ensembles.bench import cache_dir, runner, suite
from hydra_ensembles.bench.tasks import Task, _image_batches, dinov2_pixels, dinov2_task
from hydra_ensembles.evaluation.bootstrap import difference_lines, row_differences
from hydra_ensembles.evaluation.compare import machine
from hydra_ensembles.evaluation.tables import COLUMNS, mean_std, render
from hydra_ensembles.io import write_json_atomic, write_text_atomic
from hydra_ensembles.outputs import labels_of
from hydra_ensembles.predictors import load_predictor
from hydra_ensembles.training import IMAGE_RECIPE

OUT = Path(__file__).parent / "results" / "image-dinov2" / "ablation"
RECORDS = Path(__file__).parent / "records"  # each step's records kept as `hydra-ens bench --records` keeps them
CORE = ["Single", "CircAvg", "Hydra (Circ)"]
LAST = [
    "Single",
    "Single, trained as long",
    "Deep Ensembles",
    "CircAvg",
    "Hydra (Taylor)",
    "Hydra (Circ)",
    "Hydra (Circ), stacked MLP",
    "Hydra (Circ), fused then fine-tuned",
]
SHOWN = [c for c in COLUMNS if c.header in ("Acc", "NLL", "ECE", "AUROC near", "AUROC far", "AUROC all", "FPR95 all")]


def photo_crops(count: int, seed: int = 0) -> Tensor:
    """Protocol 1's OOD validation: random grey crops (56-112 px square, downsampled to 28x28) of scikit-learn's
    two sample photographs, (count, 28, 28) in [0, 1]."""
    from sklearn.datasets import load_sample_images

    photos = [torch.from_numpy(np.array(p)).float().mean(-1) / 255 for p in load_sample_images().images]
    generator, crops = torch.Generator().manual_seed(seed), []
    for i in range(count):
        photo = photos[i % len(photos)]
        side = int(torch.randint(56, 113, (1,), generator=generator))
        top = int(torch.randint(0, photo.shape[0] - side + 1, (1,), generator=generator))
        left = int(torch.randint(0, photo.shape[1] - side + 1, (1,), generator=generator))
        crop = photo[top : top + side, left : left + side][None, None]
        crops.append(F.interpolate(crop, size=(28, 28), mode="area")[0, 0])
    return torch.stack(crops)


def protocol_1(current: Task, crops: list) -> Task:
    """`current` with protocol 1's OOD validation, ties, budgets and training (its test data kept)."""
    recipe = IMAGE_RECIPE.with_(epochs=4, lr=0.01, freeze_embeddings=True)  # label smoothing 0.1, no augmentation
    return replace(
        current,
        new_model=current.dropout_model or current.new_model,  # dropout 0.1 in each layer
        dropout_model=None,
        recipe=recipe,
        member_recipe=recipe.with_(epochs=2),
        lora_recipe=recipe.with_(lr=2e-3, freeze_embeddings=False),
        prune_per_layer=3,
        taylor_pool=4,
        circuit_pool=48,
        circuit_tie_break="order",
        circuit_ood=crops,
    )


# What a step still does as protocol 1; its table's other notes are the current task's (protocol 2's)
STILL_PROTOCOL_1 = {
    "ood": "circuits on 80 grey crops of two scikit-learn sample photographs as OOD validation, not on the OOD "
    "sources' validation parts",
    "ties": "circuit ties decided by (layer, head) order",
    "pools": "half the heads pruned (3 of each layer's 6; circuits 36 of 72), Hydra (Taylor) sampling from each "
    "layer's 4 least useful heads and Hydra (Circ) from the circuit's first 48",
    "training": "the single model trained 4 epochs (the best validation NLL kept) with dropout 0.1 in each layer and "
    "label smoothing 0.1, no augmentation; pruned models 2 epochs",
}


def steps(current: Task, crops: list) -> list[tuple[str, Task, list[str]]]:
    """[(what the step adds, its task, its rows)], each step's task the previous one with one change."""
    old = protocol_1(current, crops)
    ood = replace(old, circuit_ood=current.circuit_ood)
    ties = replace(ood, circuit_tie_break=current.circuit_tie_break)
    budgets = ("prune_per_layer", "taylor_pool", "circuit_pool")
    pools = replace(ties, **{name: getattr(current, name) for name in budgets})
    return [
        ("0. protocol 1 (before issue 39)", _said(old, 0, STILL_PROTOCOL_1), [*CORE, "Hydra (Taylor)"]),
        ("1. + OOD validation from the OOD sources", _said(ood, 1, ["ties", "pools", "training"]), CORE),
        ("2. + circuit ties by the secondary score", _said(ties, 2, ["pools", "training"]), CORE),
        ("3. + a third pruned, pools twice the budget", _said(pools, 3, ["training"]), [*CORE, "Hydra (Taylor)"]),
        ("4. + training as §C.1.2 / §D.2 (= protocol 2), 5. + fused then fine-tuned", current, LAST),
    ]


def _said(task: Task, k: int, still: list[str]) -> Task:
    """`task` with a first note saying where step k differs from the notes that follow (protocol 2's); notes are
    no setting (`Task.settings`), so the step's cache and records stay where they are."""
    differs = "; ".join(STILL_PROTOCOL_1[name] for name in still)
    note = (
        f"Ablation step {k} (benchmarks/protocol_ablation.py) differs from the notes below (protocol 2's): {differs}."
    )
    return replace(task, notes=[note, *task.notes])


CIRCUIT_DATA = ("circuit_id", "circuit_ood")  # the same batches (`replace` keeps them): compared by identity
CIRCUIT_SEARCH = ("circuit_method", "circuit_top", "circuit_precision", "circuit_tie_break")


def same_circuit(a: Task, b: Task, layers: int) -> bool:
    """Whether two steps that start from one single model search the same circuit: the same validation data,
    search and tie rule, and as many removals. Steps 2 and 3 do (step 3 changes budgets and pools, not the 48 heads
    its circuit ranks), so step 3 takes step 2's circuit instead of an identical ~2 h search (`reuse_circuit`)."""
    return (
        all(getattr(a, name) is getattr(b, name) for name in CIRCUIT_DATA)
        and all(getattr(a, name) == getattr(b, name) for name in CIRCUIT_SEARCH)
        and suite.circuit_removals(a, layers) == suite.circuit_removals(b, layers)
    )


def reuse_circuit(earlier: Path, later: Path) -> bool:
    """Copy the circuit (and its search state) of an earlier step's seed directory into a later one that has none.
    Returns whether it did. Only for steps that `same_circuit` says search the same one."""
    names = ("circuit_avg.json", "circuit_avg_state.json")
    if not (earlier / names[0]).exists() or (later / names[0]).exists():
        return False
    later.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (earlier / name).exists():
            shutil.copy2(earlier / name, later / name)
    return True


def take_earlier_circuit(all_steps: list, k: int, seed: int, cache: Path, layers: int) -> None:
    """Give step k (one of 1-3, which start from step 0's model) the circuit of an earlier such step that searches
    the same one, from the cache or, where that step ran elsewhere, from its records."""
    task = all_steps[k][1]
    for j, (_, earlier, _) in enumerate(all_steps[1:k], start=1):
        if not same_circuit(earlier, task, layers):
            continue
        recorded = RECORDS / runner.task_key(earlier) / f"seed{seed}"
        for from_dir in (runner.seed_dir(cache, earlier, seed), recorded):
            if reuse_circuit(from_dir, runner.seed_dir(cache, task, seed)):
                print(f"step {k} searches the circuit of step {j}: taken from {from_dir}", flush=True)


def same_as_note(dirs: list[Path], k: int) -> str:
    """What a step whose models are the step above's (`same_models`) says of its rows, from the two circuits."""
    circuit = json.loads((dirs[k - 1] / "circuit_avg.json").read_text())
    tied = sum(1 for t in circuit.get("ties", []) if t)
    return (
        f"Its circuit removes the same {len(circuit['removed'])} heads in the same order as step {k - 1}'s ({tied} "
        f"of whose removals tied), so its models are step {k - 1}'s and its rows are step {k - 1}'s, not trained "
        "again."
    )


def changes_circuit_only(above: Task, task: Task) -> bool:
    """Whether `task` differs from the step above only in how its circuit is searched (its data, search or tie
    rule): then, where its circuit comes out the same, so does every model it builds."""
    changed = {
        f.name for f in fields(task) if f.name != "notes" and getattr(task, f.name) is not getattr(above, f.name)
    }
    return bool(changed) and changed <= set(CIRCUIT_DATA + CIRCUIT_SEARCH)


def ranking(folder: Path) -> list | None:
    """The heads a seed directory's circuit removes, in order; None before it is searched."""
    path = folder / "circuit_avg.json"
    return json.loads(path.read_text())["removed"] if path.exists() else None


def circuit_only(all_steps: list, k: int) -> bool:
    """Whether step k and the step above both start from step 0's single model (steps 1-3) with the same rows to
    build, and step k changes only how the circuit is searched (`changes_circuit_only`)."""
    return 2 <= k <= 3 and changes_circuit_only(all_steps[k - 1][1], all_steps[k][1])


def same_models(all_steps: list, dirs: list[Path], k: int) -> bool:
    """Whether step k builds the models of the step above (then its rows are that step's, not trained again): its
    change acts on the circuit search alone (`circuit_only`) and its circuit removes the same heads in the same
    order (step 2 on a seed whose step-1 search had no tie: the tie rule decided nothing). Same single model,
    circuit, pools, recipes and seeds: the same members."""
    return circuit_only(all_steps, k) and ranking(dirs[k - 1]) == ranking(dirs[k])


def search_circuit(task: Task, seed: int, cache: Path, base) -> None:
    """Search (or resume) the circuit of a step's seed, before its rows: it decides whether they are trained."""
    folder = runner.prepared_seed_dir(cache, task, seed)
    suite.Pieces(runner.SeedRun(task, seed, folder, base=base)).circuit()


def as_above(out: Path, k: int, all_steps: list, dirs: list[Path]) -> bool:
    """Write step k's table as the step above's rows (`same_models`): its own notes, the step above's rows and
    models built again, and a `same_as` note. False while the step above has no table."""
    above_path = out / f"step{k - 1}" / "table.json"
    if not above_path.exists():
        return False
    above, (label, task, _) = json.loads(above_path.read_text()), all_steps[k]
    said = same_as_note(dirs, k)
    rebuilt = rebuilt_notes_of(above, all_steps[k - 1][1])
    summary = above | {"notes": [*task.notes, *rebuilt], "same_as": {"step": k - 1, "note": said}}
    write_json_atomic(out / f"step{k}" / "table.json", summary)
    link = f"[step {k - 1}'s table](../step{k - 1}/table.md)"
    write_text_atomic(out / f"step{k}" / "table.md", f"# Ablation step {label}\n\n{said} Its rows: {link}.\n")
    return True


def run_steps(chosen: list[int], seed: int, cache: Path, out: Path, command: str) -> dict:
    """Each chosen step's rows on `seed`, then the ablation table across every step that has results."""
    current = dinov2_task("full")
    crops = _image_batches(dinov2_pixels)(photo_crops(80))  # protocol 1's 80 crops
    all_steps = steps(current, crops)
    first_single = runner.seed_dir(cache, all_steps[0][1], seed) / "models" / "single"
    dirs = [runner.seed_dir(cache, task, seed) for _, task, _ in all_steps]
    summaries = {}
    for k, (label, task, rows) in enumerate(all_steps):
        if k not in chosen:
            continue
        base = (lambda: load_predictor(first_single)) if 1 <= k <= 3 else None  # step 0's single model
        if base is not None and not first_single.exists():
            raise SystemExit(f"step {k} starts from step 0's single model: run step 0 first (--steps 0 {k}).")
        print(f"[{label}]", flush=True)
        runner.pull_records(RECORDS, cache, task)  # goes on from another machine's rows
        shape = first_single.parents[1] / "shape.json"  # step 0's model: its layer count
        if base is not None and shape.exists():
            take_earlier_circuit(all_steps, k, seed, cache, json.loads(shape.read_text())["layers"])
        if circuit_only(all_steps, k):
            search_circuit(task, seed, cache, base)  # first: if it is the step above's, nothing else is trained
            if same_models(all_steps, dirs, k) and as_above(out, k, all_steps, dirs):
                print(f"step {k}: the circuit of step {k - 1}, so its models and rows: not trained again", flush=True)
                runner.push_records(cache, RECORDS, task)
                continue
        try:
            summaries[k] = runner.run(
                task,
                suite.TABLE,
                [seed],
                out / f"step{k}",
                cache,
                command=command,
                rows=rows,
                latency_repeats=0,
                base=base,
            )
        finally:
            runner.push_records(cache, RECORDS, task)
    record = {"seed": seed, "machine": machine(), "command": command}
    record |= {"steps": {}, "between": {}, "rebuilt": {}, "same_as": {}}
    for k, (label, task, _) in enumerate(all_steps):
        path = out / f"step{k}" / "table.json"
        if path.exists():
            summary = json.loads(path.read_text())
            record["steps"][label] = summary
            if rebuilt := rebuilt_notes_of(summary, task):
                record["rebuilt"][label] = rebuilt
    labels = labels_of(current.test)
    models = list(range(len(all_steps)))  # the step whose models (and logits) each step's rows are
    for k in range(1, len(all_steps)):
        if not all((out / f"step{j}" / "table.json").exists() for j in (k - 1, k)):
            continue  # a step still running (or not run) has partial rows in the cache: compared once it is done
        if same_models(all_steps, dirs, k):
            models[k] = models[k - 1]
            record["same_as"][all_steps[k][0]] = same_as_note(dirs, k)
            continue
        rows = [row for row in all_steps[k][2] if row in all_steps[k - 1][2]]
        said = between_steps(dirs[models[k - 1]], dirs[k], k, rows, labels, seed)
        if said:
            record["between"][all_steps[k][0]] = said
    write_json_atomic(out / "ablation.json", record)
    write_text_atomic(out / "ablation.md", markdown(record))  # the committed table, never half-written
    return record


def rebuilt_notes_of(summary: dict, task: Task) -> list[str]:
    """The notes of a step's table after the task's own: one per seed whose models were built again with other
    weights (`runner.run` appends `records.rebuilt_notes` to `task.notes`)."""
    return summary.get("notes", [])[len(task.notes) :]


def between_steps(before: Path, after: Path, k: int, rows: list[str], labels: Tensor, seed: int) -> dict:
    """The paired bootstrap of each row step k shares with step k - 1 (its logits in each step's seed directory,
    every step tested on the same sets): what step k's change moved, with intervals. {} where logits are missing."""
    said = row_differences({seed: after}, labels, [(row, row) for row in rows], other_dirs={seed: before})
    for pair in said.get("pairs", []):
        pair["rows"] = [f"{pair['rows'][0]}, step {k}", f"step {k - 1}"]
    return said


def markdown(record: dict) -> str:
    header = ["Step", "Row", *(c.header for c in SHOWN)]
    body = []
    for label, summary in record["steps"].items():
        for row, stats in summary["rows"].items():
            body.append([label, row, *(mean_std(stats.get(f"{c.where}.{c.key}"), c.scale, c.digits) for c in SHOWN)])
    lines = [
        f"# image-dinov2: which protocol change moved what (seed {record['seed']})",
        "",
        f"Command: `{record['command']}`  ",
        f"Machine: {record['machine']}",
        "",
        "Every step is tested on the same test set and OOD test sets (the current task's); each adds one change "
        "to the step above (benchmarks/protocol_ablation.py's docstring). Values in %, NLL in nats; OOD by "
        "maximum softmax probability.",
        "",
        *render(header, body, "markdown"),
    ]
    for label, summary in record["steps"].items():
        if summary.get("same_as"):
            lines += ["", f"**{label}**", "", summary["same_as"]["note"]]
        elif summary.get("differences"):
            lines += ["", f"**{label}**", "", *difference_lines(summary["differences"])]
    if record.get("rebuilt"):
        lines += ["", "## Models built again", ""]
        lines += [f"**{label}**: {' '.join(notes)}\n" for label, notes in record["rebuilt"].items()]
    moved = {**record.get("between", {}), **record.get("same_as", {})}
    if moved:
        lines += ["", "## What each step moved: each row against the same row of the step above", ""]
        for label in (label for label in record["steps"] if label in moved):
            said = moved[label]  # a string where the step's models are the step above's
            said = [f"Nothing: {said[0].lower()}{said[1:]}"] if isinstance(said, str) else difference_lines(said)
            lines += [f"**{label}**", "", *said, ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 1, 2, 3, 4], choices=range(5))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    command = shlex.join(["python", "benchmarks/protocol_ablation.py", *(sys.argv[1:] if argv is None else argv)])
    run_steps(sorted(args.steps), args.seed, cache_dir() / "bench" / "full", args.out, command)


if __name__ == "__main__":
    main()
