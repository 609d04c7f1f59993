"""Head importance: Taylor scores from gradients (§D.1.1) and circuits from greedy ablation (§D.1.2)."""

from .circuit import (
    CRITERIA,
    AccuracyCriterion,
    AverageCriterion,
    Circuit,
    CircuitCriterion,
    MSPAurocCriterion,
    extract_circuit,
    register_criterion,
)
from .taylor import taylor_head_scores

__all__ = [
    "CRITERIA",
    "AccuracyCriterion",
    "AverageCriterion",
    "Circuit",
    "CircuitCriterion",
    "MSPAurocCriterion",
    "extract_circuit",
    "register_criterion",
    "taylor_head_scores",
]
