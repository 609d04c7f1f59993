"""Wrappers: predictors built on other models (calibration, MC dropout, fitted OOD detectors, a deep ensemble).

Each names the model it is built on (`base`), so a chain of wrappers — temperature scaling of MC dropout of a
pruned model — unwinds to the model that says what the predictor is (its config, classes, heads and cost).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import nn


class Wrapper(nn.Module, ABC):
    """A predictor built on other models."""

    @property
    @abstractmethod
    def base(self) -> nn.Module:
        """The model whose config names the classes (the first member of a deep ensemble)."""

    @property
    def fitted_to_classes(self) -> bool:
        """Whether what it adds was fitted class by class (a vector-scaling bias, class-conditional detectors):
        it does not carry over when a zero-shot model is given other classes."""
        return False


def wrapper_chain(model: nn.Module) -> list[nn.Module]:
    """`model` and the models it is built on, outermost first: the last is no wrapper (an HF model, a Hydra
    Ensemble, a zero-shot ensemble)."""
    chain = [model]
    while isinstance(chain[-1], Wrapper):
        chain.append(chain[-1].base)
    return chain


def base_model(model: nn.Module) -> nn.Module:
    """The HF model, Hydra Ensemble or zero-shot ensemble that a wrapper predictor is built on (else `model`)."""
    return wrapper_chain(model)[-1]
