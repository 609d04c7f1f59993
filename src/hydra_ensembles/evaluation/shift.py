"""Shift curves: accuracy, NLL, ECE and uncertainty of any predictor as its test inputs degrade (docs/shift.md).

A shift is a deterministic, seeded corruption with severities 1..5 (severity 0 is the clean input):

- image shifts (after ImageNet-C, Hendrycks & Dietterich 2019, its parameters at 224 px) act on the
  `pixel_values` (B, C, H, W) the loaders hold, in pure torch. Pixel space: the tensor is un-normalised with the
  image processor's mean and std (`PixelSpace.of(processor)`) to x in [0, 1], corrupted, clipped to [0, 1] and
  normalised again; without a processor, `pixel_values` are taken to be [0, 1] images (`PixelSpace()`), and
  values beyond [-0.25, 1.25] (normalised pixels given without their processor) are refused.
- text shifts act on the raw strings before tokenisation (`TextData`: the texts and how to encode them).

Random draws are fixed per input and shared by the severities (common random numbers: one noise tensor scaled up,
one uniform draw per character or word compared with a growing rate), so a higher severity changes more:
the curve shows the effect of severity, not of a new sample. `shift_curve` runs the one inference loop
(`outputs.collect_member_logits`) and the report's metrics (`report.classification_metrics`).
"""

from __future__ import annotations

import math
import random
import string
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.files import text_batches
from ..data.loaders import Batch
from ..outputs import collect_member_logits, labels_of
from ..uncertainty import decompose
from .report import classification_metrics

SEVERITIES = (1, 2, 3, 4, 5)
Modality = Literal["image", "text"]


@dataclass(frozen=True)
class Shift:
    """One corruption: `apply(x, level, rng)` with `level` = `levels[severity - 1]` and `rng` seeded per batch
    (images: a torch.Generator) or per text (a random.Random); `parameter` says what the level is."""

    name: str
    modality: Modality
    levels: tuple[float, ...]
    parameter: str
    apply: Callable[..., Any]


# ---- images: x (B, C, H, W) in [0, 1] ----------------------------------------------------------------------------


def _gaussian_noise(x: Tensor, sigma: float, generator: torch.Generator) -> Tensor:
    return x + sigma * torch.randn(x.shape, generator=generator).to(x.device)


def _gaussian_blur(x: Tensor, sigma: float, generator: torch.Generator) -> Tensor:
    """Separable Gaussian filter of std `sigma` pixels, radius ceil(3 sigma), edges replicated."""
    radius = math.ceil(3 * sigma)
    offsets = torch.arange(-radius, radius + 1, dtype=x.dtype, device=x.device)
    kernel = torch.exp(-(offsets**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    channels = x.shape[1]
    padded = F.pad(x, (radius, radius, radius, radius), mode="replicate")  # (B, C, H + 2r, W + 2r)
    rows = F.conv2d(padded, kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1), groups=channels)  # (B, C, H + 2r, W)
    return F.conv2d(rows, kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1), groups=channels)  # (B, C, H, W)


def _contrast(x: Tensor, factor: float, generator: torch.Generator) -> Tensor:
    mean = x.mean(dim=(1, 2, 3), keepdim=True)  # (B, 1, 1, 1): each image's mean grey
    return (x - mean) * factor + mean


def _brightness(x: Tensor, amount: float, generator: torch.Generator) -> Tensor:
    """HSV value V = max_c x_c raised by `amount` (clipped at 1) with hue and saturation kept: x scales by V'/V."""
    value = x.amax(dim=1, keepdim=True)  # (B, 1, H, W)
    raised = (value + amount).clamp(max=1.0)
    return torch.where(value > 0, x * raised / value.clamp_min(1e-12), raised.expand_as(x))


def _pixelate(x: Tensor, scale: float, generator: torch.Generator) -> Tensor:
    """Area-average down to `scale` of the side, nearest-neighbour back up."""
    height, width = x.shape[-2:]
    small = F.interpolate(x, size=(max(1, int(height * scale)), max(1, int(width * scale))), mode="area")
    return F.interpolate(small, size=(height, width), mode="nearest")


# ---- text: one string, with one draw per character / word --------------------------------------------------------


def _char_typos(text: str, rate: float, rng: random.Random) -> str:
    """Each letter or digit, with probability `rate`: swapped with the next character, dropped, or preceded by a
    random lowercase letter (one of the three at equal odds)."""
    draws = [(rng.random(), rng.randrange(3), rng.choice(string.ascii_lowercase)) for _ in text]
    out, i = [], 0
    while i < len(text):
        u, kind, letter = draws[i]
        if u >= rate or not text[i].isalnum():
            out.append(text[i])
        elif kind == 0 and i + 1 < len(text):
            out += [text[i + 1], text[i]]
            i += 1
        elif kind == 2:
            out += [letter, text[i]]
        # kind 1 (or a swap at the end): the character is dropped
        i += 1
    return "".join(out)


