"""What every `hydra-ens` command shares: the flags that name models and data, and what a command says of a
model it does not take. The output directory each step records is `step.py`."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from torch import nn

from ..adapters import UnsupportedModelError
from ..data.files import Encoded, read_encoded, text_lines, token_limit
from ..fusion import lay_out_for_device
from ..inference import PRECISION_CONTEXTS, prepare
from ..predictors import check_supported, describe_saved, load_classifier, load_preprocessor, saved_kind
from ..predictors.clip_zero_shot import DEFAULT_TEMPLATES, TwoTowerModel
from ..predictors.load import HFModel


class CommandError(Exception):
    """Bad input the user can fix: printed as one line, exit code 2."""


# ---- help ----


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every parser's formatter: the description and epilog as written, and "(default: X)" after the help of
    every option with a default, so that `--help` shows each default without help texts repeating them. Flags
    (store_true and the like) and options defaulting to None (their help says what None means) are left alone."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        if not has_default(action):
            return help_text
        shown = shown_default(action.default).replace("%", "%%")  # argparse %-formats help texts
        return f"{help_text} (default: {shown})".lstrip()


def has_default(action: argparse.Action) -> bool:
    """Whether `--help` shows `action`'s default: it takes a value and has one."""
    return action.nargs != 0 and action.default not in (None, argparse.SUPPRESS)


