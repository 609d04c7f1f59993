"""The losses whose gradients Taylor importance reads: one class each behind a tiny interface, chosen by name
from a registry (`register_taylor_loss` adds one), as the circuit criteria are.

With labels: cross-entropy. Without labels: the information entropy of the model's predictions (paper 002,
§3.3) — of the softmax over classes for a classifier, or, for an encoder without a classifier, of the softmax
over in-batch cosine similarities of its pooled embeddings (Eq. 5-7). "similarity" applies Eq. 5-7 to the last
layer's [CLS] token of any model, a classifier included (the criterion paper 002 uses for its encoders).

Head importance (`taylor.py`) and neuron importance (`neurons.py`) share the choice of loss (`choose_loss`, with
its "auto" rule) and the pass that weighs each batch's loss by its share of the examples (`weighted_losses`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..adapters import get_adapter
from ..data.loaders import Batch, batch_size, split_batch, to_device
from ..metrics._checks import check_labels
from ..uncertainty import entropy


class TaylorLoss(ABC):
    """A scalar loss of a batch's outputs (logits (B, C), or pooled embeddings (B, D) of an encoder), or, when
    `reads == "cls"`, of the last layer's [CLS] token features (B, d)."""

    needs_labels: ClassVar[bool]
    reads: ClassVar[str] = "output"

    @abstractmethod
    def __call__(self, output: Tensor, labels: Tensor | None, *, classifier: bool, temperature: float) -> Tensor:
        """The mean loss over the batch; `temperature` is tau of the similarity entropy of encoders."""


class CrossEntropy(TaylorLoss):
    """Mean cross-entropy of a classifier's logits with the batch's labels."""

    needs_labels = True

    def __call__(self, output: Tensor, labels: Tensor | None, *, classifier: bool, temperature: float) -> Tensor:
        if labels is None or not classifier:
            raise ValueError(
                "loss='cross_entropy' needs a classifier and batches with 'labels'; "
                "use loss='entropy' (label-free) otherwise."
            )
        logits = output.to(torch.promote_types(output.dtype, torch.float32))  # bf16 up; float64 kept (exact tests)
        check_labels(labels, logits.shape[-1], "loss='cross_entropy'")
        return F.cross_entropy(logits, labels.to(logits.device))


class PredictionEntropy(TaylorLoss):
    """Label-free (paper 002, §3.3): the mean entropy of softmax(logits) for a classifier,
    E = -(1/B) sum_i sum_c p_ic log p_ic; for an encoder, `similarity_entropy` of its pooled embeddings."""

    needs_labels = False

    def __call__(self, output: Tensor, labels: Tensor | None, *, classifier: bool, temperature: float) -> Tensor:
        if classifier:
            return entropy(output.float().softmax(dim=-1)).mean()
        return similarity_entropy(output, temperature)


class SimilarityEntropy(TaylorLoss):
    """Label-free, for any model (paper 002, Eq. 5-7): `similarity_entropy` of the last layer's [CLS] tokens."""

    needs_labels = False
    reads = "cls"

    def __call__(self, output: Tensor, labels: Tensor | None, *, classifier: bool, temperature: float) -> Tensor:
        return similarity_entropy(output, temperature)


def similarity_entropy(embeddings: Tensor, temperature: float = 1 / 15) -> Tensor:
    """Label-free entropy of an encoder (paper 002, Eq. 5-7).

    s_ij = cos(z_i, z_j); p_ij = softmax_j(s_ij / tau); E = -(1/B) sum_i sum_j p_ij log p_ij.
    Shape: embeddings (B, D) -> scalar. Needs B >= 2 (with B = 1 the entropy is constantly zero).
    """
    if embeddings.shape[0] < 2:
        raise ValueError("the label-free similarity entropy needs batches of at least 2 examples.")
    z = F.normalize(embeddings.float(), dim=-1)
    probs = (z @ z.T / temperature).softmax(dim=-1)  # (B, B)
    return entropy(probs).mean()


