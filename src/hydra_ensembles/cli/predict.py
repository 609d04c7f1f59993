"""Prediction with uncertainty: per input, the predicted class, its probability, the ensemble's mutual
information and an OOD flag.

The flag compares an OOD score (higher = more OOD; default: one minus the maximum softmax probability) with a
threshold chosen on ID validation inputs (--calibration) so that --tpr of them (default 95%) are accepted as ID;
or pass --threshold yourself. Output: a table (default) or JSON lines (--format jsonl), to stdout or --output.
With --conformal ALPHA, each input also gets its split conformal prediction set, which holds the true class with
probability at least 1 - ALPHA, calibrated on the labelled --calibration inputs (docs/conformal.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

from ..evaluation.conformal import SCORES as CONFORMAL_SCORES
from ..evaluation.conformal import SplitConformal, miscoverage
from ..evaluation.scores import check_flags_something, collect_scores
from ..inference import describe
from ..io import write_text_atomic
from ..outputs import labels_of
from ..predictors import class_names, model_config
from ..uncertainty import ensemble_probs, mutual_information
from .common import (
    CommandError,
    add_data_options,
    add_device_argument,
    add_inference_options,
    add_zero_shot_options,
    classifier_at,
    on_device,
    prepared,
    read_data,
    resolve_device,
    zero_shot_options,
)
from .ood import SCORE_NAMES
from .step import RECORD, check_model_dir

EXAMPLE = """hydra-ens predict --model hydra --inputs new-articles.txt --calibration val.csv
hydra-ens predict --model hydra --inputs new-articles.txt --calibration val.csv --conformal 0.1  # + prediction sets
hydra-ens predict --model hydra --inputs photos/ --calibration val-photos/ --format jsonl --output p.jsonl
hydra-ens predict --model clip-dir --classes "cat,dog,car" --inputs photos/ --calibration val-photos/  # zero-shot"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a saved Hydra Ensemble or an HF classifier")
    parser.add_argument("--inputs", required=True, help="a CSV / JSONL / .txt file or an image folder")
    parser.add_argument(
        "--calibration", help="ID validation inputs that set the OOD threshold (labels unused but by --conformal)"
    )
    parser.add_argument(
        "--tpr", type=float, help="with --calibration: the fraction of ID inputs to accept (default 0.95)"
    )
    parser.add_argument("--threshold", type=float, help="a fixed OOD threshold instead of --calibration")
    parser.add_argument(
        "--score",
        choices=SCORE_NAMES,
        default="msp",
        help="OOD score; mds, rmds, knn, vim (and _concat) need a model with detectors fitted by hydra-ens ood",
    )
    parser.add_argument(
        "--format", choices=("table", "jsonl"), default="table", help="a table, or one JSON object per line"
    )
    parser.add_argument("--output", help="write here instead of stdout")
    parser.add_argument(
        "--conformal",
        type=miscoverage,
        metavar="ALPHA",
        help="also print each input's conformal prediction set, holding the true class with probability 1 - ALPHA, "
        "calibrated on the labelled --calibration inputs",
    )
    parser.add_argument(
        "--conformal-score",
        choices=sorted(CONFORMAL_SCORES),
        help="with --conformal: the conformal score, aps (the default; randomised, seeded), raps, thr / lac "
        "(1 - p_y); docs/conformal.md",
    )
    add_data_options(parser)
    add_zero_shot_options(parser)
    add_device_argument(parser)
    add_inference_options(parser)


