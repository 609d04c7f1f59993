"""Circuit criteria: the validation score S that greedy extraction keeps high (paper 000, §D.1.2), one class
each behind a tiny interface, chosen by name from a registry (`register_criterion` adds one).

    S_acc = ID accuracy        S_ood = AUROC of MSP, ID vs OOD        S_avg = (S_acc + S_ood) / 2
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import Tensor

from ...metrics import accuracy, auroc
from ...uncertainty import off_top_mass


class CircuitCriterion(ABC):
    """A validation score S to keep high while heads are removed."""

    needs_ood: ClassVar[bool]

    @abstractmethod
    def __call__(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        """S from ID logits (N, C), ID labels (N,) and OOD logits (N_ood, C)."""

    def surrogate(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> Tensor:
        """A differentiable stand-in for S, used only by the approximate `method="screen"`."""
        raise NotImplementedError(f"{type(self).__name__} has no differentiable surrogate; use method='fast'.")


class AccuracyCriterion(CircuitCriterion):
    """S_acc: top-1 accuracy on the ID validation set. Surrogate: mean probability of the true class."""

    needs_ood = False

    def __call__(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        return accuracy(id_logits, id_labels)

    def surrogate(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> Tensor:
        return id_logits.softmax(dim=-1).gather(1, id_labels[:, None].to(id_logits.device)).mean()


class MSPAurocCriterion(CircuitCriterion):
    """S_ood: AUROC of the maximum softmax probability separating ID from OOD (OOD positive, score = 1 - MSP, as
    evaluation scores it: `off_top_mass`).

    Surrogate: the mean over (ID, OOD) pairs of sigmoid((MSP_id - MSP_ood) / 0.05), a smoothed AUROC.
    """

    needs_ood = True

    def __call__(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        score = off_top_mass(torch.cat([id_logits, ood_logits]).double().softmax(dim=-1))
        is_ood = torch.cat([torch.zeros(len(id_logits)), torch.ones(len(ood_logits))]).bool()
        return auroc(score, is_ood)

    def surrogate(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> Tensor:
        msp_id, msp_ood = id_logits.softmax(-1).amax(-1), ood_logits.softmax(-1).amax(-1)
        return torch.sigmoid((msp_id[:, None] - msp_ood[None, :]) / 0.05).mean()


class AverageCriterion(CircuitCriterion):
    """S_avg = (S_acc + S_ood) / 2; its surrogate is the mean of theirs."""

    needs_ood = True

    def __call__(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        acc = AccuracyCriterion()(id_logits, id_labels, ood_logits)
        return (acc + MSPAurocCriterion()(id_logits, id_labels, ood_logits)) / 2

    def surrogate(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> Tensor:
        parts = (AccuracyCriterion(), MSPAurocCriterion())
        return sum(c.surrogate(id_logits, id_labels, ood_logits) for c in parts) / 2


CRITERIA: dict[str, CircuitCriterion] = {
    "acc": AccuracyCriterion(),
    "ood": MSPAurocCriterion(),
    "avg": AverageCriterion(),
}


def register_criterion(name: str, criterion: CircuitCriterion) -> None:
    """Make `criterion` available as `extract_circuit(..., criterion=name)`."""
    CRITERIA[name] = criterion
