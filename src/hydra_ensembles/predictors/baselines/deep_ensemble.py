"""Deep Ensembles: M models fine-tuned independently (different seeds), run one after another."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ...adapters import get_adapter
from ...io import PREDICTOR_FILE, save_dir_atomic, write_json_atomic
from ...outputs import PredictorOutput
from ...pruning import save_model


class DeepEnsemble(nn.Module):
    """Independently trained models, run one after another. `stored_parameters` (if set) overrides the
    parameter count, for ensembles that share weights on disk (LoRA)."""

    def __init__(self, models: Sequence[nn.Module], stored_parameters: int | None = None):
        super().__init__()
        if not models:
            raise ValueError("a deep ensemble needs at least one model.")
        self.models = nn.ModuleList(models)
        self.stored_parameters = stored_parameters

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """member0/, member1/, ... (HF checkpoints) and predictor.json, atomically; read back by
        `hydra_ensembles.predictors.load_predictor`."""

        def write(tmp: Path) -> None:
            for index, model in enumerate(self.models):
                save_model(model, tmp / f"member{index}")
            record = {"kind": "deep_ensemble", "members": len(self.models), "stored_parameters": self.stored_parameters}
            write_json_atomic(tmp / PREDICTOR_FILE, record)

        return save_dir_atomic(path, write)

    def forward(self, **inputs) -> PredictorOutput:
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
        return PredictorOutput(member_logits=torch.stack([get_adapter(m).output(m, inputs) for m in self.models], 1))
