"""MC dropout (Gal & Ghahramani, 2016): one model, M forward passes with its dropout switched on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from ...adapters import get_adapter
from ...io import PREDICTOR_FILE
from ...outputs import PredictorOutput
from ...seeding import seeded
from ..load import ModelWrapper, describe_saved, register_predictor


@register_predictor
class MCDropout(ModelWrapper):
    """One model, `samples` stochastic passes with its dropout (hidden and attention) switched on.

    The dropout masks come from `seed` and a call counter, so a sequence of calls is reproducible; an input's
    masks depend on the batch it comes in and on the calls before (saving with a model card, which counts FLOPs,
    is a call).
    """

    kind = "mc_dropout"

    def __init__(self, model: nn.Module, samples: int = 10, seed: int = 0):
        super().__init__(model)
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}.")
        if not any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
            raise ValueError(f"{type(model).__name__} has no dropout with p > 0: MC dropout would return copies.")
        self.samples, self.seed, self.calls = samples, seed, 0

    @property
    def num_members(self) -> int:
        return self.samples

    def forward(self, **inputs) -> PredictorOutput:
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
        adapter = get_adapter(self.model)
        was_training = self.model.training
        with seeded(self.seed * 1_000_003 + self.calls, next(self.model.parameters()).device):
            self.calls += 1
            self.model.train()  # dropout on; no batch norm in these transformers, layer norm is unaffected
            try:
                logits = [adapter.output(self.model, inputs) for _ in range(self.samples)]
            finally:
                self.model.train(was_training)
        return PredictorOutput(member_logits=torch.stack(logits, 1))

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """model/ (the model) and predictor.json (kind, samples, seed), atomically; a loaded copy starts its call
        counter again."""
        return self.save_wrapped(path, {"samples": self.samples, "seed": self.seed})

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> MCDropout:
        model, record = cls.load_wrapped(path)
        return cls(model, record["samples"], record["seed"]).eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        samples = json.loads((path / PREDICTOR_FILE).read_text())["samples"]
        return f"MC dropout ({samples} samples) of {describe_saved(path / 'model')}"
