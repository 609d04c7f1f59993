"""Evaluation: OOD scores, temperature scaling, reports in the paper's table shape (metrics: `hydra_ensembles.metrics`).

Conventions: an ensemble's predictive distribution is the mean of its members' softmax probabilities; OOD
detection follows OpenOOD (OOD is the positive class, scores are "higher = more OOD").
"""

from .ood import OOD_SCORES
from .report import classification_metrics, evaluate, ood_metrics
from .temperature import TemperatureScaled, fit_temperature

__all__ = [
    "OOD_SCORES",
    "TemperatureScaled",
    "classification_metrics",
    "evaluate",
    "fit_temperature",
    "ood_metrics",
]
