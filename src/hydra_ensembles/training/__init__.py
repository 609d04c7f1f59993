"""Training: one loop (loop.py) that takes the loss and the forward, the losses (losses.py), and the configs,
recipes, optimisers and schedules (recipes.py). Fine-tuning is the loop with cross-entropy."""

from .loop import CHECKPOINT, finetune, train, validate
from .losses import CrossEntropy, TeacherKL
from .recipes import IMAGE_RECIPE, OPTIMIZERS, SCHEDULES, TEXT_RECIPE, TrainConfig

__all__ = [
    "CHECKPOINT",
    "IMAGE_RECIPE",
    "OPTIMIZERS",
    "SCHEDULES",
    "TEXT_RECIPE",
    "CrossEntropy",
    "TeacherKL",
    "TrainConfig",
    "finetune",
    "train",
    "validate",
]
