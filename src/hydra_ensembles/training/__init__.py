"""Training: one loop (loop.py) that takes the loss and the forward, the losses (losses.py), and the configs,
recipes, optimisers and schedules (recipes.py). Fine-tuning is the loop with cross-entropy."""

from .loop import CHECKPOINT, finetune, last_hidden_states, recover, train, validate
from .losses import Contrastive, CrossEntropy, DistillKL, FeatureMSE, GaussianKL, GaussianNLL, gaussian_kl
from .recipes import AMP_RECOVERY, IMAGE_RECIPE, OPTIMIZERS, SCHEDULES, TEXT_RECIPE, TrainConfig

__all__ = [
    "AMP_RECOVERY",
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
    "gaussian_kl",
    "TrainConfig",
    "finetune",
    "train",
    "validate",
]
