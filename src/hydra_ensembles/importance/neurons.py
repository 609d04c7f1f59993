"""Adaptive MLP pruning (paper 002, §3.2-3.4): Taylor importance of MLP neurons and a per-block binary search
of each MLP's hidden size under an entropy threshold (Algorithm 1).

Importance (Eq. 3-4): with h_k the input of an MLP's second linear layer (neuron k's activation) and C the
criterion, I_k = |sum over tokens n of h_k^(n) dC/dh_k^(n)| for one sequence (Eq. 4), averaged over the
sequences of the pruning set: the absolute value per sequence, as Molchanov et al. (2017), whom the paper follows,
take it per example. (Summing the signed terms over the whole set first lets examples cancel; on the examples
a model was fine-tuned on, the cross-entropy's would cancel almost exactly.) C is one of the
Taylor losses (`importance.losses`): "cross_entropy" with labels, "entropy" of the model's predictions
(label-free), or "similarity", the inter-instance similarity entropy of Eq. 5-7 on the [CLS] token.

Search (Algorithm 1): blocks go from the last to the first; block l's hidden size M is searched in [0, M0] by
halving the range t_max times: M_t = (M_min + M_max) // 2 keeps block l's M_t most important neurons; it is
accepted (M_max = M_t, the next step tries fewer) when the criterion E rose by less than delta_e over E_0^(l),
the entropy accepted at the previous block, else rejected (M_min = M_t). Sizes are tried by ablation (exact:
`pruning.ablate_neurons`); the result is pruned structurally. Searching block l changes nothing below it and the
blocks below are still unpruned, so the hidden states entering block l are computed once per block and each
size runs blocks l.. only (`reuse_prefix`; the same values as the full forward pass; 1.44x faster on MiniLM,
`benchmarks/amp_search.py`).

Baselines at a given width (paper 002, Tables 3 and 6): `magnitude_neuron_scores` (L2 norm of a neuron's weights)
and `random_neuron_scores` rank neurons as `neuron_scores` does, and `prune_to_sizes` keeps the top ones of any
ranking at any per-block sizes (`uniform_sizes` spreads a neuron total evenly over the blocks).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..adapters import get_adapter
from ..data.loaders import Batch, materialize, split_batch, to_device
from ..modes import evaluating
from ..pruning import NeuronMap, ablate_neurons, kept_neurons, prune_neurons
from .gradients import gradients_for
from .losses import choose_loss, weighted_losses


def neuron_scores(
    model: nn.Module, loader: Iterable[Batch], *, loss: str = "auto", temperature: float = 1 / 15, progress: bool = True
) -> list[Tensor]:
    """I_k of every MLP neuron (Eq. 4; per sequence, averaged over `loader`), one (F_l,) tensor per layer in the
    model's current neuron order; higher = more important. The model is not modified. `loss` as in
    `taylor_head_scores`."""
    adapter = get_adapter(model)
    batches = materialize(loader, "pruning loader")
    classifier = adapter.is_classifier(model)
    loss = choose_loss(loss, classifier, batches)
    blocks = [adapter.block(layer) for layer in adapter.layers(model)]
    sums = [torch.zeros(b.mlp_out.in_features, dtype=torch.float64) for b in blocks]
    activations: list[Tensor] = []  # one batch's, filled by the hooks during its forward pass
    hooks = [b.mlp_out.register_forward_pre_hook(lambda _, args: activations.append(args[0])) for b in blocks]
    try:
        # gradients through the first MLP linears make every activation h part of the graph
        with gradients_for(model, [b.mlp_in.weight for b in blocks]):
            values = weighted_losses(loss, model, batches, classifier=classifier, temperature=temperature)
            bar = tqdm(values, desc="neuron scores", total=len(batches), disable=not progress, leave=False)
            for value, share in bar:
                grads = torch.autograd.grad(value * share, activations)
                if len(activations) != len(blocks):
                    raise ValueError(
                        f"expected one MLP activation per block, got {len(activations)} for {len(blocks)} blocks: "
                        "set config.chunk_size_feed_forward = 0 before scoring neurons."
                    )
                for acc, h, g in zip(sums, activations, grads):
                    per_token = _product(h.detach(), g).reshape(h.shape[0], -1, h.shape[-1])  # (B, N, F)
                    acc += per_token.sum(dim=1).abs().sum(dim=0).cpu()  # Eq. 4 per sequence, summed over the set
                activations.clear()
    finally:
        for hook in hooks:
            hook.remove()
    return [s.float() for s in sums]


def criterion_value(model: nn.Module, batches: list[Batch], loss: str, temperature: float = 1 / 15) -> float:
    """The criterion E over the pruning set: the batch-size-weighted mean of the loss, in eval mode."""
    classifier = get_adapter(model).is_classifier(model)
    loss = choose_loss(loss, classifier, batches)
    with evaluating(model), torch.no_grad():
        values = weighted_losses(loss, model, batches, classifier=classifier, temperature=temperature)
        return sum(value.item() * share for value, share in values)


def binary_search_size(
    evaluate: Callable[[int], float], full_size: int, reference: float, delta: float, t_max: int | None = 6
) -> tuple[int, float]:
    """Algorithm 1's search for one block: the hidden size M in [0, full_size] and its criterion.

    Each step tries M_t = (M_min + M_max) // 2 and accepts it when evaluate(M_t) - reference < delta (then
    M_max = M_t), else M_min = M_t; it stops after `t_max` steps (None: until the range is one apart). Returns
    the last accepted (M, E), or (full_size, reference) if none was. If evaluate(M) decreases as M grows, the
    result with t_max=None is the smallest size (>= 1) under the threshold.
    """
    low, high = 0, full_size
    best, best_value = full_size, reference
    step = 0
    while high - low > 1 and (t_max is None or step < t_max):
        size = max(1, (low + high) // 2)
        value = evaluate(size)
        if value - reference < delta:
            high, best, best_value = size, size, value
        else:
            low = size
        step += 1
    return best, best_value


@dataclass
class AdaptivePruning:
    """The outcome of `adaptive_mlp_pruning`.

    sizes: the kept hidden size of every block (original numbering of layers).
    entropies: the criterion accepted after each block, E_res^(l), in the order searched (last block first).
    baseline: E of the unpruned model. kept: the neuron map of the pruned model.
    """

    sizes: list[int]
    entropies: list[float]
    baseline: float
    kept: NeuronMap


def _product(h: Tensor, g: Tensor) -> Tensor:
    """h * dC/dh in float64 for the signed sum over tokens. A bf16/fp16 product (3 significant digits) is rounded
    before a sum that can cancel, so half precision is widened first; float32's product (rounded at 6e-8) is
    kept, as every recorded AMP search computed it."""
    if h.dtype in (torch.bfloat16, torch.float16):
        return h.double() * g.double()
    return (h * g).double()


def check_search_args(delta_e: float, t_max: int | None, temperature: float) -> None:
    """Refuse, before any work, what would make Algorithm 1 silently prune nothing (NaN, t_max < 1) or everything
    (an infinite threshold)."""
    if not (math.isfinite(delta_e) and delta_e > 0):
        raise ValueError(f"delta_e must be a finite number > 0 (the entropy rise a block may cause), got {delta_e}.")
    if t_max is not None and t_max < 1:
        raise ValueError(f"t_max must be >= 1 binary-search steps, or None for a search to the end; got {t_max}.")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}.")


def adaptive_mlp_pruning(
    model: nn.Module,
    loader: Iterable[Batch],
    delta_e: float,
    *,
    t_max: int | None = 6,
    loss: str = "entropy",
    temperature: float = 1 / 15,
    scores: list[Tensor] | None = None,
    reuse_prefix: bool = True,
    progress: bool = True,
) -> tuple[nn.Module, AdaptivePruning]:
    """Algorithm 1 of paper 002 on a copy of `model`: per block, from the last to the first, the smallest MLP
    hidden size (by binary search, `t_max` steps) whose criterion stays within `delta_e` of the entropy
    accepted at the previous block, keeping the most important neurons (`neuron_scores`, computed with the same
    criterion unless given). Returns the structurally pruned copy and the search record.

    reuse_prefix: run only blocks l.. for each size tried in block l, from the hidden states entering block l
    computed once (the same values; False runs the whole model for every size, as Algorithm 1 is written).
    """
    check_search_args(delta_e, t_max, temperature)
    batches = materialize(loader, "pruning loader")
    loss = choose_loss(loss, get_adapter(model).is_classifier(model), batches)  # one criterion for all sizes
    scores = (
        scores
        if scores is not None
        else neuron_scores(model, batches, loss=loss, temperature=temperature, progress=progress)
    )
    work = copy.deepcopy(model)
    ranked = _ranked(work, scores)
    baseline = reference = criterion_value(work, batches, loss, temperature)
    removed: dict[int, list[int]] = {}  # neurons dropped in the blocks already searched
    sizes, entropies = {layer: len(ranked[layer]) for layer in ranked}, []
    for layer in tqdm(sorted(ranked, reverse=True), desc="adaptive MLP pruning", disable=not progress):
        entering = layer_inputs(work, batches, layer) if reuse_prefix and layer > 0 else None

        def evaluate(size: int, layer: int = layer, entering: Entering | None = entering) -> float:
            with ablate_neurons(work, removed | {layer: ranked[layer][size:]}), from_layer(work, entering):
                return criterion_value(work, batches, loss, temperature)

        size, reference = binary_search_size(evaluate, len(ranked[layer]), reference, delta_e, t_max)
        sizes[layer] = size
        removed[layer] = ranked[layer][size:]
        entropies.append(reference)
    prune_neurons(work, {layer: ks for layer, ks in removed.items() if ks})
    record = AdaptivePruning([sizes[layer] for layer in sorted(sizes)], entropies, baseline, kept_neurons(work))
    return work.eval(), record


class _Entered(Exception):
    """Raised by `layer_inputs`' hook to stop a forward pass once the states it wants are in hand."""


