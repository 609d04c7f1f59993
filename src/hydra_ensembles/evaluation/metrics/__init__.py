"""Metrics, one per file, each with its definition in the docstring."""

from .accuracy import accuracy
from .auroc import auroc

__all__ = ["accuracy", "auroc"]
