"""hydra-ensembles: uncertainty-aware ensembles of pruned attention heads at close to single-model cost.

import hydra_ensembles as he
scores = he.taylor_head_scores(model, calibration_loader)          # (L, H) head importance
head_maps = he.sample_members(scores, num_members=3, budget=4)     # 3 diverse members
ensemble = he.HydraEnsemble.fuse(he.build_members(model, head_maps))
out = ensemble(**batch)                                            # out.member_logits: (B, M, C)
"""

from .adapters import Adapter, UnsupportedModelError, get_adapter, register_adapter, supported_models
from .cost import Cost, cost_table, count_flops, count_parameters, format_cost_table
from .fusion import HydraEnsemble, fusion_deviation
from .importance import (
    Circuit,
    CircuitCriterion,
    adaptive_mlp_pruning,
    extract_circuit,
    neuron_scores,
    register_criterion,
    taylor_head_scores,
)
from .members import build_members, sample_members
from .outputs import PredictorOutput, collect_member_logits, labels_of
from .pruning import (
    HeadMap,
    ablate_heads,
    ablate_neurons,
    keep_heads,
    kept_heads,
    kept_neurons,
    load_model,
    prune_heads,
    prune_neurons,
    save_model,
)
from .uncertainty import ensemble_probs, mutual_information
from .version import __version__

__all__ = [
    "__version__",
    "Adapter",
    "Circuit",
    "CircuitCriterion",
    "Cost",
    "HeadMap",
    "HydraEnsemble",
    "PredictorOutput",
    "UnsupportedModelError",
    "ablate_heads",
    "ablate_neurons",
    "adaptive_mlp_pruning",
    "build_members",
    "collect_member_logits",
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
    "kept_neurons",
    "labels_of",
    "load_model",
    "mutual_information",
    "neuron_scores",
    "prune_heads",
    "prune_neurons",
    "register_adapter",
    "register_criterion",
    "sample_members",
    "save_model",
    "supported_models",
    "taylor_head_scores",
]