def _check_writable(path: Path) -> None:
    if path.is_dir():
        raise CommandError(f"--output {str(path)!r} is a folder: give a file path inside it.")
    folder = path.parent
    if not folder.is_dir():
        raise CommandError(f"--output {str(path)!r}: its folder {str(folder)!r} does not exist; create it first.")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise CommandError(f"--output {str(path)!r} cannot be written here (permissions): give another path.")


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    model_dir = check_model_dir(args.model)
    if args.output:  # before any inference: a path it cannot write would lose it all
        _check_writable(Path(args.output))
    model = on_device(classifier_at(model_dir, zero_shot=zero_shot_options(args)), device)  # first: what it is decides
    model = prepared(model, args)  # --precision, --compile
    if (args.calibration is None) == (args.threshold is None):
        raise CommandError("give either --calibration (ID validation inputs) or --threshold, exactly one of them.")
    if args.tpr is not None and args.threshold is not None:
        raise CommandError("--tpr chooses the threshold on --calibration inputs; with a fixed --threshold, drop it.")
    if args.conformal_score is not None and args.conformal is None:
        raise CommandError("--conformal-score is the score of --conformal's prediction sets: pass --conformal ALPHA.")
    args.tpr = 0.95 if args.tpr is None else args.tpr
    args.conformal_score = args.conformal_score or "aps"
    if not 0 < args.tpr <= 1:
        raise CommandError(f"--tpr must be in (0, 1], got {args.tpr}.")
    if args.conformal is not None and args.calibration is None:
        raise CommandError("--conformal calibrates on labelled --calibration inputs: give them, not --threshold.")
    if args.conformal is not None:
        _check_not_fitted_on(args.model, args.calibration)
    threshold, origin, conformal = _calibrate(args, model, model_dir)
    data = read_data(args, args.inputs, model_dir, model_config(model), labelled=False, flag="--inputs")
    member_logits, scores = collect_scores(model, data.batches, args.score, not args.quiet)
    check_flags_something(args.score, member_logits)  # also under --threshold, which has no calibration pass
    member_logits = member_logits.double()  # (N, M, C), as evaluation
    rows = predictions(member_logits, scores, threshold, class_names(model), data.examples.names)
    header = (
        f"OOD flag: {args.score} score > {threshold:.4f} (threshold {origin}); "
        f"{sum(r['ood'] for r in rows)} of {len(rows)} inputs flagged; members: {member_logits.shape[1]}; "
        f"run: {describe(model)}"
    )
    if conformal is not None:
        header += "\n" + _add_sets(rows, conformal, member_logits, class_names(model))
    if args.format == "jsonl":
        print(header, file=sys.stderr)
        text = "".join(json.dumps(row | {"score": args.score, "threshold": threshold}) + "\n" for row in rows)
    else:
        text = _table(rows, data.examples.inputs if data.examples.kind == "text" else None, header)
    if not args.output:
        sys.stdout.write(text)
        return 0
    write_text_atomic(args.output, text)  # a crash leaves a file as it was, never half of the predictions
    print(f"wrote {len(rows)} predictions to {args.output}", file=sys.stderr)
    return 0


def _check_not_fitted_on(model: str, calibration: str) -> None:
    """Split conformal's guarantee needs calibration inputs the model was not fitted on: refuse the file that
    `hydra-ens calibrate` fitted a calibration map of --model on (a histogram or isotonic map fitted on 1,000
    inputs covered about 0.85 of new inputs at alpha 0.1, not 0.9; on 100, about 0.5). The steps are followed back
    from --model's output directory (or the one holding it), through each step's --model, to a calibrate step."""
    fitted_on = _calibrated_on(Path(model))
    if fitted_on is not None and fitted_on == Path(calibration).resolve():
        raise CommandError(
            f"--calibration {calibration!r} is the data --model {model!r} was calibrated on (hydra-ens calibrate "
            "--val): conformal sets calibrated there cover less than 1 - alpha. Split the labelled data in two, "
            "one part for `calibrate --val`, the other for `predict --calibration`."
        )


def _calibrated_on(model: Path) -> Path | None:
    """The --val file of the calibrate step that made `model`, or of an earlier step it was built from."""
    folder = _step_folder(model)
    for _ in range(16):  # a chain of steps, each naming the --model it took
        if folder is None:
            return None
        step = json.loads((folder / RECORD).read_text())
        settings = step.get("settings", {})
        if step.get("command") == "calibrate" and "path" in settings.get("val", {}):
            return Path(settings["val"]["path"])
        earlier = settings.get("model", {}).get("path") if isinstance(settings.get("model"), dict) else None
        folder = _step_folder(Path(earlier)) if earlier else None
    return None


def _step_folder(model: Path) -> Path | None:
    """The step output directory that holds `model`: `model` itself, or the folder above it (`out/model`)."""
    return next((folder for folder in (model, model.parent) if (folder / RECORD).is_file()), None)


