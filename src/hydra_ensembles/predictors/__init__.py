"""Predictors: everything that returns member logits (B, M, C) (the contract in `hydra_ensembles.outputs`).

The Hydra Ensemble itself is built by `hydra_ensembles.fusion`; here are the baselines it is compared with
(`baselines/`), post-hoc calibration on top of any predictor (`calibration.py`: temperature, vector, Dirichlet,
histogram and isotonic maps), zero-shot two-tower (CLIP-style) ensembles (`clip_zero_shot.py`), one saver and
loader for every kind (`load.py`: each kind saves and loads itself and is found by name), and a saved predictor
put to work as a classifier (`classifier.py`).
"""

from .baselines import DeepEnsemble, MCDropout, lora_ensemble, reset_classifier, shared_backbone_ensemble
from .calibration import (
    CALIBRATION_MAPS,
    Calibrated,
    CalibrationMap,
    DirichletScaling,
    HistogramBinning,
    IsotonicCalibration,
    TemperatureScaling,
    VectorScaling,
    calibrate,
    fit_calibration,
    fit_temperature,
)
from .classifier import class_names, copy_preprocessor, load_classifier, load_preprocessor, model_config
from .clip_zero_shot import Tower, TwoTowerModel, ZeroShotEnsemble, class_prompts, zero_shot_ensemble
from .feature_scored import FeatureScored, fit_feature_scores
from .load import (
    PREDICTOR_KINDS,
    base_model,
    check_supported,
    describe_saved,
    load_predictor,
    num_members,
    register_predictor,
    save_predictor,
    saved_kind,
)

__all__ = [
    "CALIBRATION_MAPS",
    "PREDICTOR_KINDS",
    "Calibrated",
    "CalibrationMap",
    "DeepEnsemble",
    "DirichletScaling",
    "FeatureScored",
    "HistogramBinning",
    "IsotonicCalibration",
    "MCDropout",
    "TemperatureScaling",
    "Tower",
    "TwoTowerModel",
    "VectorScaling",
    "ZeroShotEnsemble",
    "base_model",
    "calibrate",
    "check_supported",
    "class_names",
    "class_prompts",
    "copy_preprocessor",
    "describe_saved",
    "fit_calibration",
    "fit_feature_scores",
    "fit_temperature",
    "load_classifier",
    "load_predictor",
    "load_preprocessor",
    "lora_ensemble",
    "model_config",
    "num_members",
    "register_predictor",
    "reset_classifier",
    "save_predictor",
    "saved_kind",
    "shared_backbone_ensemble",
    "zero_shot_ensemble",
]
