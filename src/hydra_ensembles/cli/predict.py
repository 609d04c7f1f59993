"""Prediction with uncertainty: per input, the predicted class, its probability, the ensemble's mutual
information and an OOD flag.

The flag compares an OOD score (higher = more OOD; default: one minus the maximum softmax probability) with a
threshold chosen on ID validation inputs (--calibration) so that --tpr of them (default 95%) are accepted as ID;
or pass --threshold yourself. Output: a table (default) or JSON lines (--format jsonl), to stdout or --output.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from ..evaluation.ood import OOD_SCORES
from ..outputs import collect_member_logits
from ..uncertainty import ensemble_probs, mutual_information
from .common import (
    CommandError,
    add_data_options,
    add_zero_shot_options,
    check_model_dir,
    class_names,
    load_predictor,
    model_config,
    read_data,
    zero_shot_options,
)

EXAMPLE = """hydra-ens predict --model hydra --inputs new-articles.txt --calibration val.csv
hydra-ens predict --model hydra --inputs photos/ --calibration val-photos/ --format jsonl --output p.jsonl
hydra-ens predict --model clip-dir --classes "cat,dog,car" --inputs photos/ --calibration val-photos/  # zero-shot"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a saved Hydra Ensemble or an HF classifier")
    parser.add_argument("--inputs", required=True, help="a CSV / JSONL / .txt file or an image folder")
    parser.add_argument("--calibration", help="ID validation inputs that set the OOD threshold (labels unused)")
    parser.add_argument("--tpr", type=float, default=0.95, help="fraction of ID inputs to accept (default: 0.95)")
    parser.add_argument("--threshold", type=float, help="a fixed OOD threshold instead of --calibration")
    parser.add_argument("--score", choices=sorted(OOD_SCORES), default="msp", help="OOD score (default: msp)")
    parser.add_argument("--format", choices=("table", "jsonl"), default="table")
    parser.add_argument("--output", help="write here instead of stdout")
    add_data_options(parser)
    add_zero_shot_options(parser)


def run(args: argparse.Namespace) -> int:
    if (args.calibration is None) == (args.threshold is None):
        raise CommandError("give either --calibration (ID validation inputs) or --threshold, exactly one of them.")
    if not 0 < args.tpr <= 1:
        raise CommandError(f"--tpr must be in (0, 1], got {args.tpr}.")
    model_dir = check_model_dir(args.model)
    model = load_predictor(model_dir, zero_shot=zero_shot_options(args))
    config = model_config(model)
    score_fn = OOD_SCORES[args.score]
    progress = not args.quiet
    if args.calibration is not None:
        calibration = read_data(args, args.calibration, model_dir, config, labelled=False, flag="--calibration")
        id_scores = score_fn(collect_member_logits(model, calibration.batches, progress))
        threshold, accepted = id_threshold(id_scores, args.tpr)
        origin = (
            f"chosen on {len(id_scores)} ID calibration inputs to accept {args.tpr:.1%} of them "
            f"(accepts {accepted:.1%})"
        )
    else:
        threshold, origin = args.threshold, "given by --threshold"
    data = read_data(args, args.inputs, model_dir, config, labelled=False, flag="--inputs")
    member_logits = collect_member_logits(model, data.batches, progress).double()  # (N, M, C), as evaluation
    probs = ensemble_probs(member_logits)
    confidence, predicted = probs.max(dim=-1)
    mi = mutual_information(member_logits)
    scores = score_fn(member_logits)
    names = class_names(model)
    rows = [
        {
            "input": data.examples.names[i],
            "prediction": names[predicted[i]],
            "probability": round(confidence[i].item(), 4),
            "mutual_information": round(mi[i].item(), 4),
            "ood_score": round(scores[i].item(), 4),
            "ood": bool(scores[i].item() > threshold),
        }
        for i in range(len(probs))
    ]
    header = (
        f"OOD flag: {args.score} score > {threshold:.4f} (threshold {origin}); "
        f"{sum(r['ood'] for r in rows)} of {len(rows)} inputs flagged; members: {member_logits.shape[1]}"
    )
    stream = open(args.output, "w") if args.output else sys.stdout
    try:
        if args.format == "jsonl":
            print(header, file=sys.stderr)
            for row in rows:
                stream.write(json.dumps(row | {"score": args.score, "threshold": threshold}) + "\n")
        else:
            stream.write(_table(rows, data.examples.inputs if data.examples.kind == "text" else None, header))
    finally:
        if args.output:
            stream.close()
            print(f"wrote {len(rows)} predictions to {args.output}", file=sys.stderr)
    return 0


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
    columns = f"{'input':<{where}} {'prediction':<{width}} {'prob':>6} {'MI':>7} {'score':>8}  OOD"
    lines.append(columns + ("  text" if texts else ""))
    for i, row in enumerate(rows):
        line = (
            f"{row['input']:<{where}} {row['prediction']:<{width}} {row['probability']:>6.3f} "
            f"{row['mutual_information']:>7.4f} {row['ood_score']:>8.4f}  {'yes' if row['ood'] else 'no ':<3}"
        )
        if texts:
            snippet = " ".join(texts[i].split())
            line += "  " + (snippet[:48] + "…" if len(snippet) > 49 else snippet)
        lines.append(line)
    return "\n".join(lines) + "\n"
