"""Surgery: structural changes of HF models that stay normal HF models.

heads.py   remove attention heads (and ablate them reversibly, for scoring)
neurons.py remove MLP hidden neurons (and ablate them), paper 002
weights.py zero single weights and hold them at zero while training (unstructured: no shape changes)
persist.py save and load a changed model: every structural change recorded in config.json and replayed
"""

from .heads import (
    KEPT_HEADS_KEY,
    HeadMap,
    ablate_heads,
    check_heads,
    head_counts,
    keep_heads,
    kept_heads,
    per_layer,
    prune_heads,
)
from .neurons import KEPT_NEURONS_KEY, NeuronMap, ablate_neurons, keep_neurons, kept_neurons, prune_neurons
from .persist import base_fingerprint, load_model, register_structure, save_model
from .weights import WeightMask, kept_fraction, linear_parameters, mask_weights, zero_weights

__all__ = [
    "WeightMask",
    "kept_fraction",
    "linear_parameters",
    "mask_weights",
    "zero_weights",
    "KEPT_NEURONS_KEY",
    "NeuronMap",
    "ablate_neurons",
    "keep_neurons",
    "kept_neurons",
    "prune_neurons",
    "KEPT_HEADS_KEY",
    "HeadMap",
    "ablate_heads",
    "base_fingerprint",
    "check_heads",
    "head_counts",
    "keep_heads",
    "kept_heads",
    "load_model",
    "per_layer",
    "prune_heads",
    "register_structure",
    "save_model",
]
