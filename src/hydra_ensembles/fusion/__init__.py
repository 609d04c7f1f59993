"""Fusion: M pruned members in one module, run in one forward pass."""

from .ensemble import HydraEnsemble, fusion_deviation, lay_out_for_device
from .layer import FusedLayer

__all__ = ["FusedLayer", "HydraEnsemble", "fusion_deviation", "lay_out_for_device"]
