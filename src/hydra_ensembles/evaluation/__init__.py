"""Evaluation: uncertainty of ensemble predictions and the metrics they are scored with."""

from .uncertainty import ensemble_probs, entropy, mutual_information

__all__ = ["ensemble_probs", "entropy", "mutual_information"]
