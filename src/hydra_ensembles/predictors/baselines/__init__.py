"""The paper's baselines, with the predictor contract: `model(**inputs).member_logits` is (B, M, C).

- `DeepEnsemble`: M models fine-tuned independently (different seeds), run one after another.
- `shared_backbone_ensemble`: "Deep Ensembles (D)": M classifier heads on one frozen backbone, fused.
- `MCDropout`: one model, M forward passes with dropout active.
- `batch_ensemble` (`BatchEnsemble`): M members with rank-1 fast weights around one model's weights, one pass.
- `lora_ensemble`: M LoRA fine-tunes with different seeds.
- `packed_ensemble` (`PackedEnsemble`): Packed-Ensembles, M narrow transformers trained from scratch as one fused
  module (`train_packed`).
- `mimo` (`MIMO`): M inputs mixed into one ViT with M heads, trained from scratch (`train_mimo`).
Temperature scaling (and the other calibration maps) is `predictors.Calibrated`; a pruned single model (Taylor,
CircAvg) is a plain HF model from `build_members`, an ensemble of one.
"""

from .batch_ensemble import BatchEnsemble, batch_ensemble
from .deep_ensemble import DeepEnsemble
from .heads import reset_classifier
from .lora import lora_ensemble
from .mc_dropout import MCDropout
from .mimo import MIMO, mimo, train_mimo
from .packed import PackedEnsemble, packed_ensemble, train_packed
from .shared_backbone import shared_backbone_ensemble

__all__ = [
    "MIMO",
    "BatchEnsemble",
    "DeepEnsemble",
    "MCDropout",
    "PackedEnsemble",
    "batch_ensemble",
    "lora_ensemble",
    "mimo",
    "packed_ensemble",
    "reset_classifier",
    "shared_backbone_ensemble",
    "train_mimo",
    "train_packed",
]
