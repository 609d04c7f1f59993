"""Structural head pruning for HF transformers v5 (which removed `prune_heads`), and reversible head ablation.

A *head map* says, for every layer, which heads are kept, as sorted indices in the original numbering:
`{0: [0, 1, 3], 1: [2], ...}`. A pruned model carries its head map in `config.hydra_kept_heads`, a structure
that `persist.py` records and replays: the model is saved and restored with it (`save_model` / `load_model`).

Pruning head h of a layer removes rows h*dh:(h+1)*dh of W_q, W_k, W_v (and their biases; of each of the three row
blocks of a fused qkv projection) and the same columns of W_o; the model stays a normal HF model. Ablation instead
zeroes those columns of W_o in place and restores them afterwards; by construction the two give the same outputs
(contract 2 in DESIGN.md). Further projections whose rows are grouped per head (`LayerNames.head_rows`: DeBERTa's
position projections) lose the head's rows too.

Pruning every head of a layer is allowed (the paper allows it): the attention block then adds only W_o's bias.
HF attention modules cannot run with zero heads, so such a layer keeps one placeholder head whose q/k/v/o weights
and q/k/v biases are zero: it contributes exactly nothing, the head map records the layer as empty, and fusion
drops the placeholder. Parameter counts of the HF model include the placeholder (its q/k/v/o weights and q/k/v
biases, and its rows of any per-head position projection).
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.utils import skip_init

from ..adapters import Adapter, get_adapter
from .persist import read_structure, record_fingerprint, register_structure, write_structure

HeadMap = dict[int, list[int]]
"""{layer index: the heads that layer keeps, in the original numbering}: one pruned member's structure."""
KEPT_HEADS_KEY = "hydra_kept_heads"
SHARED_CONFIG = (  # the other way a record and the weights part: HF v5 models built from one config share it
    "Models built from one config object (Model(config) twice) share their pruning record: give each its own "
    "copy.deepcopy(config)."
)


def kept_heads(model: nn.Module) -> HeadMap:
    """The model's head map: for each layer, the kept heads in the original numbering."""
    adapter = get_adapter(model)
    stored = read_structure(model, KEPT_HEADS_KEY)
    if stored is None:
        heads = list(range(adapter.num_heads(model)))
        return {layer: list(heads) for layer in range(adapter.num_layers(model))}
    kept = {int(layer): sorted(int(h) for h in heads) for layer, heads in stored.items()}
    _check_widths(adapter, model, kept)
    return kept


def _check_widths(adapter: Adapter, model: nn.Module, kept: HeadMap) -> None:
    """Refuse a model whose attention widths disagree with its recorded head map (a pruned save loaded by plain
    `from_pretrained(..., ignore_mismatched_sizes=True)`: full-width layers of random weights): positions read from
    the map would cut or zero the wrong heads."""
    head_dim, layers = adapter.head_dim(model), adapter.layers(model)
    for layer, heads in kept.items():
        width = adapter.block(layers[layer]).output.in_features // head_dim
        if width != max(len(heads), 1):  # an emptied layer keeps one all-zero placeholder head
            raise ValueError(
                f"layer {layer} of this {type(model).__name__} has {width} heads, and its config records "
                f"{len(heads)} kept ({KEPT_HEADS_KEY}): its weights do not match its pruning record. Load a pruned "
                "save with hydra_ensembles.load_model, not from_pretrained(..., ignore_mismatched_sizes=True). "
                + SHARED_CONFIG
            )


def prune_heads(model: nn.Module, heads_to_prune: Mapping[int, Iterable[int]]) -> nn.Module:
    """Structurally remove heads, in place. Returns `model`.

    Args:
        model: a supported HF model (see `hydra_ensembles.supported_models()`), pruned or not.
        heads_to_prune: `{layer: [head, ...]}` in the original numbering (the numbering of the unpruned model,
            also after earlier pruning).
    """
    adapter = get_adapter(model)
    _check_one_key_per_query(adapter, model)
    kept = kept_heads(model)
    plan = check_heads(model, heads_to_prune, kept, what="prune")
    layers = adapter.layers(model)
    for layer in plan:  # refused before any layer is cut
        block = adapter.block(layers[layer])
        check_plain_linears(
            [block.query, block.key, block.value, block.output, *adapter.head_row_linears(layers[layer]).values()]
        )
    record_fingerprint(model)
    try:
        for layer, heads in plan.items():
            remaining = [h for h in kept[layer] if h not in heads]
            positions = [kept[layer].index(h) for h in remaining]
            _rebuild_attention(adapter, model, layers[layer], positions, remaining)
            kept[layer] = remaining
    finally:  # a layer that failed midway (out of memory) leaves the record true to the rest
        write_structure(model, KEPT_HEADS_KEY, {str(layer): heads for layer, heads in kept.items()})
    return model


