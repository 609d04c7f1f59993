"""Calibration: fit a post-hoc calibration map on labelled validation data and save the calibrated predictor.

It takes any saved classifier: an HF classifier, a Hydra Ensemble, a distilled student, a zero-shot ensemble.
`--method` picks the map (`predictors.CALIBRATION_MAPS`; definitions in docs/calibration.md):
  temperature  one temperature divides every member's logits (Guo et al., 2017); never changes a member's class
  vector       a scale and a bias per class on every member's logits (Guo et al., 2017)
  dirichlet    a C x C matrix and a bias on every member's log-probabilities, ODIR-regularised (Kull et al., 2019)
  histogram    per class, the frequency of the class in its probability's bin (Zadrozny & Elkan, 2001)
  isotonic     per class, an isotonic regression of the probability (scikit-learn; Zadrozny & Elkan, 2002)
The first three keep the members (and their mutual information); histogram and isotonic map the ensemble
probability and leave one member, so an ensemble's mutual information and disagreement become 0.
Prints what was fitted and the validation NLL and ECE before and after (on the data it was fitted on: an
optimistic "after", most for histogram and isotonic). Writes <out>/model/ (`evaluate` and
`predict` take <out> as --model). Fit on validation data, not on the test data you report on.
"""

from __future__ import annotations

import argparse

from torch import Tensor

from ..evaluation.report import classification_metrics
from ..outputs import collect_member_logits, labels_of
from ..predictors import (
    CALIBRATION_MAPS,
    Calibrated,
    CalibrationMap,
    describe_saved,
    fit_calibration,
    model_config,
    save_predictor,
)
from ..predictors.classifier import copy_tower_preprocessors
from .common import (
    add_data_options,
    add_device_argument,
    add_zero_shot_options,
    classifier_at,
    data_settings,
    on_device,
    read_data,
    resolve_device,
    zero_shot_options,
)
from .step import add_output_options, check_model_dir, fingerprint_path, start_step

EXAMPLE = """hydra-ens calibrate --model hydra --val val.csv --out hydra-calibrated
hydra-ens calibrate --model hydra --val val.csv --out hydra-dirichlet --method dirichlet
hydra-ens predict --model hydra-calibrated --inputs new.txt --calibration val.csv"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a saved classifier: an HF classifier or any saved ensemble")
    parser.add_argument("--val", required=True, help="labelled validation data to fit the calibrator on")
    parser.add_argument(
        "--method",
        choices=sorted(CALIBRATION_MAPS),
        default="temperature",
        help="temperature: one temperature for all members; vector: a scale and bias per class; "
        "dirichlet: a class-by-class matrix on log-probabilities (ODIR); histogram / isotonic: per-class maps of "
        "the ensemble probability, leaving one member (an ensemble's mutual information is lost)",
    )
    add_output_options(parser)
    add_data_options(parser)
    add_zero_shot_options(parser)
    add_device_argument(parser)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    model_dir = check_model_dir(args.model)
    settings = {
        "model": fingerprint_path(model_dir, "--model"),
        "val": fingerprint_path(args.val, "--val"),
        "method": args.method,
        "zero_shot": vars(zero_shot_options(args)),
        **data_settings(args),
    }
    out = start_step(args, "calibrate", settings, "model")
    if out is None:
        return 0
    model = on_device(classifier_at(model_dir, zero_shot=zero_shot_options(args)), device)
    val = read_data(args, args.val, model_dir, model_config(model), labelled=True, flag="--val").batches
    member_logits, labels = collect_member_logits(model, val, not args.quiet), labels_of(val)  # (N, M, C), (N,)
    calibration_map = fit_calibration(args.method, member_logits, labels)
    target = out.path / "model"
    save_predictor(
        Calibrated(model, calibration_map), target, also=lambda folder: copy_tower_preprocessors(model_dir, folder)
    )
    results = _results(args.method, calibration_map, member_logits, labels)
    out.finish({"model_dir": "model", **results})
    _report(results, calibration_map)
    print(f"wrote {target}: {describe_saved(target)}")
    return 0


def _results(method: str, calibration_map: CalibrationMap, member_logits: Tensor, labels: Tensor) -> dict:
    """What was fitted, and the validation NLL, ECE and members before and after (the calibrated member logits
    come from the map, without running the model again)."""
    quality = {}
    for when, logits in (("before", member_logits), ("after", calibration_map.apply(member_logits))):
        measured = classification_metrics(logits, labels)  # logits (N, M, C), or (N, 1, C) from a probability map
        quality[when] = {"nll": measured["nll"], "ece": measured["ece"], "members": logits.shape[1]}
    return {"method": method, **calibration_map.summary(), "examples": len(labels)} | quality


def _report(results: dict, calibration_map: CalibrationMap) -> None:
    before, after = results["before"], results["after"]
    fitted = ", ".join(f"{name} {value:.4f}" for name, value in calibration_map.summary().items())
    print(f"fitted {results['method']} calibration on {results['examples']} validation examples: {fitted}")
    print(
        f"  validation NLL {before['nll']:.4f} -> {after['nll']:.4f}, "
        f"ECE {100 * before['ece']:.2f} -> {100 * after['ece']:.2f} % "
        "(on the data it was fitted on: measure it on held-out data with `evaluate`)"
    )
    if not calibration_map.on_members:
        print(
            f"  {results['method']} maps the ensemble probability and returns one member (the model has "
            f"{before['members']}): mutual information and member disagreement are lost (0); a logit map "
            "(temperature, vector, dirichlet) keeps them"
        )