@dataclass
class Entering:
    """The hidden states entering block `layer`, one (B, T, d) tensor per batch, and the form of a block's
    output (some HF families return a tuple whose first item is the hidden states)."""

    layer: int
    states: list[Tensor]
    tuples: int  # 0: a block returns the hidden states; n: a tuple of n items, the states first (DeBERTa: 2)


def layer_inputs(model: nn.Module, batches: list[Batch], layer: int) -> Entering:
    """The hidden states entering block `layer` (>= 1) for each batch, in eval mode: each forward pass stops
    there."""
    if layer < 1:
        raise ValueError(f"layer must be >= 1 (block 0's input is the embedding output), got {layer}.")
    adapter = get_adapter(model)
    device = next(model.parameters()).device
    entering, tuples = [], []

    def keep(module: nn.Module, args: tuple, kwargs: dict) -> None:
        entering.append(args[0] if args else kwargs["hidden_states"])
        raise _Entered

    layers = adapter.layers(model)
    hooks = [
        layers[layer].register_forward_pre_hook(keep, with_kwargs=True),
        layers[0].register_forward_hook(
            lambda module, args, out: tuples.append(len(out) if isinstance(out, tuple) else 0)
        ),
    ]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                with contextlib.suppress(_Entered):
                    adapter.output(model, to_device(split_batch(adapter, batch)[0], device))
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return Entering(layer, entering, tuples[0] if tuples else 1)


