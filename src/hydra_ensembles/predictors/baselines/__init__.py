"""The paper's baselines, with the predictor contract: `model(**inputs).member_logits` is (B, M, C).

- `DeepEnsemble`: M models fine-tuned independently (different seeds), run one after another.
- `shared_backbone_ensemble`: "Deep Ensembles (D)": M classifier heads on one frozen backbone, fused.
- `MCDropout`: one model, M forward passes with dropout active.
- `lora_ensemble`: M LoRA fine-tunes with different seeds.
Temperature scaling (and the other calibration maps) is `predictors.Calibrated`; a pruned single model (Taylor,
CircAvg) is a plain HF model from `build_members`, an ensemble of one.
"""

from .deep_ensemble import DeepEnsemble
from .heads import reset_classifier
from .lora import lora_ensemble
from .mc_dropout import MCDropout
from .shared_backbone import shared_backbone_ensemble

__all__ = ["DeepEnsemble", "MCDropout", "lora_ensemble", "reset_classifier", "shared_backbone_ensemble"]
