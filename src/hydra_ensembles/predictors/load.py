"""One loader for every saved predictor, one saver for every predictor.

What a directory holds tells its kind:
    hydra_config.json          a Hydra Ensemble (`HydraEnsemble.save_pretrained`)
    predictor.json             a wrapper: {"kind": "deep_ensemble" | "mc_dropout" | "temperature", ...} with its
                               models in sub-directories (`member0/`, ... or `model/`); a distillation student
                               for tabular data, {"kind": "multi_head_mlp"} with model.safetensors; or a
                               zero-shot two-tower ensemble, {"kind": "zero_shot"} with `image/` and `text/`
    config.json                a Hugging Face model, pruned or not (`save_model`; its structure is replayed)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from torch import nn

from ..distill import MultiHeadMLP
from ..distill.students import KIND as MLP_KIND
from ..fusion import HydraEnsemble
from ..fusion.ensemble import CONFIG_NAME as HYDRA_CONFIG
from ..io import PREDICTOR_FILE, save_dir_atomic, write_json_atomic
from ..pruning import load_model, save_model
from .baselines.deep_ensemble import DeepEnsemble
from .baselines.mc_dropout import MCDropout
from .clip_zero_shot import KIND as ZERO_SHOT_KIND
from .clip_zero_shot import ZeroShotEnsemble
from .temperature import TemperatureScaled


def save_predictor(model: nn.Module, path: str | os.PathLike) -> Path:
    """Save any predictor atomically so that `load_predictor(path)` returns an equal one."""
    if isinstance(model, HydraEnsemble | DeepEnsemble | MultiHeadMLP | ZeroShotEnsemble):
        return model.save_pretrained(path)
    if isinstance(model, TemperatureScaled | MCDropout):
        record = (
            {"kind": "temperature", "temperature": model.temperature}
            if isinstance(model, TemperatureScaled)
            else {"kind": "mc_dropout", "samples": model.samples, "seed": model.seed}
        )

        def write(tmp: Path) -> None:
            save_predictor(model.model, tmp / "model")
            write_json_atomic(tmp / PREDICTOR_FILE, record)

        return save_dir_atomic(path, write)
    return save_model(model, path)


def load_predictor(path: str | os.PathLike) -> nn.Module:
    """The predictor saved at `path` (any kind above), in eval mode."""
    path = Path(path)
    if (path / HYDRA_CONFIG).is_file():
        return HydraEnsemble.from_pretrained(path)
    if (path / PREDICTOR_FILE).is_file():
        record = json.loads((path / PREDICTOR_FILE).read_text())
        kind = record.get("kind")
        if kind == "deep_ensemble":
            models = [load_model(path / f"member{i}") for i in range(record["members"])]
            return DeepEnsemble(models, record.get("stored_parameters")).eval()
        if kind == MLP_KIND:
            return MultiHeadMLP.from_pretrained(path)
        if kind == ZERO_SHOT_KIND:
            return ZeroShotEnsemble.from_pretrained(path)
        if kind == "temperature":
            return TemperatureScaled(load_predictor(path / "model"), record["temperature"]).eval()
        if kind == "mc_dropout":
            return MCDropout(load_predictor(path / "model"), record["samples"], record["seed"]).eval()
        raise ValueError(f"{str(path)!r} holds a predictor of unknown kind {kind!r} ({PREDICTOR_FILE}).")
    if (path / "config.json").is_file():
        return load_model(path)
    raise FileNotFoundError(
        f"{str(path)!r} holds no saved predictor: expected {HYDRA_CONFIG}, {PREDICTOR_FILE} or config.json."
    )
