"""Taylor head importance (paper 000, §D.1.1, after Molchanov et al. 2019).

For head h of layer l, with W one of the input projections W_q, W_k, W_v (shape (H*dh, D), rows grouped per
head; a row block of a fused qkv projection) and G = dL/dW its gradient over the calibration data:

    q_h = 1/(dh*D) sum_{r in rows(h)} sum_c |W_rc G_rc|     (likewise k_h, v_h)
    s_h = (q_h + k_h + v_h) / 3

G is the gradient of the *mean* loss over all calibration examples (batch losses weighted by batch size), and
the model runs in eval mode (no dropout), so the scores of a per-example loss (cross-entropy, a classifier's
prediction entropy) do not depend on how the data is batched. The similarity entropy (encoders without a
classifier) compares each example with the others of its batch: its scores depend on the batch size.

The absolute value is taken after the gradient is summed over the data, as §D.1.1 writes it; MLP neuron scores
(`neurons.neuron_scores`, paper 002) take it per sequence. On the data a model was fine-tuned on, the summed
gradient nearly cancels and what is left ranks the heads; held-out calibration data avoids that (the benchmark
still scores on its first training batches, the records' setting).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..adapters import Block, get_adapter
from ..data.loaders import Batch, materialize
from ..pruning import kept_heads, per_layer, prune_heads
from .gradients import gradients_for
from .losses import choose_loss, weighted_losses


def taylor_head_scores(
    model: nn.Module,
    loader: Iterable[Batch],
    *,
    loss: str = "auto",
    temperature: float = 1 / 15,
    sequential_budget: int | Sequence[int] | None = None,
    readout: Callable[[Tensor], Tensor] | None = None,
    progress: bool = True,
) -> Tensor:
    """Score every attention head; higher = more important.

    Args:
        model: a supported HF model (classifier or encoder), pruned or not. It is not modified.
        loader: calibration batches (dicts of model inputs, with `labels` for cross-entropy).
        loss: "cross_entropy", "entropy" (label-free, paper 002 §3.3), "similarity" (label-free, Eq. 5-7 on the
            [CLS] token) or "auto" (cross-entropy when the model is a classifier and every batch has labels,
            entropy otherwise).
        readout: maps the model's output (an encoder's pooled embedding (B, d)) to logits (B, C), e.g. the
            zero-shot head of a two-tower model (`ZeroShotEnsemble.readout()`): the loss then reads those logits
            and the model counts as a classifier.
        temperature: tau of the similarity entropy used for encoders without a classifier.
        sequential_budget: heads to prune per layer (one int, or one per layer) for the prune-and-recompute mode:
            layers are scored in order 0..L-1 and, on a copy of the model, layer l's lowest-scoring heads are
            pruned before layer l+1 is scored, so later scores reflect the pruned network. Row l of the result
            is then the score of layer l just before it was pruned.
        progress: show a progress bar.

    Returns:
        (L, H) float tensor in the original head numbering; NaN for heads the model had already pruned.
    """
    adapter = get_adapter(model)
    batches = materialize(loader, "calibration loader")
    classifier = adapter.is_classifier(model) or readout is not None
    settings = (choose_loss(loss, classifier, batches), classifier, temperature, readout, progress)
    num_layers = adapter.num_layers(model)
    if sequential_budget is None:
        return _scores(model, batches, range(num_layers), *settings, "Taylor scores")
    budgets = per_layer(sequential_budget, num_layers, "sequential_budget")
    for layer, kept in kept_heads(model).items():  # pruning a layer leaves the others' heads: checked up front
        if budgets[layer] >= len(kept) and (kept or budgets[layer] > 0):
            raise ValueError(
                f"sequential_budget for layer {layer} is {budgets[layer]} but the layer has {len(kept)} heads; "
                "prune fewer heads than the layer has."
            )
    work = copy.deepcopy(model)
    scores = torch.full((num_layers, adapter.num_heads(model)), float("nan"))
    for layer in range(num_layers):
        desc = f"Taylor scores, layer {layer + 1}/{num_layers}"
        scores[layer] = _scores(work, batches, [layer], *settings, desc)[layer]
        kept = kept_heads(work)[layer]
        if not kept:  # a layer emptied before scoring (budget 0, checked above): nothing to score or prune
            continue
        lowest = sorted(kept, key=lambda h: (scores[layer, h].item(), h))[: budgets[layer]]
        prune_heads(work, {layer: lowest})
    return scores


def _scores(
    model: nn.Module,
    batches: list[Batch],
    layers: Iterable[int],
    loss: str,
    classifier: bool,
    temperature: float,
    readout: Callable[[Tensor], Tensor] | None,
    progress: bool,
    desc: str,
) -> Tensor:
    """One pass of gradient accumulation; scores for `layers` (other rows NaN)."""
    adapter = get_adapter(model)
    layers = list(layers)
    blocks = {layer: adapter.block(adapter.layers(model)[layer]) for layer in layers}
    linears = {id(linear): linear for b in blocks.values() for linear, _ in b.projection_rows()}  # fused qkv: once
    weights = [linear.weight for linear in linears.values()]
    grads = [torch.zeros_like(w, dtype=torch.float32) for w in weights]
    with gradients_for(model, weights):
        values = weighted_losses(loss, model, batches, classifier=classifier, temperature=temperature, readout=readout)
        for value, share in tqdm(values, desc=desc, total=len(batches), disable=not progress, leave=False):
            for acc, g in zip(grads, torch.autograd.grad(value * share, weights)):
                acc += g.float()
    return _per_head(model, blocks, {id(w): g for w, g in zip(weights, grads)})


def _per_head(model: nn.Module, blocks: dict[int, Block], grads: dict[int, Tensor]) -> Tensor:
    """(L, H) scores of `blocks`' layers from the accumulated gradients of their projection weights (by id)."""
    adapter = get_adapter(model)
    head_dim = adapter.head_dim(model)
    kept = kept_heads(model)
    scores = torch.full((adapter.num_layers(model), adapter.num_heads(model)), float("nan"))
    for layer, block in blocks.items():
        per_projection = []
        for linear, rows in block.projection_rows():
            saliency = (linear.weight.detach()[rows].float() * grads[id(linear.weight)][rows]).abs()  # (H*dh, D)
            per_projection.append(saliency.view(-1, head_dim, saliency.shape[1]).mean(dim=(1, 2)))  # (H,)
        layer_scores = torch.stack(per_projection).mean(dim=0).cpu()  # (H_kept,) or (1,) for a placeholder
        if kept[layer]:
            scores[layer, kept[layer]] = layer_scores[: len(kept[layer])]
            if not torch.isfinite(layer_scores[: len(kept[layer])]).all():  # NaN would read as "already pruned"
                raise ValueError(
                    f"the Taylor scores of layer {layer} are not finite (the loss or its gradient overflowed, e.g. "
                    "in fp16): score the model in float32."
                )
    return scores