TAYLOR_LOSSES: dict[str, TaylorLoss] = {
    "cross_entropy": CrossEntropy(),
    "entropy": PredictionEntropy(),
    "similarity": SimilarityEntropy(),
}


def register_taylor_loss(name: str, loss: TaylorLoss) -> None:
    """Make `loss` available as `taylor_head_scores(..., loss=name)`, `neuron_scores`, `adaptive_mlp_pruning` and
    the CLI's `--loss` (whose choices are `loss_choices()` when its parser is built)."""
    TAYLOR_LOSSES[name] = loss


def loss_choices() -> list[str]:
    """Every name `loss=` takes: "auto" and the registered losses."""
    return ["auto", *TAYLOR_LOSSES]


def needs_labels(name: str, classifier: bool = True) -> bool | None:
    """Whether loss `name` reads labels; for "auto", None (it uses them when every batch has them), or False for a
    model that is no classifier (`choose_loss` takes the label-free entropy: labels are neither read nor checked)."""
    if name == "auto":
        return None if classifier else False
    return taylor_loss(name).needs_labels


def taylor_loss(name: str) -> TaylorLoss:
    if name not in TAYLOR_LOSSES:
        raise ValueError(f"loss must be one of {loss_choices()}, got {name!r}.")
    return TAYLOR_LOSSES[name]


def choose_loss(name: str, classifier: bool, batches: list[Batch]) -> str:
    """`name`, with "auto" made cross-entropy when the model is a classifier (or reads out logits) and every batch
    has labels, the label-free entropy otherwise. An unknown name fails here, before any work."""
    if name == "auto":
        labelled = all(batch.get("labels") is not None for batch in batches)
        name = "cross_entropy" if classifier and labelled else "entropy"
    taylor_loss(name)
    return name


def weighted_losses(
    name: str,
    model: nn.Module,
    batches: list[Batch],
    *,
    classifier: bool,
    temperature: float,
    readout: Callable[[Tensor], Tensor] | None = None,
) -> Iterator[tuple[Tensor, float]]:
    """(batch mean of loss `name`, the batch's share of the examples) for each batch: sum(loss * share) is the
    mean over every example whatever the batching, and so is its gradient. Computed under the caller's grad
    mode, model mode and hooks; `readout` maps the model's output to logits first (as `taylor_head_scores`)."""
    adapter, loss = get_adapter(model), taylor_loss(name)
    if readout is not None and loss.reads == "cls":
        raise ValueError(
            f"the {name!r} loss reads the last layer's [CLS] features, which a readout (made for the model's pooled "
            "output) does not take: use a loss that reads the output, e.g. 'cross_entropy' or 'entropy'."
        )
    if loss.reads == "cls" and adapter.causal:
        raise ValueError(
            f"the {name!r} loss reads the last layer's first token, which in a causal text tower (CLIP's) attends "
            "to itself alone: the same start token in every row, so its entropy never changes and no neuron or head "
            "would seem to matter. Use loss='entropy', which reads the tower's pooled output (the end-of-text token)."
        )
    device = next(model.parameters()).device
    total = sum(batch_size(split_batch(adapter, batch)[0]) for batch in batches)
    for batch in batches:
        inputs, labels = split_batch(adapter, batch)
        output = _loss_input(loss, adapter, model, to_device(inputs, device))
        output = readout(output) if readout is not None else output
        yield loss(output, labels, classifier=classifier, temperature=temperature), batch_size(inputs) / total


def _loss_input(loss: TaylorLoss, adapter: Any, model: nn.Module, inputs: dict[str, Any]) -> Tensor:
    """What `loss` reads from one forward pass of `model` (an HF model with its adapter): the model's output
    (logits or pooled embedding), or the last layer's [CLS] token features (B, d)."""
    if loss.reads == "cls":
        return adapter.backbone(model)(**inputs).last_hidden_state[:, 0]
    return adapter.output(model, inputs)
