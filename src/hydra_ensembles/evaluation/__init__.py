"""Evaluation: metrics (one per file), OOD scores, temperature scaling, reports in the paper's table shape.

Conventions: an ensemble's predictive distribution is the mean of its members' softmax probabilities; OOD
detection follows OpenOOD (OOD is the positive class, scores are "higher = more OOD").
"""

from .ood import OOD_SCORES
from .report import classification_metrics, collect_member_logits, evaluate, labels_of, ood_metrics
from .temperature import TemperatureScaled, fit_temperature
from .uncertainty import ensemble_probs, entropy, mutual_information

__all__ = [
    "OOD_SCORES",
    "TemperatureScaled",
    "classification_metrics",
    "collect_member_logits",
    "ensemble_probs",
    "entropy",
    "evaluate",
    "fit_temperature",
    "labels_of",
    "mutual_information",
    "ood_metrics",
]
