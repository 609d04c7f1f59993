"""Structural MLP-neuron pruning (paper 002, §3.4): remove hidden neurons of each layer's MLP, and ablate them
reversibly, for scoring.

A *neuron map* says, for every layer, which MLP hidden neurons are kept, as sorted indices in the original
numbering: `{0: [0, 3, 4, ...], ...}`. A pruned model carries it in `config.hydra_kept_neurons`, a structure
that `persist.py` records and replays, so the model saves and reloads as a plain HF model.

Pruning neuron k of a layer removes row k of the MLP's first linear (and its bias; in a gated MLP also its gate's
row F + k: a GeGLU unit is input, gate and output together) and column k of the second.
Ablation instead zeroes column k of the second linear in place (the neuron then adds exactly nothing) and
restores it afterwards; the two give the same outputs. Every layer keeps at least one neuron.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ..adapters import get_adapter
from .heads import (
    SHARED_CONFIG,
    check_plain_linears,
    complement,
    index_set,
    layer_keys,
    slice_linear,
    zeroed_columns,
)
from .persist import read_structure, record_fingerprint, register_structure, write_structure

NeuronMap = dict[int, list[int]]
KEPT_NEURONS_KEY = "hydra_kept_neurons"


def kept_neurons(model: nn.Module) -> NeuronMap:
    """The model's neuron map: for each layer, the kept MLP neurons in the original numbering."""
    adapter = get_adapter(model)
    widths = [adapter.block(layer).mlp_out.in_features for layer in adapter.layers(model)]
    stored = read_structure(model, KEPT_NEURONS_KEY)
    if stored is None:
        return {layer: list(range(width)) for layer, width in enumerate(widths)}
    kept = {int(layer): sorted(int(k) for k in neurons) for layer, neurons in stored.items()}
    for layer, neurons in kept.items():  # positions read from a wrong record would cut or zero the wrong neurons
        width = widths[layer] if layer < len(widths) else 0
        if width != len(neurons):
            raise ValueError(
                f"layer {layer} of this {type(model).__name__} has {width} MLP neurons, and its config "
                f"records {len(neurons)} kept ({KEPT_NEURONS_KEY}): its weights do not match its pruning record. "
                "Load a pruned save with hydra_ensembles.load_model, not from_pretrained(..., "
                f"ignore_mismatched_sizes=True). {SHARED_CONFIG}"
            )
    return kept


def prune_neurons(model: nn.Module, neurons_to_prune: Mapping[int, Iterable[int]]) -> nn.Module:
    """Structurally remove MLP neurons, in place. Returns `model`.

    Args:
        model: a supported HF model, pruned or not (heads and neurons are independent structures).
        neurons_to_prune: `{layer: [neuron, ...]}` in the original numbering.
    """
    adapter = get_adapter(model)
    kept = kept_neurons(model)
    plan = _check(kept, neurons_to_prune, "the neurons to prune")
    remaining = {layer: [k for k in kept[layer] if k not in neurons] for layer, neurons in plan.items()}
    for layer, neurons in plan.items():  # refused before any layer is cut: a refused plan leaves the model whole
        if not remaining[layer]:
            raise ValueError(f"pruning {sorted(neurons)} would leave layer {layer} without MLP neurons; keep one.")
    layers = adapter.layers(model)
    for layer in plan:
        check_plain_linears([adapter.block(layers[layer]).mlp_in, adapter.block(layers[layer]).mlp_out])
    record_fingerprint(model)
    try:
        for layer in plan:
            rows = _positions(kept[layer], remaining[layer])
            block = adapter.block(layers[layer])
            adapter.set_mlp(
                layers[layer],
                slice_linear(block.mlp_in, block.mlp_in_rows(rows), dim=0),  # a gated MLP's gate rows go with them
                slice_linear(block.mlp_out, rows, dim=1),
            )
            kept[layer] = remaining[layer]
    finally:  # a layer that failed midway (out of memory) leaves the record true to the rest
        write_structure(model, KEPT_NEURONS_KEY, {str(layer): neurons for layer, neurons in kept.items()})
    return model


def keep_neurons(model: nn.Module, neuron_map: Mapping[int, Iterable[int]]) -> nn.Module:
    """Prune, in place, every MLP neuron that `neuron_map` does not keep. Layers missing from it keep all."""
    return prune_neurons(model, complement(kept_neurons(model), neuron_map, "neuron"))


@contextmanager
def ablate_neurons(model: nn.Module, neurons: Mapping[int, Iterable[int]]) -> Iterator[nn.Module]:
    """Turn MLP neurons off by zeroing their columns of the MLP's second linear; restore them on exit."""
    adapter = get_adapter(model)
    kept = kept_neurons(model)
    plan = _check(kept, neurons, "the neurons to ablate")
    layers = adapter.layers(model)
    check_plain_linears([adapter.block(layers[layer]).mlp_out for layer in plan])  # a wrapper would add them back
    columns = [
        (adapter.block(layers[layer]).mlp_out.weight, _positions(kept[layer], ks))  # (d, F)
        for layer, ks in plan.items()
    ]
    with zeroed_columns(columns):
        yield model


def _positions(kept: list[int], neurons: Iterable[int]) -> Tensor:
    """Where each of `neurons` (original numbering) sits among the `kept` ones: indices into the pruned matrices.
    A dict, not list.index: an AMP search asks this for thousands of neurons at every evaluation."""
    position = {k: i for i, k in enumerate(kept)}
    return torch.tensor([position[k] for k in neurons], dtype=torch.long)


def _check(kept: NeuronMap, neurons: Mapping[int, Iterable[int]], what: str) -> dict[int, set[int]]:
    if not isinstance(neurons, Mapping):
        raise TypeError(f"{what} must be a dict {{layer: [neuron, ...]}}, got {type(neurons).__name__}.")
    plan = {}
    for layer, ks in layer_keys(neurons, what).items():
        if layer not in kept:
            raise ValueError(f"layer {layer} is out of range: the model has layers 0..{len(kept) - 1}.")
        ks = index_set(ks, "neuron", layer)
        gone = sorted(ks - set(kept[layer]))
        if gone:
            raise ValueError(
                f"neuron(s) {gone[:5]} of layer {layer} are not in the model (already pruned, or beyond its width); "
                "neuron indices are always in the original numbering."
            )
        if ks:
            plan[layer] = ks
    return plan


register_structure(  # kept MLP neurons: recorded in config.json, replayed when the model is loaded
    KEPT_NEURONS_KEY,
    lambda model, saved: keep_neurons(model, {int(layer): ks for layer, ks in saved.items()}),
    check=kept_neurons,
)
