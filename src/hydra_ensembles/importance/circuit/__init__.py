"""Circuits: greedy extraction of the heads a validation score needs (paper 000, §D.1.2, Algorithm 1).

criteria.py  the score S to keep high (acc, ood, avg; a registry)
search.py    the greedy loop, its search methods (fast, reference, lazy, screen; a registry), `Circuit`
scoring.py   candidate scorers: the literal reference and the prefix-cached, candidate-batched fast one
joint.py     joint circuits over both towers of a two-tower model, scored zero-shot (§D.3), `JointCircuit`
"""

from .criteria import (
    CRITERIA,
    AccuracyCriterion,
    AverageCriterion,
    CircuitCriterion,
    MSPAurocCriterion,
    register_criterion,
)
from .joint import JointCircuit, extract_joint_circuit
from .search import METHODS, Circuit, SearchMethod, extract_circuit

__all__ = [
    "CRITERIA",
    "METHODS",
    "AccuracyCriterion",
    "AverageCriterion",
    "Circuit",
    "CircuitCriterion",
    "JointCircuit",
    "MSPAurocCriterion",
    "SearchMethod",
    "extract_circuit",
    "extract_joint_circuit",
    "register_criterion",
]