class _Replay(nn.Module):
    """Stands in for blocks 0..l-1: passes its input on (block l reads the saved states instead, `from_layer`), in
    the form the block it replaces returns, and with its attributes (the model's layer loop may read them:
    ModernBERT's `attention_type`)."""

    def __init__(self, tuples: int, replaced: nn.Module):
        super().__init__()
        self.tuples = tuples
        self.__dict__["replaced"] = replaced  # not a submodule: its parameters stay out of the model

    def __getattr__(self, name: str) -> object:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["replaced"], name)

    def forward(self, *args, **kwargs) -> Tensor | tuple[Tensor | None, ...]:
        x = args[0] if args else kwargs["hidden_states"]
        return (x, *[None] * (self.tuples - 1)) if self.tuples else x


@contextlib.contextmanager
def from_layer(model: nn.Module, entering: Entering | None) -> Iterator[nn.Module]:
    """Within the block, forward passes over the batches `entering` was computed from (`layer_inputs`, in the
    same order) start at block `entering.layer` from the saved states: the blocks below it are skipped. None:
    nothing changes."""
    if entering is None:
        yield model
        return
    layers = get_adapter(model).layers(model)
    originals = [layers[i] for i in range(entering.layer)]
    states = iter(entering.states)

    def enter(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        # block l reads the saved states, whatever the skipped blocks and any module between them passed on
        # (DeBERTa-v2-xlarge's convolution runs after block 0)
        x = next(states)
        return ((x, *args[1:]), kwargs) if args else (args, kwargs | {"hidden_states": x})

    hook = layers[entering.layer].register_forward_pre_hook(enter, with_kwargs=True)
    try:
        for i in range(entering.layer):
            layers[i] = _Replay(entering.tuples, originals[i])
        yield model
    finally:
        hook.remove()
        for i, original in enumerate(originals):
            layers[i] = original


def magnitude_neuron_scores(model: nn.Module) -> list[Tensor]:
    """The L2 baseline: each MLP neuron's weight norm, ||[row k of the first linear (and its gate's row), its
    bias, column k of the second linear]||_2, one (F_l,) tensor per layer in the model's current neuron order."""
    adapter = get_adapter(model)
    scores = []
    for layer in adapter.layers(model):
        block = adapter.block(layer)
        width = block.mlp_out.in_features  # F
        parts = [_per_neuron(block.mlp_in.weight, width), block.mlp_out.weight.detach().T]  # (F, U*d), (F, d)
        if block.mlp_in.bias is not None:
            parts.append(_per_neuron(block.mlp_in.bias, width))  # (F, U)
        scores.append(torch.cat(parts, dim=1).float().norm(dim=1).cpu())
    return scores


def _per_neuron(tensor: Tensor, width: int) -> Tensor:
    """A first linear's weight (U*F, d) or bias (U*F,) as one row per neuron, (F, U*d) or (F, U): U = 1, or 2 for a
    gated MLP whose rows are [input | gate] (a neuron's gate row belongs to it)."""
    return tensor.detach().reshape(-1, width, *tensor.shape[1:]).transpose(0, 1).reshape(width, -1)


def random_neuron_scores(model: nn.Module, seed: int = 0) -> list[Tensor]:
    """The random baseline: i.i.d. uniform scores (seeded), one (F_l,) tensor per layer."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(len(kept), generator=generator) for kept in kept_neurons(model).values()]


def uniform_sizes(model: nn.Module, total: int) -> list[int]:
    """`total` MLP neurons spread as evenly as the blocks allow (the first blocks get the remainder), for a
    uniform-width baseline with the parameters of an adaptive result (`sum(record.sizes)`)."""
    widths = [len(kept) for kept in kept_neurons(model).values()]
    if not len(widths) <= total <= sum(widths):
        raise ValueError(f"total must be between {len(widths)} (one neuron per block) and {sum(widths)}, got {total}.")
    base, extra = divmod(total, len(widths))
    sizes = [base + (i < extra) for i in range(len(widths))]
    if any(size > width for size, width in zip(sizes, widths)):
        raise ValueError(f"{total} neurons cannot be spread evenly over blocks of widths {widths}.")
    return sizes


def prune_to_sizes(model: nn.Module, scores: list[Tensor], sizes: list[int]) -> nn.Module:
    """A copy of `model` whose block l keeps its `sizes[l]` highest-scoring MLP neurons, pruned structurally."""
    ranked = _ranked(model, scores)
    if len(sizes) != len(ranked) or any(not 1 <= size <= len(ranked[layer]) for layer, size in enumerate(sizes)):
        raise ValueError(
            f"sizes must give every block between 1 and its width {[len(r) for r in ranked.values()]}, got {sizes}."
        )
    pruned = copy.deepcopy(model)
    plan = {layer: ranked[layer][size:] for layer, size in enumerate(sizes) if size < len(ranked[layer])}
    return prune_neurons(pruned, plan).eval()


def _ranked(model: nn.Module, scores: list[Tensor]) -> dict[int, list[int]]:
    """{layer: the kept neurons (original numbering), most important first}; ties keep the model's order."""
    kept = kept_neurons(model)
    if [len(s) for s in scores] != [len(kept[layer]) for layer in sorted(kept)]:
        raise ValueError("scores do not match the model's MLP widths: compute them on this model.")
    return {
        layer: [kept[layer][i] for i in torch.argsort(scores[layer], descending=True, stable=True).tolist()]
        for layer in kept
    }
