"""Predictors: everything that returns member logits (B, M, C) (the contract in `hydra_ensembles.outputs`).

The Hydra Ensemble itself is built by `hydra_ensembles.fusion`; here are the baselines it is compared with
(`baselines/`), temperature scaling on top of any predictor, zero-shot two-tower (CLIP-style) ensembles
(`clip_zero_shot.py`), and one saver and loader for every kind.
"""

from .baselines import DeepEnsemble, MCDropout, lora_ensemble, reset_classifier, shared_backbone_ensemble
from .clip_zero_shot import Tower, TwoTowerModel, ZeroShotEnsemble, class_prompts, zero_shot_ensemble
from .load import load_predictor, save_predictor
from .temperature import TemperatureScaled, fit_temperature

__all__ = [
    "DeepEnsemble",
    "MCDropout",
    "TemperatureScaled",
    "Tower",
    "TwoTowerModel",
    "ZeroShotEnsemble",
    "class_prompts",
    "zero_shot_ensemble",
    "fit_temperature",
    "load_predictor",
    "lora_ensemble",
    "reset_classifier",
    "save_predictor",
    "shared_backbone_ensemble",
]
