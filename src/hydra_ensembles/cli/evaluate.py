"""Evaluation: accuracy, calibration and OOD detection of one or more models on your test and OOD data.

Every --model (an HF classifier, or a saved Hydra Ensemble) is run on the labelled --data and every OOD set.
OOD detection follows OpenOOD: OOD is the positive class, the score is one minus the maximum softmax probability
of the ensemble's prediction (the mean of member softmaxes). Writes report.md (the table), metrics.json (every
number), reliability.png and ood_scores.png; each model's result is recorded in results.json and its logits kept
in logits/ as it is measured (`evaluation.compare`), so an interrupted run resumes at the next model.
"""

from __future__ import annotations

import argparse

import torch

from ..evaluation import plots
from ..evaluation.compare import Built, Data, compare, machine, row_file, time_rows
from ..evaluation.tables import CONVENTIONS, aggregate, per_set_lines, table_lines
from ..fusion import HydraEnsemble
from ..io import without_late_defaults, write_json_atomic
from ..outputs import labels_of
from ..predictors import ZeroShotEnsemble, base_model, class_names, model_config
from ..pruning import kept_heads
from .common import (
    CommandError,
    add_data_options,
    add_device_argument,
    add_inference_precision_argument,
    add_zero_shot_options,
    classifier_at,
    data_settings,
    inference_precision,
    named_sources,
    read_data,
    resolve_device,
    zero_shot_options,
)
from .step import add_output_options, check_model_dir, fingerprint_path, start_step

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
        help="rounds of interleaved timing on one batch for the latency column; 0: no latency",
    )
    add_output_options(parser)
    add_data_options(parser)
    add_zero_shot_options(parser)
    add_device_argument(parser)
    add_inference_precision_argument(parser)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
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
        # reports made before the flag ran in fp32: they stay valid for it
        **without_late_defaults({"precision": args.precision}, {"precision": "fp32"}),
    }
    out = start_step(args, "evaluate", settings, "report.md")
    if out is None:
        return 0
    built = _built(args, models, sets, device)
    builds = {name: (lambda name=name: built[name]) for name in built}
    with inference_precision(args.precision, device):  # the metrics are float64: autocast leaves them alone
        results = compare(
            builds, None, out.path / "results.json", out.path / "logits", progress=not args.quiet, require_logits=True
        )
    logits = {name: torch.load(row_file(out.path / "logits", name)) for name in results}
    labels = labels_of(next(iter(built.values())).data.test)
    latency = None
    if args.latency_repeats:
        batches = {name: row.data.test[0] for name, row in built.items()}
        with inference_precision(args.precision, device):
            latency = time_rows({name: row.predictor for name, row in built.items()}, batches, args.latency_repeats)
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


def _built(
    args: argparse.Namespace, models: dict[str, str], sets: dict[str, dict[str, str]], device: torch.device
) -> dict[str, Built]:
    """Every --model loaded onto `device`, with the data read its own way (its tokenizer or image processor); all
    must predict the same classes."""
    built, classes = {}, None
    for name, path in models.items():
        model_dir = check_model_dir(path, f"--model {name}")
        model = classifier_at(model_dir, f"--model {name}", zero_shot=zero_shot_options(args)).to(device)
        config = model_config(model)
        if classes is not None and class_names(model) != classes:
            raise CommandError(
                f"--model {name} predicts classes {class_names(model)}, the first model {classes}: compare models "
                "of one task."
            )
        classes = class_names(model)
        test = read_data(args, args.data, model_dir, config, labelled=True, flag="--data").batches
        read = {
            group: {
                n: read_data(args, p, model_dir, config, labelled=False, flag=f"--{group}").batches
                for n, p in s.items()
            }
            for group, s in sets.items()
        }
        kind = "Hydra Ensemble" if isinstance(model, HydraEnsemble) else type(model).__name__
        print(f"{name}: {kind} from {model_dir}")
        built[name] = Built(model, {"heads": _heads(model)}, Data(test, read["near"], read["far"], read["ood"]))
    return built


def _heads(model) -> str:
    """Kept heads per member, e.g. "36 + 36 + 36" (zero-shot: image+text, "60+72 + 62+70")."""
    inner = base_model(model)
    if isinstance(inner, ZeroShotEnsemble):
        return " + ".join(f"{image}+{text}" for image, text in inner.head_counts())
    maps = inner.head_maps if isinstance(inner, HydraEnsemble) else [kept_heads(inner)]
    counts = [sum(len(h) for h in head_map.values()) for head_map in maps]
    return " + ".join(str(c) for c in counts)