def _check_one_key_per_query(adapter: Adapter, model: nn.Module) -> None:
    """Refuse grouped-query attention (fewer key/value heads than query heads; none of the supported families has
    it, an adapter added for one would): cutting a query head's rows out of the key and value projections would
    cut another group's."""
    config, heads = adapter.config(model), adapter.num_heads(model)
    kv_heads = getattr(config, "num_key_value_heads", None)
    if kv_heads is not None and kv_heads != heads:
        raise ValueError(
            f"this {type(model).__name__} has grouped-query attention ({kv_heads} key/value heads for {heads} query "
            "heads): head pruning here removes each head's own query, key and value rows, so it supports "
            "multi-head attention only."
        )


def keep_heads(model: nn.Module, head_map: Mapping[int, Iterable[int]]) -> nn.Module:
    """Prune, in place, every head that `head_map` does not keep. Layers missing from `head_map` keep all heads."""
    return prune_heads(model, complement(kept_heads(model), head_map, "head"))


def complement(kept: dict[int, list[int]], keep: Mapping[int, Iterable[int]], what: str) -> dict[int, list[int]]:
    """What to prune so that only `keep` remains ({layer: [index, ...]}, original numbering; a layer missing
    from `keep` keeps all): the map of heads or neurons `kept` minus `keep`, checked against it."""
    wanted = {layer: index_set(indices, what, layer) for layer, indices in layer_keys(keep, f"the {what} map").items()}
    outside = sorted(set(wanted) - set(kept))
    if outside:
        raise ValueError(f"{what} map names layer(s) {outside}, out of range: the model has layers 0..{len(kept) - 1}.")
    unknown = {layer: sorted(indices - set(kept[layer])) for layer, indices in wanted.items()}
    unknown = {layer: indices for layer, indices in unknown.items() if indices}
    if unknown:
        raise ValueError(f"{what} map keeps {what}s the model no longer has (or that do not exist): {unknown}.")
    plan = {layer: [i for i in kept[layer] if i not in wanted[layer]] for layer in wanted}
    return {layer: indices for layer, indices in plan.items() if indices}


def index_set(indices: Iterable[int], what: str, layer: int) -> set[int]:
    """A layer's head or neuron ids as a set of ints, refusing what `int()` would read as other ids: floats (1.9
    as 1), bools, a string ('13' as 1 and 3) or a bare number. Integer numpy scalars and 0-d tensors are ids."""
    if isinstance(indices, (str, bytes)) or not isinstance(indices, Iterable):
        raise TypeError(
            f"layer {layer}'s {what}s must be a list of {what} ids ({{layer: [{what}, ...]}}), got {indices!r}."
        )
    return {whole_number(index, f"layer {layer}'s {what} ids", indices) for index in indices}


def whole_number(value: Any, what: str, given: Any = None) -> int:
    """`value` as an int, refusing what `int()` would turn into another number: a float (1.9 as 1), a bool, a
    string. Integer numpy scalars and 0-d integer tensors are whole numbers. `what` names it in the error (and
    `given`, what it came in)."""
    try:
        if isinstance(value, bool) or getattr(value, "dtype", None) == torch.bool:  # a mask is no list of ids
            raise TypeError
        return operator.index(value)
    except TypeError:
        within = "" if given is None else f" in {given!r}"
        raise TypeError(f"{what} must be integers, got {value!r}{within}.") from None


def layer_keys(mapping: Mapping[Any, Any], what: str) -> dict[int, Any]:
    """`mapping` {layer: ...} with int layers: whole numbers, or their digits as strings (JSON's keys). Two keys
    of one layer (0 and "0") are refused: one would silently replace the other."""
    layers: dict[int, Any] = {}
    for key, value in mapping.items():
        digits = isinstance(key, str) and key.strip().isascii() and key.strip().isdigit()  # not "²": int() refuses
        layer = int(key) if digits else whole_number(key, f"the layers of {what}")
        if layer in layers:
            raise ValueError(f"{what} names layer {layer} twice (as {key!r} and another key): give each layer once.")
        layers[layer] = value
    return layers


