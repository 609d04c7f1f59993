"""The predictor contract: whatever predicts returns member logits (B, M, C).

A Hydra Ensemble, a deep ensemble, MC dropout, a LoRA ensemble, a temperature-scaled model, and a plain HF
classifier (an ensemble of one: its logits (B, C) read as (B, 1, C)) are all predictors. Evaluation, OOD scores,
`predict` and `evaluate` are written once against this contract. Shapes: B inputs, M members, C classes,
D pooled size, T tokens, d hidden size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .data.loaders import TARGETS, to_device
from .modes import evaluating
from .uncertainty import ensemble_probs, mutual_information


@dataclass
class PredictorOutput:
    """What a predictor returns.

    member_logits: (B, M, C), each member's logits, for classifiers (None for encoders).
    member_pooled: (B, M, D), each member's pooled output (what the HF model returns as pooler_output,
        text_embeds or image_embeds), for encoders without a classifier (None for classifiers).
    member_hidden_states: (B, M, T, d), each member's last-layer output before any final norm, when asked for.
    member_gaussians: (B, M, 2), each member's predictive Gaussian (mean, log-variance), for heteroscedastic
        regressors (None for the others); the prediction is their uniform mixture.
    """

    member_logits: Tensor | None = None
    member_pooled: Tensor | None = None
    member_hidden_states: Tensor | None = None
    member_gaussians: Tensor | None = None

    @property
    def probs(self) -> Tensor:
        """Ensemble predictive distribution, (B, C): the mean of the members' softmax probabilities."""
        return ensemble_probs(self._logits())

    @property
    def mutual_information(self) -> Tensor:
        """Model uncertainty per input, (B,): entropy of the mean minus mean of the members' entropies (nats)."""
        return mutual_information(self._logits())

    def _logits(self) -> Tensor:
        if self.member_logits is None:
            if self.member_gaussians is not None:
                raise ValueError(
                    "this ensemble is a regressor: its members predict Gaussians (member_gaussians), not class "
                    "probabilities; hydra_ensembles.uncertainty.gaussian_mixture gives their mean and variances."
                )
            raise ValueError("this ensemble has no classifier: use member_pooled instead of probabilities.")
        return self.member_logits


def member_outputs_of(output: Any) -> Tensor:
    """What a predictor's members predict: member logits (B, M, C) of a classifier (see `member_logits_of`), or
    member Gaussians (B, M, 2) of a regressor."""
    gaussians = getattr(output, "member_gaussians", None)
    return gaussians if gaussians is not None else member_logits_of(output)


def member_logits_of(output: Any) -> Tensor:
    """(B, M, C) from any predictor's output: its `member_logits`, or a plain HF model's `logits` (B, C) as M = 1."""
    member_logits = getattr(output, "member_logits", None)
    return member_logits if member_logits is not None else output.logits[:, None]


@torch.no_grad()
def map_batches(
    model: nn.Module,
    loader: Iterable[Mapping[str, Any]],
    step: Callable[[dict[str, Any]], Any],
    desc: str,
    progress: bool = False,
    empty: str = "nothing to predict",
) -> list:
    """`step(inputs)` for every batch of `loader`, in order: the inputs without `labels` and the other training
    targets, on `model`'s device, under no_grad with `model` in eval mode (put back in its mode afterwards). The
    one loop of inference over a loader; an empty loader is a ValueError that ends with `empty`."""
    device = next(model.parameters()).device
    parts = []
    with evaluating(model):
        for batch in tqdm(loader, desc=desc, disable=not progress, leave=False):
            parts.append(step(to_device({k: v for k, v in batch.items() if k not in TARGETS}, device)))
    if not parts:
        raise ValueError(f"the loader is empty: {empty}.")
    return parts


def collect_member_logits(model: nn.Module, loader: Iterable[Mapping[str, Any]], progress: bool = False) -> Tensor:
    """Member logits (N, M, C), float32 on the CPU, of any predictor over a loader of batches (`labels` and the
    other training targets are left out of the inputs); member Gaussians (N, M, 2) for a regressor. The model
    runs in eval mode and is put back in its mode afterwards."""

    def step(inputs: dict[str, Any]) -> Tensor:
        return member_outputs_of(model(**inputs)).float().cpu()

    return torch.cat(map_batches(model, loader, step, "predicting", progress))


def labels_of(loader: Iterable[Mapping[str, Any]]) -> Tensor:
    """The labels of a labelled loader, concatenated (N,), in the order `collect_member_logits` reads its inputs:
    a loader that shuffles anew on each pass is refused (its labels would not line up with logits of another
    pass), and so is one whose batches are labelled only in part."""
    reshuffling = _reshuffling_sampler(loader) if isinstance(loader, torch.utils.data.DataLoader) else None
    if reshuffling is not None:
        raise ValueError(
            f"the loader's sampler ({reshuffling}) may read another order on each pass: its labels would "
            "not line up with the logits of another pass. Use DataLoader(..., shuffle=False) on the subset "
            "(torch.utils.data.Subset rather than SubsetRandomSampler), or a list of batches, for evaluation."
        )
    labels, batches = [], 0
    for batch in loader:  # one batch at a time: the inputs are not kept
        batches += 1
        if batch.get("labels") is not None:
            labels.append(torch.as_tensor(batch["labels"]))
    if not batches:
        raise ValueError("the loader is empty: it yielded no batches.")
    if not labels:
        raise ValueError("the loader has no 'labels'.")
    if len(labels) < batches:
        raise ValueError(
            f"{batches - len(labels)} of the loader's {batches} batches have no 'labels': labels would not line up "
            "with the inputs. Label every batch."
        )
    return torch.cat(labels)


def _reshuffling_sampler(loader: torch.utils.data.DataLoader) -> str | None:
    """The name of the loader's sampler when it draws another order on each pass (random, subset-random,
    weighted, a shuffling DistributedSampler), also inside a batch sampler; None for any other (sequential, a
    list of indices, a custom batch sampler: their order is theirs to keep)."""
    data = torch.utils.data
    batch_sampler = getattr(loader, "batch_sampler", None)
    for sampler in (getattr(batch_sampler, "sampler", None), getattr(loader, "sampler", None)):
        random = isinstance(sampler, data.RandomSampler | data.SubsetRandomSampler | data.WeightedRandomSampler)
        if random or (isinstance(sampler, data.DistributedSampler) and sampler.shuffle):
            return type(sampler).__name__
    return None