def _word_dropout(text: str, rate: float, rng: random.Random) -> str:
    """Each word dropped with probability `rate`; the word of the highest draw is kept if all would go."""
    words = text.split()
    draws = [rng.random() for _ in words]
    kept = [w for w, u in zip(words, draws, strict=True) if u >= rate]
    return " ".join(kept) if kept or not words else words[max(range(len(words)), key=draws.__getitem__)]


def _word_swap(text: str, rate: float, rng: random.Random) -> str:
    """Left to right, each word swapped with the next with probability `rate` (a swapped pair is not swapped
    again)."""
    words = text.split()
    draws = [rng.random() for _ in words]
    i = 0
    while i < len(words) - 1:
        if draws[i] < rate:
            words[i], words[i + 1] = words[i + 1], words[i]
            i += 1
        i += 1
    return " ".join(words)


SHIFTS: dict[str, Shift] = {
    shift.name: shift
    for shift in (
        Shift("gaussian_noise", "image", (0.08, 0.12, 0.18, 0.26, 0.38), "noise std on [0, 1] pixels", _gaussian_noise),
        Shift("gaussian_blur", "image", (1.0, 2.0, 3.0, 4.0, 6.0), "blur std in pixels", _gaussian_blur),
        Shift("contrast", "image", (0.4, 0.3, 0.2, 0.1, 0.05), "contrast kept (x - mean scaled by it)", _contrast),
        Shift("brightness", "image", (0.1, 0.2, 0.3, 0.4, 0.5), "added to the HSV value", _brightness),
        Shift("pixelate", "image", (0.6, 0.5, 0.4, 0.3, 0.25), "side kept before upsampling", _pixelate),
        Shift("char_typos", "text", (0.02, 0.05, 0.1, 0.15, 0.2), "edit rate per letter or digit", _char_typos),
        Shift("word_dropout", "text", (0.05, 0.1, 0.2, 0.3, 0.4), "drop rate per word", _word_dropout),
        Shift("word_swap", "text", (0.05, 0.1, 0.2, 0.3, 0.4), "swap rate per word", _word_swap),
    )
}


def shifts_of(modality: Modality) -> list[str]:
    """The names of every shift of a modality ("image" or "text"), in registry order."""
    return [name for name, shift in SHIFTS.items() if shift.modality == modality]


def resolve_shifts(names: Sequence[str] | None, modality: Modality | None = None) -> list[str]:
    """`names` checked against the registry (and against `modality` when given); None or empty: every shift of
    `modality`."""
    if not names:
        if modality is None:
            raise ValueError("no shift named and no modality to choose them by: name shifts or give the modality.")
        return shifts_of(modality)
    unknown = [name for name in names if name not in SHIFTS]
    if unknown:
        raise ValueError(
            f"unknown shift(s) {unknown}; the known ones are image: {shifts_of('image')}, text: {shifts_of('text')}."
        )
    wrong = [name for name in names if modality is not None and SHIFTS[name].modality != modality]
    if wrong:
        raise ValueError(
            f"shift(s) {wrong} do not apply to {modality} data; the {modality} shifts are {shifts_of(modality)}."
        )
    return list(dict.fromkeys(names))


def check_severities(severities: Iterable[int], lowest: int = 1) -> list[int]:
    """Severities as sorted distinct ints, each in `lowest`..5 (0 is the clean input), or a ValueError."""
    severities = list(severities)
    bad = [s for s in severities if isinstance(s, bool) or not isinstance(s, int) or not lowest <= s <= SEVERITIES[-1]]
    if bad or not severities:
        raise ValueError(
            f"severities must be integers {lowest}..{SEVERITIES[-1]}, got {severities}"
            + (" (severity 0, the clean data, is always measured)." if lowest == 1 else ".")
        )
    return sorted(set(severities))


@dataclass(frozen=True)
class PixelSpace:
    """How `pixel_values` were normalised from [0, 1] images x: pixel_values = (x - mean) / std per channel (one
    value: every channel)."""

    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)

    @classmethod
    def of(cls, processor: Any) -> PixelSpace:
        """An HF image processor's normalisation (`image_mean`, `image_std` when `do_normalize`); none: [0, 1]."""
        if processor is None or not getattr(processor, "do_normalize", False):
            return cls()
        return cls(_floats(processor.image_mean), _floats(processor.image_std))

    def _stats(self, like: Tensor) -> tuple[Tensor, Tensor]:
        channels = like.shape[1]
        if len(self.mean) not in (1, channels) or len(self.std) not in (1, channels):
            raise ValueError(
                f"pixel_values have {channels} channels but the normalisation has mean {self.mean} and std "
                f"{self.std}: give one value, or one per channel."
            )
        shape = (1, -1, 1, 1)  # broadcast over (B, C, H, W)
        mean = torch.tensor(self.mean, dtype=like.dtype, device=like.device).view(shape)
        return mean, torch.tensor(self.std, dtype=like.dtype, device=like.device).view(shape)