def check_heads(model: nn.Module, heads: Mapping[int, Iterable[int]], kept: HeadMap, what: str) -> dict[int, set[int]]:
    """Validate `{layer: [head, ...]}` against the model and return it with int keys and set values."""
    if not isinstance(heads, Mapping):
        raise TypeError(f"heads to {what} must be a dict {{layer: [head, ...]}}, got {type(heads).__name__}.")
    adapter = get_adapter(model)
    num_layers, num_heads = adapter.num_layers(model), adapter.num_heads(model)
    plan: dict[int, set[int]] = {}
    for layer, layer_heads in layer_keys(heads, f"the heads to {what}").items():
        if not 0 <= layer < num_layers:
            raise ValueError(f"layer {layer} is out of range: the model has layers 0..{num_layers - 1}.")
        layer_heads = index_set(layer_heads, "head", layer)
        bad = sorted(h for h in layer_heads if not 0 <= h < num_heads)
        if bad:
            raise ValueError(f"head(s) {bad} of layer {layer} are out of range: layers have heads 0..{num_heads - 1}.")
        gone = sorted(layer_heads - set(kept[layer]))
        if gone:
            raise ValueError(
                f"head(s) {gone} of layer {layer} are already pruned (kept: {kept[layer]}); "
                "head indices are always in the original numbering."
            )
        if layer_heads:
            plan[layer] = layer_heads
    return plan


@contextmanager
def ablate_heads(model: nn.Module, heads: Mapping[int, Iterable[int]]) -> Iterator[nn.Module]:
    """Turn heads off inside the block by zeroing their column blocks of W_o; restore them on exit.

    Non-structural (§D.1.2): tensor shapes and FLOPs are unchanged. `heads` is `{layer: [head, ...]}` in the
    original numbering and may empty a layer.
    """
    adapter = get_adapter(model)
    kept = kept_heads(model)
    plan = check_heads(model, heads, kept, what="ablate")
    head_dim = adapter.head_dim(model)
    layers = adapter.layers(model)
    check_plain_linears([adapter.block(layers[layer]).output for layer in plan])  # a wrapper would add the head back
    columns = []
    for layer, layer_heads in plan.items():
        weight = adapter.block(layers[layer]).output.weight  # (d, H*dh)
        for head in layer_heads:
            position = kept[layer].index(head)
            columns.append((weight, slice(position * head_dim, (position + 1) * head_dim)))
    with zeroed_columns(columns):
        yield model


@contextmanager
def zeroed_columns(columns: Iterable[tuple[torch.Tensor, slice | torch.Tensor]]) -> Iterator[None]:
    """Zero the given columns of weight matrices in place, and restore them on exit (also after an error):
    the reversible ablation of heads (W_o column blocks) and of MLP neurons (columns of the second linear)."""
    saved = []
    with torch.no_grad():
        for weight, cols in columns:
            saved.append((weight, cols, weight[:, cols].clone()))
            weight[:, cols] = 0
    try:
        yield
    finally:
        with torch.no_grad():
            for weight, cols, block in saved:
                weight[:, cols] = block


def per_layer(value: int | Sequence[int], num_layers: int, name: str) -> list[int]:
    """A per-layer count of heads (`budget`, `pool`, ...): one int for every layer, or one per layer."""
    if isinstance(value, (str, bytes)) or not (is_one_count(value) or isinstance(value, Iterable)):
        raise TypeError(f"{name} must be an int >= 0 or {num_layers} of them (one per layer), got {value!r}.")
    one = is_one_count(value)
    values = [whole_number(v, name, value) for v in ([value] * num_layers if one else value)]
    if len(values) != num_layers or any(v < 0 for v in values):
        raise ValueError(f"{name} must be an int >= 0 or {num_layers} of them (one per layer), got {value!r}.")
    return values


def is_one_count(value: Any) -> bool:
    """Whether `value` is one number for every layer (a Python or numpy number, a 0-d tensor or array), not one
    per layer."""
    return isinstance(value, numbers.Number) or getattr(value, "ndim", None) == 0


def head_counts(model: nn.Module) -> list[int]:
    """Number of kept heads in each layer."""
    return [len(heads) for heads in kept_heads(model).values()]