def shown_default(value: object) -> str:
    """A default as it would be typed: lists space-separated, floats short."""
    if isinstance(value, (list, tuple)):
        return " ".join(shlex.quote(shown_default(item)) for item in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


# ---- models ----


def check_one_model(
    path: Path, command: str, what: str = "--model", takes: str = "one model", two_tower: bool = False
) -> None:
    """Refuse an ensemble or wrapper where `command` takes one model, a two-tower model unless `two_tower` (the
    commands that take one: circuit, members), and an architecture without an adapter, saying what it was given."""
    kind = saved_kind(path)
    if kind == TwoTowerModel.kind and not two_tower:
        raise CommandError(
            f"{command} takes a classifier with its own classes; {what} {str(path)!r} is {describe_saved(path)}: "
            "two-tower models classify zero-shot, which hydra-ens circuit and members take (with --classes)."
        )
    if kind not in (HFModel.kind, TwoTowerModel.kind):
        raise CommandError(
            f"{command} takes {takes}; {what} {str(path)!r} is {describe_saved(path)}: give one model (a Hugging "
            "Face checkpoint, such as the model hydra-ens finetune writes, or the one the ensemble was built from)."
        )
    try:
        if kind == HFModel.kind:
            check_supported(path)
    except UnsupportedModelError as error:
        raise CommandError(f"{what} {error}") from None


def classifier_at(path: Path, what: str = "--model", zero_shot: ZeroShot | None = None) -> nn.Module:
    """`predictors.load_classifier` with the --classes / --templates, its refusals naming the flag."""
    classes, templates = (zero_shot.classes, zero_shot.templates) if zero_shot else (None, None)
    try:
        return load_classifier(path, classes, templates)
    except ValueError as error:
        raise CommandError(f"{what} {error}") from None


@dataclass
class ZeroShot:
    """The --classes and --templates of a zero-shot command (None: not given)."""

    classes: list[str] | None
    templates: list[str] | None


def add_zero_shot_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("zero-shot (two-tower / CLIP-style models)")
    group.add_argument(
        "--classes",
        help="classify zero-shot with these class names: comma-separated, or a .txt file with one per line",
    )
    group.add_argument(
        "--templates",
        help="prompt templates with {} for the class name: '|'-separated, or a .txt file with one per line "
        f"(default: {DEFAULT_TEMPLATES[0]!r})",
    )


def zero_shot_options(args: argparse.Namespace) -> ZeroShot:
    """The parsed --classes / --templates."""

    def parse(value: str | None, separator: str) -> list[str] | None:
        if value is None:
            return None
        if value.endswith(".txt"):
            items = text_lines(value)
        elif Path(value).is_file():
            raise CommandError(f"{value!r} is a file: give the entries in a .txt file, one per line.")
        else:
            items = value.split(separator)
        items = [item.strip() for item in items if item.strip()]
        if not items:
            raise CommandError(f"{value!r} names nothing: give at least one entry.")
        return items

    zero_shot = ZeroShot(parse(getattr(args, "classes", None), ","), parse(getattr(args, "templates", None), "|"))
    if zero_shot.templates and any("{}" not in t for t in zero_shot.templates):
        raise CommandError(f"every --templates entry needs '{{}}' where the class name goes: {zero_shot.templates}.")
    if zero_shot.templates and not zero_shot.classes:
        raise CommandError("--templates needs --classes (the class names to put in them).")
    return zero_shot


# ---- device ----


def _auto() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _cuda() -> torch.device:
    if not torch.cuda.is_available():
        raise CommandError(
            "--device cuda: no CUDA GPU is available here (torch.cuda.is_available() is False); pass --device cpu, "
            "or --device auto to use a GPU only when there is one."
        )
    return torch.device("cuda")


DEVICES = {"auto": _auto, "cpu": lambda: torch.device("cpu"), "cuda": _cuda}


def add_device_argument(parser: argparse.ArgumentParser, applies_to: str = "") -> None:
    parser.add_argument(
        "--device",
        choices=sorted(DEVICES),
        default="auto",
        help="where the models run: auto = a CUDA GPU when one is available, else the CPU"
        + (f"; applies to {applies_to}" if applies_to else ""),
    )


def add_inference_options(parser: argparse.ArgumentParser) -> None:
    """--precision and --compile of the commands that only run models forward (predict, evaluate)."""
    parser.add_argument(
        "--precision",
        choices=list(PRECISION_CONTEXTS),
        default="fp32",
        help="bf16: the forward passes under bfloat16 autocast (faster on GPUs and on CPUs with AMX or "
        "AVX512-BF16; probabilities differ from fp32 by about 1e-2); metrics are computed in float64 either way",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="run the model compiled by torch.compile (dynamic shapes): the same outputs up to float rounding, "
        "after a compilation of seconds to minutes that pays off over many batches (docs/performance.md)",
    )


def prepared(model: nn.Module, args: argparse.Namespace) -> nn.Module:
    """The model as --precision and --compile run it (`hydra_ensembles.inference.prepare`); on its device."""
    return prepare(model, args.precision, args.compile)


def on_device(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` moved to `device`, a fused ensemble in it laid out for that device (`fusion.lay_out_for_device`:
    loaded on the CPU, its uneven layers are ragged; on a GPU padded is faster)."""
    return lay_out_for_device(model.to(device))


def resolve_device(name: str) -> torch.device:
    """The torch device a --device value names; "cuda" without a GPU is refused, naming --device cpu. Models are
    moved there by the command; every library loop moves its batches to the model's device."""
    if name not in DEVICES:
        raise CommandError(f"--device {name!r} is not a device; choose one of {sorted(DEVICES)}.")
    return DEVICES[name]()


# ---- durations ----


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}


def duration_seconds(text: str, flag: str) -> float:
    """Seconds of a duration given with its unit: "90s", "30m", "1.5h". A bare number is refused: minutes or
    seconds would be a guess (the library's time budgets are seconds)."""
    match = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)([smh])", text.strip())
    if match is None:
        raise CommandError(f"{flag} needs a unit: 30m, 2h or 90s (got {text!r}).")
    seconds = float(match[1]) * DURATION_UNITS[match[2]]
    if seconds <= 0:
        raise CommandError(f"{flag} must be more than no time: give e.g. 30m, 2h or 90s (got {text!r}).")
    return seconds


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `low`, refused while parsing (before any model loads)."""

    def whole_number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {low}, got {value}")
        return value

    return whole_number


# ---- data ----


DATA_OPTIONS = ("text_column", "label_column", "max_length", "batch_size")
LABEL_COLUMN = "label"  # --label-column's default: a file without it reads as unlabelled where labels are optional


def add_data_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data files")
    group.add_argument("--text-column", default="text", help="column holding the text in CSV / JSONL")
    group.add_argument("--label-column", default=LABEL_COLUMN, help="column holding the label")
    group.add_argument("--max-length", type=at_least(1), default=128, help="tokens per text")
    group.add_argument("--batch-size", type=at_least(1), default=16, help="examples per batch")


def data_settings(args: argparse.Namespace) -> dict:
    """The data flags, for an output's settings: changing one redoes the step."""
    return {k: getattr(args, k) for k in DATA_OPTIONS}


def read_data(
    args: argparse.Namespace,
    source: str | os.PathLike,
    model_dir: Path,
    config: transformers.PretrainedConfig,
    *,
    labelled: bool | None,
    flag: str,
) -> Encoded:
    """Read `source` and encode it with `model_dir`'s preprocessor; labels map through the model's class names
    (`data.files.class_ids`).

    labelled: True requires labels, False ignores them, None takes them when the source has them (a label column
    named on the command line must then be there: a misspelt one would silently mean "no labels").
    """
    if labelled is None and args.label_column != LABEL_COLUMN and Path(source).is_file():
        labelled = True
    kind, preprocessor = load_preprocessor(model_dir)
    encoded = read_encoded(source, kind, preprocessor, config, labelled=labelled, flag=flag, **data_settings(args))
    if encoded.cut:  # said, not refused: the model reads each cut text's beginning
        limit = token_limit(preprocessor, args.max_length, config)
        most = token_limit(preprocessor, sys.maxsize, config)  # the model's own limit
        more = "raise --max-length to keep more" if limit < most else "the most the model takes"
        print(  # stderr: predict writes its JSON lines or table to stdout
            f"{flag} {str(source)!r}: {encoded.cut} of {len(encoded.examples.inputs)} texts are longer than {limit} "
            f"tokens and were cut there ({more})",
            file=sys.stderr,
        )
    return encoded


def named_sources(values: list[str] | None, flag: str) -> dict[str, str]:
    """["name=path", "path"] -> {name: path}; a bare path is named after its file (less its suffix) or folder. A
    value that is an existing path, or whose part before "=" holds a path separator, is a bare path."""
    sources: dict[str, str] = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep or Path(value).exists() or "/" in name or os.sep in name:  # runs/lr=3e-4/hydra is a path
            name, path = (Path(value).name if Path(value).is_dir() else Path(value).stem), value
        if not name or not path:
            raise CommandError(f"{flag} {value!r}: give PATH or NAME=PATH.")
        if name in sources:
            raise CommandError(f"{flag}: the name {name!r} is given twice; name them NAME=PATH.")
        sources[name] = path
    return sources