def _floats(value: float | Sequence[float]) -> tuple[float, ...]:
    """A processor's image_mean / image_std as floats: one number, a list, or an array."""
    return tuple(float(x) for x in np.atleast_1d(np.asarray(value, dtype=np.float64)))


def shift_images(
    pixel_values: Tensor, name: str, severity: int, seed: int = 0, pixels: PixelSpace | None = None, index: int = 0
) -> Tensor:
    """One batch of `pixel_values` (B, C, H, W) shifted by image shift `name` at `severity` (0: returned as is),
    same shape and dtype. The noise is drawn from `seed`, the shift's name and the batch's `index` in its loader."""
    shift = SHIFTS[resolve_shifts([name], "image")[0]]
    severity = check_severities([severity], lowest=0)[0]
    if pixel_values.dim() != 4:
        raise ValueError(f"pixel_values must be (batch, channels, height, width), got {tuple(pixel_values.shape)}.")
    if severity == 0:
        return pixel_values
    mean, std = (pixels or PixelSpace())._stats(pixel_values)
    x = pixel_values.float() * std.float() + mean.float()
    low, high = x.min().item(), x.max().item()
    # normalised pixels (ImageNet's span about [-2.1, 2.6]) clamped to [0, 1] would be a shift of their own, at every
    # severity; a bicubic resize's ringing past [0, 1] is not
    if low < -0.25 or high > 1.25:
        raise ValueError(
            f"pixel_values lie in [{low:.3g}, {high:.3g}] once un-normalised, not in [0, 1]: pass the processor's "
            "normalisation, pixels=PixelSpace.of(processor)."
        )
    x = x.clamp(0.0, 1.0)  # [0, 1] images
    generator = torch.Generator().manual_seed(_seed(name, seed, index))  # the same draws at every severity
    shifted = shift.apply(x, shift.levels[severity - 1], generator).clamp(0.0, 1.0)
    return ((shifted - mean.float()) / std.float()).to(pixel_values.dtype)


def shift_texts(texts: Sequence[str], name: str, severity: int, seed: int = 0) -> list[str]:
    """Raw strings shifted by text shift `name` at `severity` (0: unchanged); text i's draws come from `seed`, the
    shift's name and i alone."""
    shift = SHIFTS[resolve_shifts([name], "text")[0]]
    severity = check_severities([severity], lowest=0)[0]
    if severity == 0:
        return list(texts)
    level = shift.levels[severity - 1]
    return [shift.apply(text, level, random.Random(_seed(name, seed, i))) for i, text in enumerate(texts)]


def _seed(name: str, seed: int, index: int) -> int:
    """A stable integer seed per (shift, seed, item): Python's hash of a str changes between processes."""
    return zlib.crc32(f"{name}:{seed}:{index}".encode())


@dataclass
class TextData:
    """Labelled text for shift curves: the raw `texts` and `encode(texts)` -> labelled batches in their order (the
    tokenizer call of the loader; `text_data` builds one)."""

    texts: list[str]
    encode: Callable[[list[str]], list[Batch]]


def text_data(
    tokenizer: Any,
    texts: Sequence[str],
    labels: Sequence[int],
    batch_size: int = 16,
    max_length: int = 128,
    config: Any = None,
) -> TextData:
    """`TextData` encoded as `data.files.text_batches` encodes a text file (cut at the positions of the model
    whose `config` is given, too)."""
    encode = partial(
        text_batches, tokenizer, labels=list(labels), batch_size=batch_size, max_length=max_length, config=config
    )
    return TextData(list(texts), encode)


def shifted_loader(
    data: Iterable[Batch] | TextData, name: str, severity: int, seed: int = 0, pixels: PixelSpace | None = None
) -> list[Batch]:
    """The labelled batches of `data` under shift `name` at `severity`: image batches with their `pixel_values`
    shifted (the other entries kept), or `TextData` encoded from its shifted texts."""
    if isinstance(data, TextData):
        return data.encode(shift_texts(data.texts, name, severity, seed))
    return [
        {**batch, "pixel_values": shift_images(batch["pixel_values"], name, severity, seed, pixels, index)}
        for index, batch in enumerate(data)
    ]


