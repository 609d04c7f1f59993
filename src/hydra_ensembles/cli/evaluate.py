"""Evaluation: accuracy, calibration and OOD detection of one or more models on your test and OOD data.

Every --model (an HF classifier, or a saved Hydra Ensemble) is run on the labelled --data and every OOD set.
OOD detection follows OpenOOD: OOD is the positive class, the score is one minus the maximum softmax probability
of the ensemble's prediction (the mean of member softmaxes). Writes report.md (the table), metrics.json (every
number), reliability.png and ood_scores.png; each model's logits are kept in logits/, so an interrupted run
resumes at the next model.
"""

from __future__ import annotations

import argparse
import json

import torch

from ..cost import machine, predictor_latency
from ..evaluation import plots
from ..evaluation.report import measure
from ..evaluation.tables import CONVENTIONS, aggregate, per_set_lines, table_lines
from ..fusion import HydraEnsemble
from ..io import row_file, write_json_atomic
from ..outputs import labels_of
from ..predictors import ZeroShotEnsemble
from ..pruning import kept_heads
from .common import (
    CommandError,
    add_data_options,
    add_output_options,
    add_zero_shot_options,
    base_model,
    check_model_dir,
    class_names,
    data_settings,
    fingerprint_path,
    is_ensemble,
    load_predictor,
    model_config,
    named_sources,
    read_data,
    start_step,
    zero_shot_options,
)

EXAMPLE = """hydra-ens evaluate --model single=my-classifier --model hydra=hydra --data test.csv \\
    --near other-topics.csv --far reviews.txt --out report"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="[NAME=]PATH",
        help="a model to evaluate (repeat to compare; cost ratios are relative to the first)",
    )
    parser.add_argument("--data", required=True, help="labelled ID test data")
    for flag, what in (("--ood", "an OOD set"), ("--near", "a near-OOD set"), ("--far", "a far-OOD set")):
        parser.add_argument(flag, action="append", metavar="[NAME=]PATH", help=f"{what} (repeatable; labels unused)")
    parser.add_argument(
        "--latency-repeats",
        type=int,
        default=7,
        help="rounds of interleaved timing on one batch for the latency column (default: 7; 0: no latency)",
    )
    add_output_options(parser)
    add_data_options(parser)
    add_zero_shot_options(parser)


def run(args: argparse.Namespace) -> int:
    models = named_sources(args.model, "--model")
    sets = {group: named_sources(getattr(args, group), f"--{group}") for group in ("near", "far", "ood")}
    names = [name for group in sets.values() for name in group]
    if len(set(names)) < len(names):
        raise CommandError(f"OOD set names repeat across --near / --far / --ood: {names}; name them NAME=PATH.")
    for name, path in models.items():
        check_model_dir(path, f"--model {name}")
    settings = {
        "models": {name: fingerprint_path(path, f"--model {name}") for name, path in models.items()},
        "data": fingerprint_path(args.data, "--data"),
        "zero_shot": vars(zero_shot_options(args)),
        "sets": {group: {n: fingerprint_path(p, f"--{group}") for n, p in s.items()} for group, s in sets.items()},
        **data_settings(args),
    }
    out = start_step(args, "evaluate", settings, "report.md")
    if out is None:
        return 0
    results, logits, labels, classes, predictors, first_batches = {}, {}, None, None, {}, {}
    for name, path in models.items():
        model_dir = check_model_dir(path, f"--model {name}")
        model = load_predictor(model_dir, f"--model {name}", zero_shot=zero_shot_options(args))
        config = model_config(model)
        if classes is not None and class_names(model) != classes:
            raise CommandError(
                f"--model {name} predicts classes {class_names(model)}, the first model {classes}: compare models "
                "of one task."
            )
        classes = class_names(model)
        test = read_data(args, args.data, model_dir, config, labelled=True, flag="--data").batches
        groups = {
            group: {
                n: read_data(args, p, model_dir, config, labelled=False, flag=f"--{group}").batches
                for n, p in s.items()
            }
            for group, s in sets.items()
        }
        cached, result_file = row_file(out.path / "logits", name), row_file(out.path / "logits", name, ".json")
        if result_file.is_file() and cached.is_file():
            results[name] = json.loads(result_file.read_text())
            print(f"{name}: measured before ({cached})")
        else:
            print(f"{name}: {'Hydra Ensemble' if is_ensemble(model_dir) else type(model).__name__} from {model_dir}")
            results[name] = measure(
                model, test, groups["near"], groups["far"], cached, ood=groups["ood"], progress=not args.quiet
            )
            results[name]["heads"] = _heads(model)
            write_json_atomic(result_file, results[name])
        logits[name] = torch.load(cached)
        labels = labels_of(test)
        predictors[name], first_batches[name] = model, test[0]
    latency = None
    if args.latency_repeats:
        print(f"timing {len(predictors)} models, interleaved, {args.latency_repeats} rounds", flush=True)
        latency = predictor_latency(predictors, first_batches, args.latency_repeats)
    rows = aggregate({0: results})
    lines = [
        "# Evaluation",
        "",
        f"Test data: `{args.data}` ({len(labels)} examples); OOD sets: "
        + (", ".join(f"{n} (`{p}`, {g})" for g, s in sets.items() for n, p in s.items()) or "none"),
        "",
        f"Machine: {machine()}",
        "",
        *table_lines(rows, latency),
        "",
        CONVENTIONS,
        "",
    ]
    if names:
        lines += ["AUROC (%) per OOD set:", "", *per_set_lines({0: results}, names), ""]
    (out.path / "report.md").write_text("\n".join(lines))
    write_json_atomic(
        out.path / "metrics.json",
        {"models": {n: str(p) for n, p in models.items()}, "results": results, "latency": latency},
    )
    plots.logit_figures(logits, labels, out.path, "evaluation")
    out.finish({"models": list(results)})
    print("\n".join(lines))
    print(f"wrote {out.path}/report.md, metrics.json, reliability.png, ood_scores.png")
    return 0


def _heads(model) -> str:
    """Kept heads per member, e.g. "36 + 36 + 36" (zero-shot: image+text, "60+72 + 62+70")."""
    inner = base_model(model)
    if isinstance(inner, ZeroShotEnsemble):
        return " + ".join(f"{image}+{text}" for image, text in inner.head_counts())
    maps = inner.head_maps if isinstance(inner, HydraEnsemble) else [kept_heads(inner)]
    counts = [sum(len(h) for h in head_map.values()) for head_map in maps]
    return " + ".join(str(c) for c in counts)
