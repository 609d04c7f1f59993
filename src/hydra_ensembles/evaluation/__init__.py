"""Evaluation: OOD scores, reports in the paper's table shape (metrics: `hydra_ensembles.metrics`), and paired
bootstrap intervals of the difference between two rows (bootstrap.py), split-conformal prediction sets
(conformal.py), shift curves: metrics under growing image or text corruption (shift.py).

Conventions: an ensemble's predictive distribution is the mean of its members' softmax probabilities; OOD
detection follows OpenOOD (OOD is the positive class, scores are "higher = more OOD").
"""

from .bootstrap import Interval, difference_lines, paired_bootstrap
from .conformal import SplitConformal
from .ood import OOD_SCORES
from .report import classification_metrics, evaluate, ood_metrics
from .shift import SHIFTS, PixelSpace, TextData, shift_curve

__all__ = [
    "OOD_SCORES",
    "SHIFTS",
    "Interval",
    "PixelSpace",
    "SplitConformal",
    "TextData",
    "classification_metrics",
    "difference_lines",
    "evaluate",
    "ood_metrics",
    "paired_bootstrap",
    "shift_curve",
]