def modality_of(data: Iterable[Batch] | TextData) -> Modality:
    """ "text" for `TextData`, "image" for batches with `pixel_values`; token batches are a ValueError (text shifts
    act on raw strings)."""
    if isinstance(data, TextData):
        return "text"
    first = next(iter(data), None)
    if isinstance(first, Mapping) and first.get("pixel_values") is not None:
        return "image"
    raise ValueError(
        "shift curves need image batches with 'pixel_values', or text as TextData(texts, encode): text shifts "
        "perturb the raw strings before tokenisation (`shift.text_data(tokenizer, texts, labels)`)."
    )


def shift_metrics(member_logits: Tensor, labels: Tensor) -> dict[str, float]:
    """`report.classification_metrics` (acc, nll, ece, mi, ...) and the mean predictive entropy `entropy`
    (nats). member_logits (N, M, C), labels (N,)."""
    total = decompose(member_logits.double())["total"]
    return classification_metrics(member_logits, labels) | {"entropy": total.mean().item()}


def shift_curve(
    predictor: nn.Module,
    data: Iterable[Batch] | TextData,
    shifts: Sequence[str] | None = None,
    severities: Iterable[int] = SEVERITIES,
    *,
    seed: int = 0,
    pixels: PixelSpace | None = None,
    progress: bool = False,
) -> dict[str, dict[int, dict[str, float]]]:
    """{shift: {severity: `shift_metrics`}} of a classifier on labelled data under each shift (default: every
    shift of the data's modality), severity 0 (the clean data, measured once) first.

    data: image batches (`pixels` says how they were normalised; None: [0, 1] images) or `TextData`.
    """
    data = data if isinstance(data, TextData) else list(data)
    names = resolve_shifts(shifts, modality_of(data))
    severities = check_severities(severities)
    clean = _measure(predictor, data.encode(data.texts) if isinstance(data, TextData) else data, progress)
    curve = {}
    for name in names:
        curve[name] = {0: clean}
        for severity in severities:
            curve[name][severity] = _measure(predictor, shifted_loader(data, name, severity, seed, pixels), progress)
    return curve


def _measure(predictor: nn.Module, batches: list[Batch], progress: bool) -> dict[str, float]:
    return shift_metrics(collect_member_logits(predictor, batches, progress), labels_of(batches))


def mean_over_shifts(curve: Mapping[str, Mapping[int, Mapping[str, float]]]) -> dict[int, dict[str, float]]:
    """{severity: each metric averaged over the shifts} of one `shift_curve`."""
    severities = sorted({s for points in curve.values() for s in points})
    return {
        severity: {
            metric: sum(points[severity][metric] for points in curve.values()) / len(curve)
            for metric in next(iter(curve.values()))[severity]
        }
        for severity in severities
    }


# what the table and the plots show of each metric: a title, a scale (fractions in %) and the decimals in the table
CURVE_METRICS = {
    "acc": ("Accuracy (%)", 100.0, 2),
    "nll": ("NLL (nats)", 1.0, 3),
    "ece": ("ECE (%)", 100.0, 2),
    "entropy": ("Mean predictive entropy (nats)", 1.0, 3),
    "mi": ("Mean mutual information (nats)", 1.0, 4),
}


def curve_lines(curves: Mapping[str, Mapping[str, Mapping[int, Mapping[str, float]]]]) -> list[str]:
    """Markdown: a table per metric of `CURVE_METRICS`, a column per severity (0 = clean) and a row per model and
    shift, each model's mean over the shifts first. curves: {model: `shift_curve`}."""
    severities = sorted(next(iter(next(iter(curves.values())).values())))
    lines = []
    for metric, (title, scale, digits) in CURVE_METRICS.items():
        lines += [f"## {title}", "", "| model | shift | " + " | ".join(map(str, severities)) + " |"]
        lines.append("|---|---|" + "---:|" * len(severities))
        for model, curve in curves.items():
            for name, points in {"mean": mean_over_shifts(curve), **curve}.items():
                values = " | ".join(f"{scale * points[s][metric]:.{digits}f}" for s in severities)
                lines.append(f"| {model} | {name} | {values} |")
        lines.append("")
    return lines


def curve_record(curves: Mapping[str, Mapping[str, Mapping[int, Mapping[str, float]]]], seed: int) -> dict:
    """shift.json: {"seed", "severities", "models": {model: {"shifts": `shift_curve`, "mean": `mean_over_shifts`}}}."""
    first = next(iter(curves.values()))
    return {
        "seed": seed,
        "severities": sorted(next(iter(first.values()))),
        "models": {model: {"shifts": curve, "mean": mean_over_shifts(curve)} for model, curve in curves.items()},
    }
