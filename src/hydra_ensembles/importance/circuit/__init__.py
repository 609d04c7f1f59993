"""Circuits: greedy extraction of the heads a validation score needs (paper 000, §D.1.2, Algorithm 1).

criteria.py  the score S to keep high (acc, ood, avg; a registry), its secondary score, the tie rules
record.py    what an extraction leaves: removal order, S, ties and their rule; JSON (`Circuit`'s, `JointCircuit`'s)
scoring.py   candidate scorers: the literal reference and the prefix-cached, candidate-batched fast one
methods.py   the search methods (fast, reference, lazy, screen, multi; a registry); `Choice`: one, its top, precision
budget.py    what a search costs (a timed probe), which fits a time budget ("auto"), the clock during it; subsamples
search.py    the greedy loop, method "auto", `Circuit`
joint.py     joint circuits over both towers of a two-tower model, scored zero-shot (§D.3), `JointCircuit`
agreement.py how far two removal orders agree (against chance), and disjoint halves of the data to extract them on

Imports run one way, down this list's layers: (agreement | joint) -> search -> budget -> methods ->
(record | scoring) -> criteria
(an import-linter contract in pyproject.toml keeps it so).
"""

from .agreement import chance_agreement, chance_p_value, removal_agreement, split_halves
from .criteria import (
    CRITERIA,
    TIE_BREAKS,
    AccuracyCriterion,
    AverageCriterion,
    CircuitCriterion,
    MSPAurocCriterion,
    register_criterion,
)
from .joint import JointCircuit, extract_joint_circuit
from .methods import METHODS, Choice, SearchMethod, search_name
from .search import Circuit, extract_circuit

__all__ = [
    "CRITERIA",
    "METHODS",
    "TIE_BREAKS",
    "AccuracyCriterion",
    "AverageCriterion",
    "Choice",
    "Circuit",
    "CircuitCriterion",
    "JointCircuit",
    "MSPAurocCriterion",
    "SearchMethod",
    "chance_agreement",
    "chance_p_value",
    "extract_circuit",
    "extract_joint_circuit",
    "register_criterion",
    "removal_agreement",
    "search_name",
    "split_halves",
]
