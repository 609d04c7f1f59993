"""Predictors: everything that returns member logits (B, M, C) (the contract in `hydra_ensembles.outputs`).

The Hydra Ensemble itself is built by `hydra_ensembles.fusion`; here are the baselines it is compared with
(`baselines/`), post-hoc calibration on top of any predictor (`calibration.py`: temperature, vector, Dirichlet,
histogram and isotonic maps), zero-shot two-tower (CLIP-style) ensembles (`clip_zero_shot.py`), one saver and
loader for every kind (`load.py`: each kind saves and loads itself and is found by name), and a saved predictor
put to work as a classifier (`classifier.py`).
"""

from .baselines import (
    MIMO,
    BatchEnsemble,
    DeepEnsemble,
    MCDropout,
    PackedEnsemble,
    batch_ensemble,
    lora_ensemble,
    mimo,
    packed_ensemble,
    reset_classifier,
    shared_backbone_ensemble,
    train_mimo,
    train_packed,
)
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
    ModelWrapper,
    check_supported,
    describe_saved,
    load_predictor,
    num_members,
    register_predictor,
    save_predictor,
    saved_kind,
)
from .wrapper import Wrapper, base_model, wrapper_chain

__all__ = [
    "CALIBRATION_MAPS",
    "MIMO",
    "PREDICTOR_KINDS",
    "BatchEnsemble",
    "Calibrated",
    "CalibrationMap",
    "DeepEnsemble",
    "DirichletScaling",
    "FeatureScored",
    "HistogramBinning",
    "IsotonicCalibration",
    "MCDropout",
    "ModelWrapper",
    "PackedEnsemble",
    "TemperatureScaling",
    "Tower",
    "TwoTowerModel",
    "VectorScaling",
    "Wrapper",
    "ZeroShotEnsemble",
    "base_model",
    "batch_ensemble",
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
    "mimo",
    "model_config",
    "num_members",
    "packed_ensemble",
    "register_predictor",
    "reset_classifier",
    "save_predictor",
    "saved_kind",
    "shared_backbone_ensemble",
    "train_mimo",
    "train_packed",
    "wrapper_chain",
    "zero_shot_ensemble",
]
