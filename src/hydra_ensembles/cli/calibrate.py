"""Calibration: fit a post-hoc calibrator on labelled validation data and save the calibrated predictor.

--method temperature (Guo et al., 2017, "On Calibration of Modern Neural Networks"): one temperature T divides
every member's logits before their softmaxes are averaged, fitted to minimise the validation NLL; it changes the
confidence, never the predicted class. It takes any saved classifier: an HF classifier, a Hydra Ensemble, a
distilled student, a zero-shot ensemble. Prints what was fitted and the validation NLL and ECE before and after.
Writes <out>/model/ (`evaluate` and `predict` take <out> as --model). Fit on validation data, not on the test data
you report on.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from ..evaluation.report import classification_metrics
from ..outputs import collect_member_logits, labels_of
from ..predictors import (
    TemperatureScaled,
    copy_preprocessor,
    describe_saved,
    fit_temperature,
    model_config,
    save_predictor,
)
from .common import (
    add_data_options,
    add_device_argument,
    add_zero_shot_options,
    classifier_at,
    data_settings,
    read_data,
    resolve_device,
    zero_shot_options,
)
from .step import add_output_options, check_model_dir, fingerprint_path, start_step

EXAMPLE = """hydra-ens calibrate --model hydra --val val.csv --out hydra-calibrated
hydra-ens predict --model hydra-calibrated --inputs new.txt --calibration val.csv"""


@dataclass
class Calibrated:
    """What a calibrator returns: the calibrated predictor (saved), its member logits (N, M, C) on the validation
    data (measured without running the model again), and what it fitted (printed and recorded)."""

    predictor: nn.Module
    member_logits: Tensor
    fitted: dict[str, float]


def _temperature(model: nn.Module, member_logits: Tensor, labels: Tensor) -> Calibrated:
    temperature = fit_temperature(member_logits, labels)
    return Calibrated(TemperatureScaled(model, temperature), member_logits / temperature, {"temperature": temperature})


# name -> calibrator(model, validation member logits (N, M, C), labels (N,)); the next calibrators register here
METHODS: dict[str, Callable[[nn.Module, Tensor, Tensor], Calibrated]] = {"temperature": _temperature}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a saved classifier: an HF classifier or any saved ensemble")
    parser.add_argument("--val", required=True, help="labelled validation data to fit the calibrator on")
    parser.add_argument(
        "--method",
        choices=sorted(METHODS),
        default="temperature",
        help="temperature: one temperature for all members, fitted by validation NLL",
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
    model = classifier_at(model_dir, zero_shot=zero_shot_options(args)).to(device)
    val = read_data(args, args.val, model_dir, model_config(model), labelled=True, flag="--val").batches
    member_logits, labels = collect_member_logits(model, val, not args.quiet), labels_of(val)  # (N, M, C), (N,)
    calibrated = METHODS[args.method](model, member_logits, labels)
    before = classification_metrics(member_logits, labels)
    after = classification_metrics(calibrated.member_logits, labels)
    target = out.path / "model"
    save_predictor(calibrated.predictor, target)
    for where in (model_dir, model_dir / "text"):  # the tokenizer / image processor (a two-tower's: text/)
        copy_preprocessor(where, target)
    quality = {when: {k: m[k] for k in ("nll", "ece")} for when, m in (("before", before), ("after", after))}
    out.finish({"model_dir": "model", "method": args.method, **calibrated.fitted, "examples": len(labels)} | quality)
    fitted = ", ".join(f"{name} {value:.4f}" for name, value in calibrated.fitted.items())
    print(f"fitted {args.method} calibration on {len(labels)} validation examples: {fitted}")
    print(f"  validation NLL {before['nll']:.4f} -> {after['nll']:.4f}, ECE {before['ece']:.4f} -> {after['ece']:.4f}")
    print(f"wrote {target}: {describe_saved(target)}")
    return 0
