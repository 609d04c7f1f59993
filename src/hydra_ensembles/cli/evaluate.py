"""Evaluation: accuracy, calibration and OOD detection of one or more models on your test and OOD data.

Every --model (an HF classifier, or a saved Hydra Ensemble) is run on the labelled --data and every OOD set.
OOD detection follows OpenOOD: OOD is the positive class, the score is one minus the maximum softmax probability
of the ensemble's prediction (the mean of member softmaxes), or --score (feature scores: docs/ood_scores.md).
Selective classification (docs/selective.md): AURC, AUGRC, risk at 80% coverage and coverage at 5% risk;
with --conformal ALPHA, split conformal coverage and set size (docs/conformal.md); with --shift, accuracy, NLL,
ECE and uncertainty as the test inputs degrade (shift.json, shift.md, shift_*.png: docs/shift.md). With several
models, each after the first is compared with the first by a paired bootstrap interval of the difference. Writes
report.md (the table), metrics.json (every number), reliability.png, ood_scores.png and risk_coverage.png;
each model's result is recorded in results.json and its logits kept in logits/ as it is measured
(`evaluation.compare`), so an interrupted run resumes at the next model.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from ..evaluation import plots
from ..evaluation.bootstrap import difference_lines, row_differences
from ..evaluation.compare import Built, Data, compare, machine, row_file, time_rows
from ..evaluation.conformal import minimum_calibration, miscoverage
from ..evaluation.report import COVERAGE_LEVEL, RISK_LEVEL, conformal_metrics, selective_metrics
from ..evaluation.shift import (
    CURVE_METRICS,
    SEVERITIES,
    SHIFTS,
    PixelSpace,
    check_severities,
    curve_lines,
    curve_record,
    mean_over_shifts,
    resolve_shifts,
    shift_curve,
    text_data,
)
from ..evaluation.tables import (
    EVALUATE_COLUMNS,
    SELECTIVE_CONVENTIONS,
    aggregate,
    conformal_lines,
    conventions,
    over_seeds,
    per_set_lines,
    table_lines,
)
from ..fusion import HydraEnsemble
from ..inference import describe
from ..io import without_late_defaults, write_json_atomic, write_text_atomic
from ..outputs import labels_of
from ..predictors import (
    DeepEnsemble,
    ZeroShotEnsemble,
    base_model,
    class_names,
    load_preprocessor,
    model_config,
    wrapper_chain,
)
from ..predictors.card import write_card
from ..pruning import kept_heads
from ..uncertainty import ensemble_probs
from .common import (
    CommandError,
    add_data_options,
    add_device_argument,
    add_inference_options,
    add_zero_shot_options,
    at_least,
    classifier_at,
    data_settings,
    named_sources,
    on_device,
    prepared,
    read_data,
    resolve_device,
    zero_shot_options,
)
from .ood import SCORE_NAMES
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
        type=at_least(0),
        default=7,
        help="rounds of interleaved timing on one batch for the latency column; 0: no latency",
    )
    parser.add_argument(
        "--score",
        choices=SCORE_NAMES,
        default="msp",
        help="the OOD score of the AUROC, FPR95 and AUPR columns; mds, rmds, knn, vim (and _concat) need a model "
        "with detectors fitted by hydra-ens ood (docs/ood_scores.md)",
    )
    parser.add_argument(
        "--conformal",
        type=miscoverage,
        metavar="ALPHA",
        help="also report split conformal coverage and set size at 1 - ALPHA (THR, APS, RAPS), calibrated on random "
        "halves of --data",
    )
    parser.add_argument(
        "--shift",
        nargs="*",
        metavar="NAME",
        help="also measure the test data under growing distribution shift (docs/shift.md): these shifts, or with no "
        f"name every shift of the data's modality; known: {', '.join(SHIFTS)}",
    )
    parser.add_argument(
        "--severities",
        nargs="+",
        type=int,
        help=f"with --shift: its severities, 1..5 (0, clean, always; default {' '.join(map(str, SEVERITIES))})",
    )
    add_output_options(parser)
    add_data_options(parser)
    add_zero_shot_options(parser)
    add_device_argument(parser)
    add_inference_options(parser)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    models = named_sources(args.model, "--model")
    sets = {group: named_sources(getattr(args, group), f"--{group}") for group in ("near", "far", "ood")}
    names = [name for group in sets.values() for name in group]
    if len(set(names)) < len(names):
        raise CommandError(f"OOD set names repeat across --near / --far / --ood: {names}; name them NAME=PATH.")
    for name, path in models.items():
        check_model_dir(path, f"--model {name}")
    if args.shift is None and args.severities is not None:
        raise CommandError("--severities applies to --shift: pass --shift (with or without names) too, or drop it.")
    if args.shift is not None:  # checked before any model runs; no name: every shift of the data's modality
        args.shift = resolve_shifts(args.shift) if args.shift else []
        args.severities = check_severities(args.severities if args.severities is not None else list(SEVERITIES))
    settings = {
        "models": {name: fingerprint_path(path, f"--model {name}") for name, path in models.items()},
        "data": fingerprint_path(args.data, "--data"),
        "zero_shot": vars(zero_shot_options(args)),
        "sets": {group: {n: fingerprint_path(p, f"--{group}") for n, p in s.items()} for group, s in sets.items()},
        **data_settings(args),
        # reports made before the flag ran in fp32: they stay valid for it
        **without_late_defaults(
            {"precision": args.precision, "compile": args.compile}, {"precision": "fp32", "compile": False}
        ),
        **without_late_defaults({"conformal": args.conformal}, {"conformal": None}),
        **without_late_defaults({"score": args.score}, {"score": "msp"}),
        **without_late_defaults({"latency_repeats": args.latency_repeats}, {"latency_repeats": 7}),
        **({} if args.shift is None else {"shift": args.shift, "severities": args.severities}),
    }
    out = start_step(args, "evaluate", settings, "report.md")
    if out is None:
        return 0
    built = _built(args, models, sets, device)
    _check_conformal(args.conformal, len(labels_of(next(iter(built.values())).data.test)))
    shifted = None if args.shift is None else _shift_inputs(args, models, built)
    run = {name: replace(row, predictor=prepared(row.predictor, args)) for name, row in built.items()}
    builds = {name: (lambda name=name: run[name]) for name in run}
    results = compare(
        builds,
        None,
        out.path / "results.json",
        out.path / "logits",
        progress=not args.quiet,
        require_logits=True,
        score=args.score,
    )
    logits = {name: torch.load(row_file(out.path / "logits", name)) for name in results}
    labels = labels_of(next(iter(built.values())).data.test)
    latency = None
    if args.latency_repeats:
        batches = {name: row.data.test[0] for name, row in run.items()}
        predictors = {name: row.predictor for name, row in run.items()}
        latency = time_rows(predictors, batches, args.latency_repeats, progress=not args.quiet)
    rows = aggregate({0: results})
    selective = {name: selective_metrics(logits[name]["test"], labels) for name in results}  # from the kept logits
    for name, values in selective.items():
        rows[name] |= {f"id.{key}": over_seeds([value]) for key, value in values.items()}
    lines = [
        "# Evaluation",
        "",
        f"Test data: `{args.data}` ({len(labels)} examples); OOD sets: "
        + (", ".join(f"{n} (`{p}`, {g})" for g, s in sets.items() for n, p in s.items()) or "none"),
        "",
        f"Machine: {machine()}; models run {describe(next(iter(run.values())).predictor)}",
        "",
        *table_lines(rows, latency, EVALUATE_COLUMNS),
        "",
        f"OOD score: {args.score} (higher = more OOD; docs/ood_scores.md).",
        "",
        conventions(args.score),
        "",
        SELECTIVE_CONVENTIONS,
        "",
    ]
    conformal = None
    if args.conformal is not None:
        conformal = {name: conformal_metrics(logits[name]["test"], labels, args.conformal) for name in results}
        lines += [*conformal_lines(conformal, args.conformal), ""]
    differences = _differences(out.path, labels, list(results), args.score)
    if differences:
        lines += [f"Each model against the first, {next(iter(results))}:", "", *difference_lines(differences), ""]
    if names:
        lines += ["AUROC (%) per OOD set:", "", *per_set_lines({0: results}, names), ""]
    write_text_atomic(out.path / "report.md", "\n".join(lines))
    write_json_atomic(
        out.path / "metrics.json",
        {
            "models": {n: str(p) for n, p in models.items()},
            "results": results,
            "latency": latency,
            "selective": {"coverage": COVERAGE_LEVEL, "risk": RISK_LEVEL, "models": selective},
            "conformal": None if conformal is None else {"alpha": args.conformal, "models": conformal},
            "differences": differences,
            "inference": {"precision": args.precision, "compile": args.compile},
        },
    )
    for name, path in models.items():  # each model's card (README.md beside its weights) shows these metrics
        report = {"metrics": results[name]["metrics"], "report": str(out.path / "report.md")}
        try:
            write_card(built[name].predictor, check_model_dir(path), report)
        except OSError as error:  # a model card of the user's own (FileExistsError), a read-only folder
            print(f"note: {name}'s card not updated: {error}")
    plots.logit_figures(logits, labels, out.path, "evaluation", args.score)
    curves = {name: (ensemble_probs(v["test"].double()), labels) for name, v in logits.items()}  # as the table
    plots.risk_coverage(curves, out.path / "risk_coverage.png", "evaluation: risk-coverage (test)")
    if shifted is not None:
        by_model = {
            name: shift_curve(run[name].predictor, **kw, progress=not args.quiet) for name, kw in shifted.items()
        }
        _write_shift(by_model, args.data, out.path)
    out.finish({"models": list(results)})
    print("\n".join(lines))
    shift_files = "" if shifted is None else ", shift.json, shift.md" + (", shift_*.png" if len(shifted) > 1 else "")
    print(f"wrote {out.path}/report.md, metrics.json, reliability.png, ood_scores.png, risk_coverage.png{shift_files}")
    return 0


def _shift_inputs(args: argparse.Namespace, models: dict[str, str], built: dict[str, Built]) -> dict[str, dict]:
    """`shift_curve`'s arguments per model, checked before anything runs: the test batches and the image
    processor's normalisation, or the raw test texts re-read for the model's tokenizer."""
    shifted = {}
    for name, path in models.items():
        model_dir, test = check_model_dir(path, f"--model {name}"), built[name].data.test
        kind, preprocessor = load_preprocessor(model_dir)
        shifted[name] = {"shifts": resolve_shifts(args.shift, kind), "severities": args.severities}
        if kind == "image":
            shifted[name] |= {"data": test, "pixels": PixelSpace.of(preprocessor)}
            continue
        config = model_config(built[name].predictor)
        texts = read_data(args, args.data, model_dir, config, labelled=True, flag="--data").examples.inputs
        labels = labels_of(test).tolist()
        shifted[name]["data"] = text_data(preprocessor, texts, labels, args.batch_size, args.max_length, config)
    return shifted


def _write_shift(curves: dict, data: str, out_dir: Path) -> None:
    """shift.json, shift.md and, for several models, one shift_METRIC.png per metric (mean over the shifts)."""
    write_json_atomic(out_dir / "shift.json", curve_record(curves, seed=0))
    lines = [
        f"# Shift curves on `{data}`",
        "",
        "Severity 0 is the clean data; docs/shift.md says what each shift does.",
        "",
    ]
    write_text_atomic(out_dir / "shift.md", "\n".join([*lines, *curve_lines(curves)]))
    if len(curves) > 1:
        for metric, (title, scale, _) in CURVE_METRICS.items():
            series = {m: {s: scale * v[metric] for s, v in mean_over_shifts(c).items()} for m, c in curves.items()}
            plots.shift_curves(series, out_dir / f"shift_{metric}.png", title, "evaluation: mean over shifts")


def _differences(out: Path, labels: torch.Tensor, names: list[str], score: str) -> dict:
    """Each model after the first against the first, a paired bootstrap over the test examples (one seed), as
    `row_differences` keeps it; {} for one model. Its AUROC ranks by MSP: left out under another --score."""
    if len(names) < 2:
        return {}
    first, *others = names
    try:
        differences = row_differences({0: out}, labels, [(name, first) for name in others])
    except ValueError as error:  # too few examples to resample: the report goes on without the intervals
        print(f"note: no intervals of the differences between models: {error}")
        return {}
    if differences and score != "msp":
        for pair in differences["pairs"]:
            pair.pop("auroc_all", None)
    return differences


def _check_conformal(alpha: float | None, examples: int) -> None:
    """Half the test examples must be enough to calibrate --conformal at its alpha."""
    if alpha is not None and examples // 2 < minimum_calibration(alpha):
        raise CommandError(
            f"--conformal {alpha} calibrates on half of --data ({examples // 2} of its {examples} examples) and needs "
            f"at least {minimum_calibration(alpha)}: give more test data or a larger alpha."
        )


def _built(
    args: argparse.Namespace, models: dict[str, str], sets: dict[str, dict[str, str]], device: torch.device
) -> dict[str, Built]:
    """Every --model loaded onto `device`, with the data read its own way (its tokenizer or image processor); all
    must predict the same classes."""
    built, classes = {}, None
    for name, path in models.items():
        model_dir = check_model_dir(path, f"--model {name}")
        model = on_device(classifier_at(model_dir, f"--model {name}", zero_shot=zero_shot_options(args)), device)
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
    """Kept heads per layer, as the benchmark tables and the demo write them: "12" (one model), "8x3" (3 members,
    a deep ensemble's or a Hydra Ensemble's, keeping 8 heads in every layer), "7.7x3 (avg)" (the mean over layers
    and members, where they differ); zero-shot: each member's kept heads of both towers, "60+72 + 62+70"."""
    inner, deep = base_model(model), [m for m in wrapper_chain(model) if isinstance(m, DeepEnsemble)]
    if isinstance(inner, ZeroShotEnsemble):
        return " + ".join(f"{image}+{text}" for image, text in inner.head_counts())
    if deep:  # its base is its first member only
        maps = [kept_heads(base_model(member)) for member in deep[0].models]
    else:
        maps = inner.head_maps if isinstance(inner, HydraEnsemble) else [kept_heads(inner)]
    counts = [len(heads) for head_map in maps for heads in head_map.values()]  # per member and layer
    mean = sum(counts) / len(counts)
    said = f"{mean:.0f}" if mean.is_integer() else f"{mean:.1f}"
    said += f"x{len(maps)}" if len(maps) > 1 else ""
    return said + (" (avg)" if len(set(counts)) > 1 else "")
