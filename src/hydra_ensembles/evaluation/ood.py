"""OOD scores for single models and ensembles, all "higher = more OOD" (OpenOOD's convention).

Each takes member logits (B, M, C) (M = 1 for a single model) and returns (B,) in float64: in float32, nearby
scores round to ties that change AUPR and FPR95. Probability-based scores use the ensemble's predictive
distribution p = mean_m softmax(z_m); logit-based scores use the mean member logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..metrics.disagreement import disagreement
from ..uncertainty import decompose, ensemble_probs, entropy, mutual_information, off_top_mass


def msp(member_logits: Tensor) -> Tensor:
    """The ensemble's maximum softmax probability as an OOD score, 1 - max_c p_c (Hendrycks & Gimpel, 2017; the
    paper's), without rounding very confident inputs to ties (`off_top_mass`; a sharp temperature does it)."""
    return off_top_mass(ensemble_probs(member_logits.double()))


def max_logit(member_logits: Tensor) -> Tensor:
    """Negated maximum of the mean logits: -max_c mean_m z_mc (Hendrycks et al., 2022)."""
    return -member_logits.double().mean(dim=1).amax(dim=-1)


def energy(member_logits: Tensor) -> Tensor:
    """Energy of the mean logits, -logsumexp_c mean_m z_mc (Liu et al., 2020); higher energy = more OOD."""
    return -torch.logsumexp(member_logits.double().mean(dim=1), dim=-1)


def gen(member_logits: Tensor, gamma: float = 0.1, top: int = 100) -> Tensor:
    """Generalised entropy of the ensemble's predictive distribution over its `top` largest probabilities,
    sum_{j <= top} p_(j)^gamma (1 - p_(j))^gamma (Liu et al., 2023, GEN; OpenOOD's gamma 0.1 and M = 100, or all
    C classes when fewer); higher = flatter = more OOD. 1 - max_c p_c is summed from the other classes (`off_top_mass`):
    subtracted from 1 it rounds to 0 for confident inputs, whose score then loses its largest term."""
    probs = ensemble_probs(member_logits.double())
    largest = probs.topk(min(top, probs.shape[-1]), dim=-1).values  # (B, top), descending
    complement = torch.cat([off_top_mass(probs)[..., None], 1 - largest[..., 1:]], dim=-1)
    return (largest**gamma * complement**gamma).sum(dim=-1)


def predictive_entropy(member_logits: Tensor) -> Tensor:
    """Entropy of the ensemble's predictive distribution, H[p] in nats (total uncertainty)."""
    return entropy(ensemble_probs(member_logits.double()))


def expected_entropy(member_logits: Tensor) -> Tensor:
    """The members' mean entropy, mean_m H[p_m] in nats: the data part of the predictive entropy, whose other part
    is the members' disagreement (`mutual_information`; Depeweg et al., 2018, paper 001 Eq. 6). The entropy for a
    single model. On movie-review sentiment it ranks OOD reviews better than the MSP of the members' mean, for Hydra
    and deep ensembles alike (docs/benchmarks.md)."""
    return decompose(member_logits.double())["data"]


OOD_SCORES: dict[str, Callable[[Tensor], Tensor]] = {
    "msp": msp,
    "max_logit": max_logit,
    "energy": energy,
    "entropy": predictive_entropy,
    "expected_entropy": expected_entropy,
    "gen": gen,
    "mutual_information": lambda member_logits: mutual_information(member_logits.double()),
    "disagreement": lambda member_logits: disagreement(member_logits.double()),
}
