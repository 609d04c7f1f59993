"""Evaluation: OOD scores, reports in the paper's table shape (metrics: `hydra_ensembles.metrics`).

Conventions: an ensemble's predictive distribution is the mean of its members' softmax probabilities; OOD
detection follows OpenOOD (OOD is the positive class, scores are "higher = more OOD").
"""

from .ood import OOD_SCORES
from .report import classification_metrics, evaluate, ood_metrics

__all__ = [
    "OOD_SCORES",
    "classification_metrics",
    "evaluate",
    "ood_metrics",
]
