"""Metrics, one per file, each with its definition in the docstring.

Classification (from ensemble probabilities): accuracy, brier, nll, ece, adaptive_ece.
OOD detection (OpenOOD convention: OOD positive, score "higher = more OOD"): auroc, fpr_at_tpr, aupr_in,
aupr_out. Model uncertainty per input (from member logits): mutual_information, disagreement.
Selective classification (confidence max_c p_c, a failure = an accepted wrong prediction): aurc, augrc,
risk_at_coverage, coverage_at_risk.
Regression (from member Gaussians): gaussian_mixture_nll.
"""

from ..uncertainty import mutual_information
from .accuracy import accuracy
from .adaptive_ece import adaptive_ece
from .augrc import augrc
from .aupr import aupr_in, aupr_out, average_precision
from .aurc import aurc
from .auroc import auroc
from .brier import brier
from .coverage_at_risk import coverage_at_risk
from .disagreement import disagreement
from .ece import ece
from .fpr95 import fpr_at_tpr
from .gaussian_nll import gaussian_mixture_nll
from .nll import nll
from .risk_at_coverage import risk_at_coverage

__all__ = [
    "accuracy",
    "adaptive_ece",
    "aupr_in",
    "aupr_out",
    "augrc",
    "auroc",
    "aurc",
    "average_precision",
    "brier",
    "coverage_at_risk",
    "disagreement",
    "ece",
    "fpr_at_tpr",
    "gaussian_mixture_nll",
    "mutual_information",
    "nll",
    "risk_at_coverage",
]
