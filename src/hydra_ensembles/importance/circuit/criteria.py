"""Circuit criteria: the validation score S that greedy extraction keeps high (paper 000, §D.1.2), one class
each behind a tiny interface, chosen by name from a registry (`register_criterion` adds one); and the tie rules
(`TIE_BREAKS`) that order candidates leaving the same S.

    S_acc = ID accuracy        S_ood = AUROC of MSP, ID vs OOD        S_avg = (S_acc + S_ood) / 2

S counts examples, so on small or easy validation data many candidates leave exactly the same S. Each criterion
also has a continuous `secondary` score from the same logits; the rule "score" compares candidates by
(S, secondary), the rule "order" by S alone (Algorithm 1's literal `S > best`); what is still equal falls to
candidate order.
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

    def secondary(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        """A continuous score (higher is better) that orders candidates leaving the same S (tie rule "score")."""
        raise NotImplementedError(f"{type(self).__name__} has no secondary score; ties fall to candidate order.")

    @classmethod
    def has_secondary(cls) -> bool:
        return cls.secondary is not CircuitCriterion.secondary


class AccuracyCriterion(CircuitCriterion):
    """S_acc: top-1 accuracy on the ID validation set. Surrogate: mean probability of the true class.

    Secondary: the mean log-probability of the true class (minus the ID NLL). Once accuracy saturates, removals
    that keep every prediction still differ in how confident the correct predictions stay; the NLL measures that
    on every example (a proper scoring rule, so no reward for confident mistakes)."""

    needs_ood = False

    def __call__(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        return accuracy(id_logits, id_labels)

    def surrogate(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> Tensor:
        return id_logits.softmax(dim=-1).gather(1, id_labels[:, None].to(id_logits.device)).mean()

    def secondary(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        log_probs = id_logits.double().log_softmax(dim=-1)
        return log_probs.gather(1, id_labels[:, None].to(id_logits.device)).mean().item()


class MSPAurocCriterion(CircuitCriterion):
    """S_ood: AUROC of the maximum softmax probability separating ID from OOD (OOD positive, score = 1 - MSP, as
    evaluation scores it: `off_top_mass`).

    Surrogate: the mean over (ID, OOD) pairs of sigmoid((MSP_id - MSP_ood) / 0.05), a smoothed AUROC.

    Secondary: the mean MSP gap, mean MSP_id - mean MSP_ood, which is the mean over (ID, OOD) pairs of
    MSP_id - MSP_ood: AUROC is the mean of that gap's sign. AUROC counts only the order of the pairs, so at
    1.0 (every ID above every OOD example, common on easy OOD validation data) every candidate that keeps the
    order ties; the gap still measures how far apart the two sets stay. It is bounded (each example moves it by
    at most 1/N), so no single very confident example decides, as it would in log space. MSPs are taken as
    1 - `off_top_mass`, which does not round to 1.0 for confident inputs.
    """

    needs_ood = True

    def __call__(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        score = off_top_mass(torch.cat([id_logits, ood_logits]).double().softmax(dim=-1))
        is_ood = torch.cat([torch.zeros(len(id_logits)), torch.ones(len(ood_logits))]).bool()
        return auroc(score, is_ood)

    def surrogate(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> Tensor:
        msp_id, msp_ood = id_logits.softmax(-1).amax(-1), ood_logits.softmax(-1).amax(-1)
        return torch.sigmoid((msp_id[:, None] - msp_ood[None, :]) / 0.05).mean()

    def secondary(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        off_id, off_ood = (off_top_mass(x.double().softmax(dim=-1)) for x in (id_logits, ood_logits))
        return (off_ood.mean() - off_id.mean()).item()  # (1 - off_id) - (1 - off_ood)


class AverageCriterion(CircuitCriterion):
    """S_avg = (S_acc + S_ood) / 2; its surrogate and its secondary are the means of theirs."""

    needs_ood = True

    def __call__(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        acc = AccuracyCriterion()(id_logits, id_labels, ood_logits)
        return (acc + MSPAurocCriterion()(id_logits, id_labels, ood_logits)) / 2

    def surrogate(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> Tensor:
        parts = (AccuracyCriterion(), MSPAurocCriterion())
        return sum(c.surrogate(id_logits, id_labels, ood_logits) for c in parts) / 2

    def secondary(self, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None) -> float:
        parts = (AccuracyCriterion(), MSPAurocCriterion())
        return sum(c.secondary(id_logits, id_labels, ood_logits) for c in parts) / 2


CRITERIA: dict[str, CircuitCriterion] = {
    "acc": AccuracyCriterion(),
    "ood": MSPAurocCriterion(),
    "avg": AverageCriterion(),
}


def register_criterion(name: str, criterion: CircuitCriterion) -> None:
    """Make `criterion` available as `extract_circuit(..., criterion=name)`."""
    CRITERIA[name] = criterion


S_DIGITS = 12  # S compared at 12 decimals: values equal in exact arithmetic, e.g. (acc + AUROC) / 2 of two other
# (acc, AUROC) pairs with one sum, can differ in the last bit; counts over <= 1e5 examples differ far above it.
# (Two values a bit apart can still straddle a rounding boundary: about 1e-4 odds, not never.)


class TieBreak(ABC):
    """How candidates are compared: by the tuple `value` gives, greatest first; equal values fall to candidate
    order, and count as ties (removals the data could not decide). S is compared rounded to `S_DIGITS` decimals."""

    says: ClassVar[str]  # the rule, as a circuit's tie note names it

    def applies_to(self, criterion: CircuitCriterion) -> bool:
        """Whether the rule can order `criterion`'s candidates."""
        return True

    @abstractmethod
    def value(
        self, criterion: CircuitCriterion, id_logits: Tensor, id_labels: Tensor, ood_logits: Tensor | None
    ) -> tuple[float, ...]:
        """(S, ...) of one candidate's logits."""


class ByOrder(TieBreak):
    """Algorithm 1 literally: S alone, the first candidate of equal S wins."""

    says = "S alone"

    def value(self, criterion, id_logits, id_labels, ood_logits):
        return (round(float(criterion(id_logits, id_labels, ood_logits)), S_DIGITS),)


class BySecondary(TieBreak):
    """S, then the criterion's continuous secondary score."""

    says = "S, then the criterion's secondary score"

    def applies_to(self, criterion: CircuitCriterion) -> bool:
        return criterion.has_secondary()

    def value(self, criterion, id_logits, id_labels, ood_logits):
        s = round(float(criterion(id_logits, id_labels, ood_logits)), S_DIGITS)
        return s, criterion.secondary(id_logits, id_labels, ood_logits)


TIE_BREAKS: dict[str, TieBreak] = {"score": BySecondary(), "order": ByOrder()}
