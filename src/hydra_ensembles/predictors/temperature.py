"""Temperature scaling (Guo et al., 2017), for a single model or on top of any ensemble."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from ..io import PREDICTOR_FILE, save_dir_atomic, write_json_atomic
from ..outputs import PredictorOutput, member_logits_of
from ..uncertainty import ensemble_probs
from .load import Wrapper, describe_saved, load_predictor, num_members, register_predictor, save_predictor


def fit_temperature(member_logits: Tensor, labels: Tensor, max_iter: int = 100) -> float:
    """The T > 0 minimising the NLL of mean_m softmax(z_m / T) on held-out data, by L-BFGS on log T.

    One temperature for all members, applied before their probabilities are averaged, so it also calibrates a
    Hydra Ensemble. Shape: member_logits (N, M, C), labels (N,). Returns T (T > 1 softens, T < 1 sharpens).
    """
    if len(labels) == 0:
        raise ValueError("temperature scaling needs held-out examples; got none.")
    logits, labels = member_logits.detach().double(), labels.long()
    if (logits.argmax(dim=-1) == labels[:, None]).all():
        # every member ranks the true class first everywhere: the NLL falls as T -> 0 and has no minimum
        warnings.warn(
            f"every member classifies all {len(labels)} held-out examples correctly, so their NLL has no minimum "
            "in T: the fitted temperature is only where the optimiser stopped, and sharpens without limit. "
            "Fit it on a larger or harder held-out set.",
            stacklevel=2,
        )
    log_t = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.1, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimizer.zero_grad()
        probs = ensemble_probs(logits / log_t.exp())
        loss = -torch.log(probs.gather(1, labels[:, None]).clamp_min(1e-300)).mean()
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(log_t.detach().exp())


@register_predictor
class TemperatureScaled(Wrapper):
    """Any predictor with its member logits divided by a fitted temperature. Returns member_logits (B, M, C)."""

    kind = "temperature"

    def __init__(self, model: nn.Module, temperature: float):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}.")
        self.model = model
        self.temperature = temperature

    @property
    def base(self) -> nn.Module:
        return self.model

    @property
    def num_members(self) -> int:
        return num_members(self.model)

    def forward(self, **inputs) -> PredictorOutput:
        return PredictorOutput(member_logits=member_logits_of(self.model(**inputs)) / self.temperature)

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """model/ (the predictor it scales) and predictor.json (kind, temperature), atomically."""

        def write(tmp: Path) -> None:
            save_predictor(self.model, tmp / "model")
            write_json_atomic(tmp / PREDICTOR_FILE, {"kind": self.kind, "temperature": self.temperature})

        return save_dir_atomic(path, write)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> TemperatureScaled:
        record = json.loads((Path(path) / PREDICTOR_FILE).read_text())
        return cls(load_predictor(Path(path) / "model"), record["temperature"]).eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        return f"{describe_saved(path / 'model')}, temperature-scaled"
