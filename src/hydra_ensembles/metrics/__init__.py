"""Metrics, one per file, each with its definition in the docstring.

Classification (from ensemble probabilities): accuracy, brier, nll, ece, adaptive_ece.
OOD detection (OpenOOD convention: OOD positive, score "higher = more OOD"): auroc, fpr_at_tpr, aupr_in,
aupr_out. Model uncertainty per input (from member logits): mutual_information, disagreement.
Regression (from member Gaussians): gaussian_mixture_nll.
"""

from ..uncertainty import mutual_information
from .accuracy import accuracy
from .adaptive_ece import adaptive_ece
from .aupr import aupr_in, aupr_out, average_precision
from .auroc import auroc
from .brier import brier
from .disagreement import disagreement
from .ece import ece
from .fpr95 import fpr_at_tpr
from .gaussian_nll import gaussian_mixture_nll
from .nll import nll

__all__ = [
    "accuracy",
    "adaptive_ece",
    "aupr_in",
    "aupr_out",
    "auroc",
    "average_precision",
    "brier",
    "disagreement",
    "ece",
    "fpr_at_tpr",
    "gaussian_mixture_nll",
    "mutual_information",
    "nll",
]
