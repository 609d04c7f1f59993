"""MC dropout (Gal & Ghahramani, 2016): one model, M forward passes with its dropout switched on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from ...adapters import get_adapter
from ...io import PREDICTOR_FILE, save_dir_atomic, write_json_atomic
from ...outputs import PredictorOutput
from ..load import Wrapper, describe_saved, load_predictor, register_predictor, save_predictor


@register_predictor
class MCDropout(Wrapper):
    """One model, `samples` stochastic passes with its dropout (hidden and attention) switched on.

    The dropout masks come from `seed` and a call counter, so a sequence of calls is reproducible.
    """

    kind = "mc_dropout"

    def __init__(self, model: nn.Module, samples: int = 10, seed: int = 0):
        super().__init__()
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}.")
        if not any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
            raise ValueError(f"{type(model).__name__} has no dropout with p > 0: MC dropout would return copies.")
        self.model, self.samples, self.seed, self.calls = model, samples, seed, 0

    @property
    def base(self) -> nn.Module:
        return self.model

    @property
    def num_members(self) -> int:
        return self.samples

    def forward(self, **inputs) -> PredictorOutput:
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
        adapter = get_adapter(self.model)
        was_training = self.model.training
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 1_000_003 + self.calls)
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

        def write(tmp: Path) -> None:
            save_predictor(self.model, tmp / "model")
            record = {"kind": self.kind, "samples": self.samples, "seed": self.seed}
            write_json_atomic(tmp / PREDICTOR_FILE, record)

        return save_dir_atomic(path, write)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> MCDropout:
        record = json.loads((Path(path) / PREDICTOR_FILE).read_text())
        return cls(load_predictor(Path(path) / "model"), record["samples"], record["seed"]).eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        samples = json.loads((path / PREDICTOR_FILE).read_text())["samples"]
        return f"MC dropout ({samples} samples) of {describe_saved(path / 'model')}"
