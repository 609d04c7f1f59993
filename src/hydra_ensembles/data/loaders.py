"""Batches in, batches checked: what every step that reads a data loader has in common.

A loader is any iterable of dict batches, e.g. a `torch.utils.data.DataLoader` over tokenizer or image-processor
outputs: text batches carry `input_ids` (B, T) and usually `attention_mask` (B, T); image batches carry
`pixel_values` (B, C, H, W); labelled batches add `labels` (B,).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:  # the batch contract sits below the adapters: it only reads their input names
    from ..adapters import Adapter


Batch = Mapping[str, Any]

_TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
# What a batch may carry besides the model's inputs: what training losses read, never fed to the model.
# labels (B,): classes; teacher_outputs (B, M, C): a teacher's member logits on this batch; teacher_gaussians
# (B, M, 2): a regressor teacher's member (mean, log-variance), under its own name so that neither kind of student
# learns the other's; image_embeds (B, P): the paired images' embeddings, for training a text tower contrastively.
TARGETS = ("labels", "teacher_outputs", "teacher_gaussians", "image_embeds")


def materialize(loader: Iterable[Batch], name: str) -> list[Batch]:
    """Read every batch of `loader` once, so that repeated evaluations see identical data in identical order."""
    if loader is None:
        raise ValueError(f"{name} is None: pass an iterable of dict batches (for example a DataLoader).")
    batches = list(loader)
    if not batches:
        raise ValueError(f"{name} is empty: it yielded no batches. Pass a loader over at least one example.")
    for batch in batches:
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"{name} must yield dict batches (e.g. {{'input_ids': ..., 'attention_mask': ..., 'labels': ...}}), "
                f"got {type(batch).__name__}."
            )
    return batches


def split_batch(adapter: Adapter | None, batch: Batch) -> tuple[dict[str, Any], Tensor | None]:
    """Separate model inputs from labels (and the other `TARGETS`) and check them against what the model family
    accepts. adapter=None (a plain module, e.g. an MLP): every entry but the targets is an input."""
    if adapter is None:
        return {key: value for key, value in batch.items() if key not in TARGETS}, batch.get("labels")
    unknown = sorted(set(batch) - set(adapter.input_names) - set(TARGETS))
    if unknown:
        raise ValueError(
            f"unexpected input(s) {unknown} for a {adapter.name} model; it accepts {list(adapter.input_names)} "
            f"and {' / '.join(repr(t) for t in TARGETS)}. Drop the extra keys from the batch."
        )
    missing = [key for key in adapter.required_inputs if batch.get(key) is None]
    if missing:
        raise ValueError(f"missing input(s) {missing} for a {adapter.name} model; got keys {sorted(batch)}.")
    inputs = {key: value for key, value in batch.items() if key not in TARGETS and value is not None}
    check_shapes(inputs)
    return inputs, batch.get("labels")


def check_shapes(inputs: Mapping[str, Any]) -> None:
    """Token inputs must be (B, T) and agree with each other; pixel_values must be (B, C, H, W)."""
    for key in _TOKEN_INPUTS:
        value = inputs.get(key)
        if value is not None and (not isinstance(value, Tensor) or value.dim() != 2):
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"{key} must be a (batch, seq_len) tensor, got {shape}. Batch your sequences.")
    shapes = {key: tuple(inputs[key].shape) for key in _TOKEN_INPUTS if inputs.get(key) is not None}
    # compared, not hashed into a set: hashing would fix the shapes for torch.compile (one graph per shape)
    if any(shape != next(iter(shapes.values())) for shape in shapes.values()):
        raise ValueError(f"token inputs disagree in shape: {shapes}. Pad them to one (batch, seq_len).")
    pixels = inputs.get("pixel_values")
    if pixels is not None and (not isinstance(pixels, Tensor) or pixels.dim() != 4):
        shape = tuple(pixels.shape) if isinstance(pixels, Tensor) else type(pixels).__name__
        raise ValueError(f"pixel_values must be a (batch, channels, height, width) tensor, got {shape}.")


def to_device(inputs: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """A batch with its tensors moved to `device` (other entries as they are)."""
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in inputs.items()}


def per_example(value: Any) -> bool:
    """Whether a batch value holds a row per example: a tensor of at least one dimension. A non-tensor or a 0-d
    tensor (a setting such as ViT's `interpolate_pos_encoding`) goes to the model whole, in every piece of a batch."""
    return isinstance(value, Tensor) and value.dim() > 0


def batch_size(inputs: Mapping[str, Any]) -> int:
    return next(v.shape[0] for v in inputs.values() if per_example(v))


def rebatch(batches: list[Batch], size: int) -> list[dict[str, Any]]:
    """Concatenate batches of model inputs (`TARGETS` dropped) and cut them into batches of `size` examples.

    Token inputs of different lengths are right-padded to the longest (input ids, token types and positions with
    0, the attention mask with 0, so padding is never attended to; batches without a mask get one, of ones where
    their tokens are). Other inputs must agree in shape.
    """
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}.")
    inputs = [{k: v for k, v in batch.items() if k not in TARGETS and v is not None} for batch in batches]
    keys = set(inputs[0])
    if any(set(x) != keys for x in inputs):
        raise ValueError(f"batches carry different inputs: {sorted({tuple(sorted(x)) for x in inputs})}.")
    tokens = next((key for key in ("input_ids", "inputs_embeds") if key in keys), None)
    if tokens is not None and "attention_mask" not in keys and len({x[tokens].shape[1] for x in inputs}) > 1:
        # padding would be attended to without a mask: every batch's own tokens are real ones
        inputs = [x | {"attention_mask": torch.ones(x[tokens].shape[:2], dtype=torch.long)} for x in inputs]
        keys.add("attention_mask")
    merged: dict[str, Any] = {}
    for key in keys:
        values = [x[key] for x in inputs]
        if not per_example(values[0]):
            merged[key] = values[0]
            continue
        if key in _TOKEN_INPUTS:
            length = max(v.shape[1] for v in values)
            values = [torch.nn.functional.pad(v, (0, length - v.shape[1])) for v in values]
        elif len({tuple(v.shape[1:]) for v in values}) > 1:
            raise ValueError(f"{key} differs in shape between batches: {sorted({tuple(v.shape) for v in values})}.")
        merged[key] = torch.cat(values)
    total = batch_size(merged)
    return [
        {k: v[start : start + size] if per_example(v) else v for k, v in merged.items()}
        for start in range(0, total, size)
    ]
