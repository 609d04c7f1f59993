"""Fusion: M pruned members in one module, run in one forward pass."""

from .ensemble import HydraEnsemble, fusion_deviation
from .layer import FusedLayer

__all__ = ["FusedLayer", "HydraEnsemble", "fusion_deviation"]
