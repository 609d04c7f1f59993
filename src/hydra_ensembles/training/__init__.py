"""Training: one loop (loop.py) that takes the loss and the forward, the losses (losses.py), and the configs,
recipes, optimisers and schedules (recipes.py), and image augmentation on tensors (augment.py). Fine-tuning is the
loop with cross-entropy, on one model (`finetune`) or on a fused ensemble as one module (`finetune_fused`)."""

from .augment import AUGMENTATIONS, CropFlip
from .loop import CHECKPOINT, finetune, finetune_fused, last_hidden_states, recover, train, validate
from .losses import (
    Contrastive,
    CrossEntropy,
    DistillKL,
    FeatureMSE,
    GaussianKL,
    GaussianNLL,
    MIMOLoss,
    gaussian_kl,
)
from .recipes import AMP_RECOVERY, IMAGE_RECIPE, OPTIMIZERS, SCHEDULES, TEXT_RECIPE, TrainConfig

__all__ = [
    "AMP_RECOVERY",
    "AUGMENTATIONS",
    "CropFlip",
    "finetune_fused",
    "FeatureMSE",
    "last_hidden_states",
    "recover",
    "CHECKPOINT",
    "IMAGE_RECIPE",
    "OPTIMIZERS",
    "SCHEDULES",
    "TEXT_RECIPE",
    "Contrastive",
    "CrossEntropy",
    "DistillKL",
    "GaussianKL",
    "GaussianNLL",
    "MIMOLoss",
    "gaussian_kl",
    "TrainConfig",
    "finetune",
    "train",
    "validate",
]
