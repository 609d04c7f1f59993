"""Deep Ensembles: M models fine-tuned independently (different seeds), run one after another."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ...adapters import class_mismatch, get_adapter
from ...io import PREDICTOR_FILE, save_dir_atomic, write_json_atomic
from ...outputs import PredictorOutput
from ...pruning import load_model, save_model
from ..load import register_predictor, saved_record
from ..wrapper import Wrapper


@register_predictor
class DeepEnsemble(Wrapper):
    """Independently trained models, run one after another. `stored_parameters` (if set) overrides the
    parameter count, for ensembles that share weights on disk (LoRA)."""

    kind = "deep_ensemble"

    def __init__(self, models: Sequence[nn.Module], stored_parameters: int | None = None):
        super().__init__()
        if not models:
            raise ValueError("a deep ensemble needs at least one model.")
        if mismatch := class_mismatch(models):
            raise ValueError(
                f"the members predict different classes ({mismatch}): fine-tune every member on the same classes, "
                "in the same order."
            )
        self.models = nn.ModuleList(models)
        self.stored_parameters = stored_parameters

    @property
    def base(self) -> nn.Module:
        """The first member: every member names the same classes."""
        return self.models[0]

    @property
    def title(self) -> str:
        """The model card's title (`card.py` formats it): LoRA members share their base's weights on disk."""
        if self.stored_parameters is not None:
            return "A LoRA ensemble of {members} {model} models (adapters merged), run one after another"
        return "A deep ensemble of {members} {model} models, run one after another"

    @property
    def num_members(self) -> int:
        return len(self.models)

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """member0/, member1/, ... (HF checkpoints) and predictor.json, atomically; read back by
        `hydra_ensembles.predictors.load_predictor`."""

        def write(tmp: Path) -> None:
            for index, model in enumerate(self.models):
                save_model(model, tmp / f"member{index}")
            record = {"kind": self.kind, "members": len(self.models), "stored_parameters": self.stored_parameters}
            write_json_atomic(tmp / PREDICTOR_FILE, record)

        return save_dir_atomic(path, write)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> DeepEnsemble:
        path = Path(path)
        record = saved_record(path, cls)
        models = [load_model(path / f"member{i}") for i in range(record["members"])]
        return cls(models, record.get("stored_parameters")).eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        return f"a deep ensemble of {json.loads((path / PREDICTOR_FILE).read_text())['members']} models"

    def forward(self, **inputs) -> PredictorOutput:
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
        return PredictorOutput(member_logits=torch.stack([get_adapter(m).output(m, inputs) for m in self.models], 1))
