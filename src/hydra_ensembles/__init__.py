"""hydra-ensembles: uncertainty-aware ensembles of pruned attention heads at close to single-model cost.

import hydra_ensembles as he
scores = he.taylor_head_scores(model, calibration_loader)          # (L, H) head importance
head_maps = he.sample_members(scores, num_members=3, budget=4)     # 3 diverse members
ensemble = he.HydraEnsemble.fuse(he.build_members(model, head_maps))
out = ensemble(**batch)                                            # out.member_logits: (B, M, C)
"""

__version__ = "0.1.0"

from .adapters import Adapter, UnsupportedModelError, get_adapter, register_adapter, supported_models
from .cost import Cost, cost_table, count_flops, count_parameters, format_cost_table
from .evaluation import ensemble_probs, mutual_information
from .fusion import HydraEnsemble, HydraOutput, fusion_deviation
from .importance import Circuit, CircuitCriterion, extract_circuit, register_criterion, taylor_head_scores
from .members import build_members, sample_members
from .pruning import HeadMap, ablate_heads, keep_heads, kept_heads, load_model, prune_heads, save_model

__all__ = [
    "Adapter",
    "Circuit",
    "CircuitCriterion",
    "Cost",
    "HeadMap",
    "HydraEnsemble",
    "HydraOutput",
    "UnsupportedModelError",
    "ablate_heads",
    "build_members",
    "cost_table",
    "count_flops",
    "count_parameters",
    "ensemble_probs",
    "extract_circuit",
    "format_cost_table",
    "fusion_deviation",
    "get_adapter",
    "keep_heads",
    "kept_heads",
    "load_model",
    "mutual_information",
    "prune_heads",
    "register_adapter",
    "register_criterion",
    "sample_members",
    "save_model",
    "supported_models",
    "taylor_head_scores",
]
