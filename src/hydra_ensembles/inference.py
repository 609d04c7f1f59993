"""A predictor prepared for inference as users run it: fp32 or bf16, eager or compiled (`torch.compile`).

`prepare` is the one way `hydra-ens predict`, `hydra-ens evaluate` and benchmarks/inference.py set a model up, so
that what the benchmark times is what a user runs, and every row of it (Single too) is treated the same way.

bf16 is bfloat16 autocast around the whole forward pass, not the weights cast to bf16. On this project's CPU
(AMD EPYC with AVX512-BF16, no AMX) the two ran within each other's round-to-round spread (a random BERT of
MiniLM's shape, 64 tokens, 15 interleaved rounds on 2 cores busy with another job, so indicative only: one
model at batch 1, 25 ms under autocast, 23 ms cast, 37 ms fp32; a fused M = 3 ensemble at batch 8, 273, 260 and
530 ms). Autocast keeps layer norms, softmax and everything after the logits in fp32 / float64, so it moved the
logits half as far (0.4-0.6 % of their largest magnitude on the tiny test models, cast 1.1-1.2 %), and it runs
every predictor unchanged: inputs, calibration maps, feature detectors and float64 buffers need no cast. What
comes out is fp32 whatever ran inside (an HF head's bf16 logits cast up), so every row's logits share a dtype. The
values keep bf16's rounding (a zero-shot ensemble's scaled cosines aside, which run in fp32): max-logit and energy
scores tie more often than in fp32, so OOD metrics measured in bf16 carry those ties.

Compiled is `torch.compile(dynamic=True)` of the prepared module (in its place: the predictor itself is left
eager), so that batches of other sizes and lengths reuse one graph. Compiling takes seconds to minutes on a CPU
(a C++ toolchain is needed); it pays off over many batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .evaluation.scores import detectors_of
from .fusion import lay_out_for_device
from .outputs import member_logits_of
from .precision import warn_if_emulated_bf16
from .predictors.load import ModelWrapper

# The context each precision runs the forward pass in, by device type ("cpu", "cuda").
PRECISION_CONTEXTS: dict[str, Callable[[str], contextlib.AbstractContextManager]] = {
    "fp32": lambda device_type: contextlib.nullcontext(),
    "bf16": lambda device_type: torch.autocast(device_type, torch.bfloat16),
}


class Prepared(ModelWrapper):
    """A predictor whose forward pass runs at a precision (under its context); `compiled` says whether `prepare`
    compiled this module. Returns what the predictor returns."""

    def __init__(self, model: nn.Module, precision: str, device_type: str):
        super().__init__(model)
        self.precision, self.device_type = precision, device_type
        self.compiled = False

    @property
    def stored_parameters(self) -> int | None:
        """The wrapped predictor's, if it says how many parameters it stores (a deep ensemble of shared copies)."""
        return getattr(self.model, "stored_parameters", None)

    def context(self) -> contextlib.AbstractContextManager:
        return PRECISION_CONTEXTS[self.precision](self.device_type)

    def forward(self, **inputs: Any) -> Any:
        with self.context():
            output = self.model(**inputs)
        return _in_fp32(output)

    @torch.no_grad()  # scores, not a graph of the whole forward pass (map_batches adds it; a direct call did not)
    def ood_scores(self, inputs: Mapping[str, Any], name: str) -> tuple[Tensor, Tensor]:
        """A feature score (`evaluation.scores.collect_scores`) at this precision, eager: the fitted detectors'
        own pass (member logits (B, M, C), scores (B,)), the logits from the whole predictor when a wrapper
        between changes them."""
        scored = detectors_of(self.model, name)  # the ValueError that says how to fit detectors, if none
        with self.context():
            logits, scores = scored.ood_scores(inputs, name)
            if scored is not self.model:
                logits = member_logits_of(self.model(**inputs))
        return _in_fp32(logits), scores


def prepare(predictor: nn.Module, precision: str = "fp32", compile: bool = False) -> nn.Module:
    """The module to call for inference: `predictor` in eval mode at `precision` ("fp32" as it is, "bf16"
    under bfloat16 autocast), compiled with `torch.compile(dynamic=True)` when `compile`.

    fp32 eager returns `predictor` itself; otherwise a `Prepared` wrapper (a `Wrapper`: `base_model` and the
    class names see through it), the predictor left as it was but for a fused ensemble's attention layout, set
    for its device (`lay_out_for_device`: the same outputs). Move the predictor to its device first. Warns
    when bf16 runs on a CPU without bf16 matrix instructions, where it is slower than fp32.
    """
    if precision not in PRECISION_CONTEXTS:
        raise ValueError(f"precision must be one of {sorted(PRECISION_CONTEXTS)}, got {precision!r}.")
    lay_out_for_device(predictor).eval()
    if precision == "fp32" and not compile:
        return predictor
    device_type = next(predictor.parameters()).device.type
    warn_if_emulated_bf16(precision, device_type, "inference")
    prepared = Prepared(predictor, precision, device_type).eval()
    if compile:
        prepared.compile(dynamic=True)
        prepared.compiled = True
    return prepared


def describe(predictor: nn.Module) -> str:
    """How a prepared predictor runs, for a command's output: "fp32, eager", "bf16, compiled"."""
    if not isinstance(predictor, Prepared):
        return "fp32, eager"
    return f"{predictor.precision}, {'compiled' if predictor.compiled else 'eager'}"


def _in_fp32(output: Any) -> Any:
    """`output` with its low-precision floating tensors in float32: an HF classifier's head under autocast returns
    bf16 logits, so every predictor hands back one dtype whatever ran inside (the values keep their bf16 rounding
    and its ties). A tensor, a mapping (HF outputs) or a dataclass (`PredictorOutput`) of tensors; anything else as
    it is."""
    if isinstance(output, Tensor):
        return output.float() if output.is_floating_point() and output.dtype != torch.float64 else output
    if isinstance(output, Mapping):
        for key, value in list(output.items()):
            output[key] = _in_fp32(value)
        return output
    if dataclasses.is_dataclass(output):
        for field in dataclasses.fields(output):
            setattr(output, field.name, _in_fp32(getattr(output, field.name)))
    return output
