"""MC dropout (Gal & Ghahramani, 2016): one model, M forward passes with its dropout switched on."""

from __future__ import annotations

import torch
from torch import nn

from ...adapters import get_adapter
from ...outputs import PredictorOutput


class MCDropout(nn.Module):
    """One model, `samples` stochastic passes with its dropout (hidden and attention) switched on.

    The dropout masks come from `seed` and a call counter, so a sequence of calls is reproducible.
    """

    def __init__(self, model: nn.Module, samples: int = 10, seed: int = 0):
        super().__init__()
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}.")
        if not any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
            raise ValueError(f"{type(model).__name__} has no dropout with p > 0: MC dropout would return copies.")
        self.model, self.samples, self.seed, self.calls = model, samples, seed, 0

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