def _calibrate(args: argparse.Namespace, model, model_dir) -> tuple[float, str, SplitConformal | None]:
    """The OOD threshold and where it came from (--threshold, or chosen on the --calibration inputs), and with
    --conformal the split conformal sets calibrated on those labelled inputs: one pass over them for both."""
    if args.calibration is None:
        return args.threshold, "given by --threshold", None
    labelled = args.conformal is not None
    calibration = read_data(
        args, args.calibration, model_dir, model_config(model), labelled=labelled, flag="--calibration"
    )
    member_logits, id_scores = collect_scores(model, calibration.batches, args.score, not args.quiet)
    check_flags_something(args.score, member_logits)
    threshold, accepted = id_threshold(id_scores, args.tpr)
    inputs = len(id_scores)
    origin = f"chosen on {inputs} ID calibration inputs to accept {args.tpr:.1%} of them (accepts {accepted:.1%})"
    if not labelled:
        return threshold, origin, None
    probs, labels = ensemble_probs(member_logits.double()), labels_of(calibration.batches)
    return threshold, origin, SplitConformal(args.conformal, args.conformal_score).calibrate(probs, labels)


def _add_sets(rows: list[dict], conformal: SplitConformal, member_logits: torch.Tensor, names: list[str]) -> str:
    """Each row's prediction set under "set" (class names, most probable first), and the line that says how the
    sets were made. member_logits (N, M, C)."""
    probs = ensemble_probs(member_logits)
    sets = conformal.sets(probs)  # (N, C)
    for row, in_set, p in zip(rows, sets, probs):
        row["set"] = [names[c] for c in p.argsort(descending=True).tolist() if in_set[c]]
    sizes = sets.double().sum(dim=1)
    score = conformal.score.__class__.__name__.upper()
    return (
        f"Conformal sets: {score} score <= {conformal.quantile:.4f}, calibrated on {conformal.calibration_size} "
        f"labelled inputs to hold the true class with probability {100 * (1 - conformal.alpha):.4g}%; "
        f"mean size {sizes.mean():.2f}, {int((sizes == 0).sum())} empty"
    )


def predictions(
    member_logits: torch.Tensor, scores: torch.Tensor, threshold: float, names: list[str], inputs: list[str]
) -> list:
    """One row per input: predicted class, its probability, mutual information, OOD score and flag.
    member_logits (N, M, C), scores (N,)."""
    confidence, predicted = ensemble_probs(member_logits).max(dim=-1)
    mi = mutual_information(member_logits)
    # MI and a score have scales of their own (a KNN distance can be 1e-5): 6 digits, not 4 decimals, or it reads as 0
    return [
        {
            "input": inputs[i],
            "prediction": names[predicted[i]],
            "probability": round(confidence[i].item(), 4),
            "mutual_information": _significant(mi[i].item()),
            "ood_score": _significant(scores[i].item()),
            "ood": bool(scores[i].item() > threshold),
        }
        for i in range(len(member_logits))
    ]


def _significant(value: float, digits: int = 6) -> float:
    return float(f"{value:.{digits}g}")


def id_threshold(id_scores: torch.Tensor, tpr: float) -> tuple[float, float]:
    """The smallest threshold t with at least `tpr` of the ID scores <= t (accepted as ID), and the fraction
    it accepts. id_scores (N,), higher = more OOD."""
    ordered = id_scores.double().sort().values
    index = max(0, math.ceil(tpr * len(ordered)) - 1)
    threshold = ordered[index].item()
    return threshold, (ordered <= threshold).double().mean().item()


def _table(rows: list[dict], texts: list[str] | None, header: str) -> str:
    lines = [header, ""]
    width = max(len(r["prediction"]) for r in rows + [{"prediction": "prediction"}])
    where = min(28, max(len(r["input"]) for r in rows + [{"input": "input"}]))
    sets = ["{" + ", ".join(r["set"]) + "}" for r in rows] if "set" in rows[0] else None  # with --conformal
    set_width = max(len(s) for s in [*sets, "set"]) if sets else 0
    columns = f"{'input':<{where}} {'prediction':<{width}} {'prob':>6} {'MI':>7} {'score':>8}  OOD"
    lines.append(columns + (f"  {'set':<{set_width}}" if sets else "") + ("  text" if texts else ""))
    for i, row in enumerate(rows):
        line = (
            f"{row['input']:<{where}} {row['prediction']:<{width}} {row['probability']:>6.3f} "
            f"{row['mutual_information']:>7.4f} {row['ood_score']:>8.4f}  {'yes' if row['ood'] else 'no ':<3}"
        )
        if sets:
            line += f"  {sets[i]:<{set_width}}"
        if texts:
            snippet = " ".join(texts[i].split())
            line += "  " + (snippet[:48] + "…" if len(snippet) > 49 else snippet)
        lines.append(line)
    return "\n".join(lines) + "\n"
