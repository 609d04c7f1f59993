"""Importance: head Taylor scores (paper 000 §D.1.1), circuits from greedy ablation (§D.1.2), and MLP neuron
scores with the adaptive per-block search of their hidden size (paper 002, neurons.py), and single-weight scores
from the exact Hessian-vector product for the unstructured pruning baseline OBA (oba.py)."""

from .circuit import (
    CRITERIA,
    AccuracyCriterion,
    AverageCriterion,
    Circuit,
    CircuitCriterion,
    JointCircuit,
    MSPAurocCriterion,
    extract_circuit,
    extract_joint_circuit,
    register_criterion,
)
from .losses import TaylorLoss, register_taylor_loss
from .neurons import (
    AdaptivePruning,
    adaptive_mlp_pruning,
    binary_search_size,
    magnitude_neuron_scores,
    neuron_scores,
    prune_to_sizes,
    random_neuron_scores,
    uniform_sizes,
)
from .oba import oba_prune, oba_ranking, oba_scores
from .taylor import taylor_head_scores

__all__ = [
    "AdaptivePruning",
    "adaptive_mlp_pruning",
    "binary_search_size",
    "magnitude_neuron_scores",
    "neuron_scores",
    "oba_prune",
    "oba_ranking",
    "oba_scores",
    "prune_to_sizes",
    "random_neuron_scores",
    "uniform_sizes",
    "CRITERIA",
    "AccuracyCriterion",
    "AverageCriterion",
    "Circuit",
    "CircuitCriterion",
    "JointCircuit",
    "MSPAurocCriterion",
    "extract_circuit",
    "extract_joint_circuit",
    "register_criterion",
    "register_taylor_loss",
    "taylor_head_scores",
    "TaylorLoss",
]