def _rebuild_attention(
    adapter: Adapter, model: nn.Module, layer: nn.Module, positions: list[int], kept: list[int]
) -> None:
    """Keep only the heads at `positions` (indices into the layer's current heads; `kept`: their original ids)."""
    head_dim = adapter.head_dim(model)
    block = adapter.block(layer)
    placeholder = not positions
    rows = torch.cat([torch.arange(p * head_dim, (p + 1) * head_dim) for p in positions or [0]])  # (H'*dh,)
    if block.fused_qkv:  # one Linear, rows [q | k | v]: keep the heads' rows in each of the three blocks
        width = block.query.out_features // 3
        query = key = value = slice_linear(block.query, torch.cat([rows + j * width for j in range(3)]), dim=0)
    else:
        query, key, value = (slice_linear(linear, rows, dim=0) for linear in (block.query, block.key, block.value))
    output = slice_linear(block.output, rows, dim=1)
    extras = {path: slice_linear(linear, rows, dim=0) for path, linear in adapter.head_row_linears(layer).items()}
    if placeholder:
        with torch.no_grad():
            for linear in (query, key, value, *extras.values()):
                linear.weight.zero_()
                if linear.bias is not None:
                    linear.bias.zero_()
            output.weight.zero_()
    adapter.set_projections(layer, (query, key, value, output), num_heads=max(len(positions), 1), kept=kept)
    for path, linear in extras.items():  # per-head projections beyond q/k/v (DeBERTa's position projections)
        layer.set_submodule(path, linear)
    if placeholder:
        _freeze_placeholder(adapter, layer)


def _freeze_placeholder(adapter: Adapter, layer: nn.Module) -> None:
    """Fine-tuning must leave an emptied layer's all-zero placeholder head at zero (the fused engine drops it)."""
    block = adapter.block(layer)
    for linear in (block.query, block.key, block.value):
        linear.requires_grad_(False)
    block.output.weight.requires_grad_(False)  # its bias is the layer's own, not the head's
    for linear in adapter.head_row_linears(layer).values():
        linear.requires_grad_(False)


def freeze_placeholders(model: nn.Module) -> None:
    """Freeze the placeholder head of every emptied layer again: HF's loader hands back trainable parameters."""
    adapter = get_adapter(model)
    layers = adapter.layers(model)
    for layer, heads in kept_heads(model).items():
        if not heads:
            _freeze_placeholder(adapter, layers[layer])


def check_plain_linears(linears: Iterable[nn.Module]) -> None:
    """Refuse a wrapped projection (a peft LoRA layer, a quantised linear): it exposes its base layer's `weight`,
    so slicing, zeroing or fusing that would silently leave out what the wrapper adds."""
    wrapped = sorted({type(linear).__name__ for linear in linears if type(linear) is not nn.Linear})
    if wrapped:
        raise ValueError(
            f"the layers hold wrapped projections ({', '.join(wrapped)}), not plain nn.Linear: pruning, ablating "
            "and fusing read their `weight` alone and would leave out what the wrapper adds (a LoRA adapter's A "
            "and B). Merge them first (peft: model = model.merge_and_unload())."
        )


def slice_linear(linear: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A new `nn.Linear` keeping the entries `index` of `linear` along `dim` (0: output rows and their bias; 1: input
    columns), with its dtype, device and trainability. Built uninitialised (HF's `prune_linear_layer` initialises a
    float32 layer first, which draws from the global random stream and costs a float32 copy of the matrix)."""
    weight = linear.weight.detach()
    index = index.to(device=weight.device, dtype=torch.long)
    kept_weight = weight.index_select(dim, index)
    out_features, in_features = kept_weight.shape
    has_bias = linear.bias is not None
    sliced = skip_init(nn.Linear, in_features, out_features, bias=has_bias, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        sliced.weight.copy_(kept_weight)
        sliced.weight.requires_grad_(linear.weight.requires_grad)
        if has_bias:  # its own trainability: a bias-only fine-tuning freezes the weights alone
            bias = linear.bias.detach()
            sliced.bias.copy_(bias.index_select(0, index) if dim == 0 else bias)
            sliced.bias.requires_grad_(linear.bias.requires_grad)
    return sliced


register_structure(  # kept heads: recorded in config.json, replayed when the model is loaded
    KEPT_HEADS_KEY,
    lambda model, saved: keep_heads(model, {int(layer): heads for layer, heads in saved.items()}),
    loaded=freeze_placeholders,
    check=kept_heads,
)
