"""What every `hydra-ens` command shares: loading models and their preprocessors, reading data flags, and the
output directory that records a finished step (so a rerun of the same command is a no-op, and an interrupted
one resumes)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

from .. import predictors
from ..adapters import UnsupportedModelError, adapter_for_class, get_adapter
from ..data.files import Examples, image_batches, label_ids, read_examples, text_batches
from ..fusion import HydraEnsemble
from ..fusion.ensemble import CONFIG_NAME as HYDRA_CONFIG
from ..io import PREDICTOR_FILE, write_json_atomic
from ..predictors.clip_zero_shot import DEFAULT_TEMPLATES, TWO_TOWER_FILE, TwoTowerModel, ZeroShotEnsemble
from ..version import __version__

RECORD = "hydra-ens.json"  # in every output directory: the command, its settings, and what it produced
PREPROCESSOR_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "preprocessor_config.json",
    "processor_config.json",
)


class CommandError(Exception):
    """Bad input the user can fix: printed as one line, exit code 2."""


# ---- models ----


def check_model_dir(path: str | os.PathLike, what: str = "--model") -> Path:
    """The model directory at `path`; the output directory of `finetune` or `fuse` stands for the model in it."""
    path = Path(path)
    if not path.exists():
        raise CommandError(f"{what} {str(path)!r} does not exist.")
    if not path.is_dir():
        raise CommandError(f"{what} {str(path)!r} is a file; give the model's directory.")
    inner = (
        json.loads((path / RECORD).read_text()).get("results", {}).get("model_dir")
        if (path / RECORD).is_file()
        else None
    )
    if inner:
        path = path / inner
    if not any((path / name).is_file() for name in ("config.json", HYDRA_CONFIG, PREDICTOR_FILE, TWO_TOWER_FILE)):
        raise CommandError(
            f"{what} {str(path)!r} is not a model directory: it has neither config.json (a Hugging Face "
            f"checkpoint), {HYDRA_CONFIG} (a saved Hydra Ensemble), {PREDICTOR_FILE} (a saved baseline) nor "
            f"{TWO_TOWER_FILE} (a two-tower model)."
        )
    return path


def check_supported(path: Path, what: str = "--model") -> None:
    """Refuse a checkpoint whose architecture has no adapter, from its config alone (before any other work)."""
    if not (path / "config.json").is_file():
        return  # a saved ensemble or wrapper: it was built from supported models
    config = transformers.AutoConfig.from_pretrained(path)
    named = [getattr(transformers, name, None) for name in getattr(config, "architectures", None) or []]
    classes = [cls for cls in named if cls is not None]
    if not classes:
        with torch.device("meta"):  # the base model's class, without allocating its weights
            classes = [type(transformers.AutoModel.from_config(config))]
    try:
        adapter_for_class(classes[0], config.model_type)
    except UnsupportedModelError as error:
        raise CommandError(f"{what} {str(path)!r}: {error}") from None


def is_ensemble(path: Path) -> bool:
    return (path / HYDRA_CONFIG).is_file()


def load_predictor(path: str | os.PathLike, what: str = "--model", zero_shot: ZeroShot | None = None) -> nn.Module:
    """Any saved predictor (`hydra_ensembles.predictors.load_predictor`) that classifies, in eval mode. A
    two-tower model (an HF CLIPModel or a saved `TwoTowerModel`) classifies zero-shot the `zero_shot` classes;
    a saved zero-shot ensemble its own classes, or those."""
    path = check_model_dir(path, what)
    if is_two_tower(path):
        if zero_shot is None or not zero_shot.classes:
            raise CommandError(
                f"{what} {str(path)!r} is a two-tower model: it classifies zero-shot, so name the classes with "
                "--classes 'cat,dog,car' (and optionally --templates 'a photo of a {}.|a drawing of a {}.')."
            )
        templates = zero_shot.templates or list(DEFAULT_TEMPLATES)
        two_tower = TwoTowerModel.from_pretrained(path)
        return predictors.zero_shot_ensemble(two_tower, zero_shot.classes, prompt_tokenizer(path), templates)
    model = predictors.load_predictor(path)
    inner = base_model(model)
    if isinstance(inner, ZeroShotEnsemble):
        if zero_shot is not None and zero_shot.classes:
            inner.set_classes(zero_shot.classes, zero_shot.templates or inner.templates, prompt_tokenizer(path))
    elif isinstance(inner, HydraEnsemble):
        if not inner.is_classifier:
            raise CommandError(f"{what} {str(path)!r} is an ensemble of encoders without a classifier.")
    elif not get_adapter(inner).is_classifier(inner):
        raise CommandError(
            f"{what} {str(path)!r} is a {type(inner).__name__}, which has no classifier; fine-tune it first "
            "(hydra-ens finetune gives it a classification head from your labelled data)."
        )
    elif zero_shot is not None and zero_shot.classes:
        raise CommandError(f"--classes applies to two-tower models; {what} {str(path)!r} is a classifier.")
    return model


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
        items = Path(value).read_text().splitlines() if value.endswith(".txt") else value.split(separator)
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


def is_two_tower(path: Path) -> bool:
    """A saved `TwoTowerModel`, or an HF CLIPModel checkpoint."""
    if (path / TWO_TOWER_FILE).is_file():
        return True
    if not (path / "config.json").is_file():
        return False
    config = json.loads((path / "config.json").read_text())
    return config.get("model_type") == "clip" and "CLIPModel" in config.get("architectures", ["CLIPModel"])


def prompt_tokenizer(path: Path):
    """The text tower's tokenizer: in the model directory, or in its text/ sub-directory."""
    for where in (path, path / "text"):
        if any((where / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
            return transformers.AutoTokenizer.from_pretrained(where)
    raise CommandError(f"{str(path)!r} has no tokenizer files (for the class prompts); save the tokenizer there.")


def base_model(model: nn.Module) -> nn.Module:
    """The HF model or Hydra Ensemble inside a wrapper predictor (temperature, MC dropout, deep ensemble)."""
    while hasattr(model, "model") or hasattr(model, "models"):
        model = model.model if hasattr(model, "model") else model.models[0]
    return model


def model_config(model: nn.Module) -> transformers.PretrainedConfig:
    inner = base_model(model)
    return inner.model_config if isinstance(inner, HydraEnsemble) else inner.config  # zero-shot: its classes


def class_names(model: nn.Module) -> list[str]:
    config = model_config(model)
    return [str(config.id2label[i]) for i in range(config.num_labels)]


def copy_preprocessor(source: Path, target: Path) -> None:
    """Copy the tokenizer / image-processor files, so every saved step can be read on its own."""
    for name in PREPROCESSOR_FILES:
        if (source / name).is_file():
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, target / name)


def load_preprocessor(path: Path) -> tuple[str, Any]:
    """("text", tokenizer) or ("image", image processor), read from a model directory."""
    if (path / "preprocessor_config.json").is_file():
        return "image", transformers.AutoImageProcessor.from_pretrained(path)
    if any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        return "text", transformers.AutoTokenizer.from_pretrained(path)
    raise CommandError(
        f"{str(path)!r} has no tokenizer or image processor files; save them next to the model "
        "(tokenizer.save_pretrained(dir) or processor.save_pretrained(dir))."
    )


# ---- data ----


DATA_OPTIONS = ("text_column", "label_column", "max_length", "batch_size")


def add_data_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data files")
    group.add_argument("--text-column", default="text", help="column holding the text in CSV / JSONL (default: text)")
    group.add_argument("--label-column", default="label", help="column holding the label (default: label)")
    group.add_argument("--max-length", type=int, default=128, help="tokens per text (default: 128)")
    group.add_argument("--batch-size", type=int, default=16, help="examples per batch (default: 16)")


def data_settings(args: argparse.Namespace) -> dict:
    """The data flags, for an output's settings: changing one redoes the step."""
    return {k: getattr(args, k) for k in DATA_OPTIONS}


@dataclass
class Data:
    """One data source, read and encoded for one model: `batches` are dicts of model inputs (+ labels)."""

    examples: Examples
    batches: list[dict]


def read_source(
    args: argparse.Namespace, source: str | os.PathLike, kind: str, *, labelled: bool | None, flag: str
) -> Examples:
    """Read a file of texts or a folder of images; `kind` ("text" / "image") is what the model reads.

    labelled: True requires labels, False ignores them, None takes them when the source has them.
    """
    path = Path(source)
    if not path.exists():
        raise CommandError(f"{flag} {str(path)!r} does not exist.")
    plain = path.is_file() and path.suffix.lower() == ".txt"
    if labelled and plain:
        raise CommandError(
            f"{flag} {str(path)!r} is plain text without labels; give a CSV or JSONL file with a "
            f"{args.label_column!r} column."
        )
    label_column = args.label_column if labelled is not False and path.is_file() else None
    try:
        examples = read_examples(path, args.text_column, label_column, labels_optional=labelled is None)
    except ValueError as error:
        raise CommandError(f"{flag}: {error}") from None
    if examples.kind != kind:
        hint = "a CSV / JSONL / .txt file" if kind == "text" else "a folder of images"
        raise CommandError(f"{flag} {str(path)!r} holds {examples.kind} data but the model reads {kind}s: give {hint}.")
    if labelled and examples.labels is None:
        raise CommandError(f"{flag} {str(path)!r} has no labels: give a folder with one sub-folder per class.")
    if labelled is False:
        examples.labels = None
    return examples


def encode(
    args: argparse.Namespace,
    examples: Examples,
    model_dir: Path,
    config: transformers.PretrainedConfig,
    labels: list[int] | None = None,
) -> list[dict]:
    kind, preprocessor = load_preprocessor(model_dir)
    if kind == "text":
        return text_batches(preprocessor, examples.inputs, labels, args.batch_size, args.max_length)
    return image_batches(preprocessor, examples.inputs, labels, args.batch_size, getattr(config, "num_channels", 3))


def read_data(
    args: argparse.Namespace,
    source: str | os.PathLike,
    model_dir: Path,
    config: transformers.PretrainedConfig,
    *,
    labelled: bool | None,
    flag: str,
) -> Data:
    """Read `source` and encode it with `model_dir`'s preprocessor; labels map through `config.label2id`.

    labelled: True requires labels, False ignores them, None takes them when the source has them.
    """
    kind, _ = load_preprocessor(model_dir)
    examples = read_source(args, source, kind, labelled=labelled, flag=flag)
    labels = None
    if examples.labels is not None:
        try:
            labels = label_ids(examples.labels, config.label2id, config.num_labels)
        except ValueError as error:
            raise CommandError(f"{flag} {str(source)!r}: {error}") from None
    return Data(examples, encode(args, examples, model_dir, config, labels))


def named_sources(values: list[str] | None, flag: str) -> dict[str, str]:
    """["name=path", "path"] -> {name: path}; a bare path is named after its file or folder."""
    sources: dict[str, str] = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep:
            name, path = Path(value).stem, value
        if not name or not path:
            raise CommandError(f"{flag} {value!r}: give PATH or NAME=PATH.")
        if name in sources:
            raise CommandError(f"{flag}: the name {name!r} is given twice; name them NAME=PATH.")
        sources[name] = path
    return sources


# ---- outputs ----


def fingerprint_path(path: str | os.PathLike, flag: str) -> dict:
    """Where an input lives and a digest of its contents' sizes and times: a changed input redoes the step."""
    if not Path(path).exists():
        raise CommandError(f"{flag} {str(path)!r} does not exist.")
    path = Path(path).resolve()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(
            f"{file.relative_to(path) if path.is_dir() else file.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()
        )
    return {"path": str(path), "digest": digest.hexdigest()[:16]}


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--force", action="store_true", help="start over, replacing what --out holds (a finished or interrupted run)"
    )


def start_step(args: argparse.Namespace, command: str, settings: dict, result: str = "") -> Output | None:
    """The output directory of a step, or None (having said so) when this very step already finished there.

    `result` names what the step wrote (shown in the message); a finished `evaluate` shows its report again."""
    out = Output(args.out, command, settings, args.force)
    if not out.done():
        return out
    if (out.path / result).is_file() and result.endswith(".md"):
        print((out.path / result).read_text())
    print(f"already done: {out.path / result if result else out.path} (pass --force to redo)")
    return None


class Output:
    """An output directory and its record, written when a step starts and again when it finishes.

    The same step run again: a no-op when it finished, a resume when it was interrupted. A different step: refused
    when the directory holds a finished result (unless `force`), started afresh when it holds only the unfinished
    part of one (an interrupted run, or one stopped by bad input)."""

    def __init__(self, path: str | os.PathLike, command: str, settings: dict, force: bool = False):
        self.path, self.command, self.started = Path(path), command, time.perf_counter()
        self.settings = json.loads(json.dumps(settings, default=str))
        record = self.path / RECORD
        if self.path.exists() and not self.path.is_dir():
            raise CommandError(f"--out {str(self.path)!r} is a file; give a directory.")
        previous = json.loads(record.read_text()) if record.is_file() else None
        same = previous is not None and (previous.get("command"), previous.get("settings")) == (command, self.settings)
        if previous is not None and (force or not (same or previous.get("finished"))):
            shutil.rmtree(self.path)  # --force, or the unfinished part of a different run: nothing finished is lost
            previous = None
        if previous is not None and not same:
            raise CommandError(
                f"--out {str(self.path)!r} holds the result of a different run ({previous.get('command')}); "
                "choose another --out, or pass --force to replace it."
            )
        self.previous = previous
        self.path.mkdir(parents=True, exist_ok=True)
        if previous is None:
            self._record(finished=False)

    def done(self) -> bool:
        return self.previous is not None and self.previous.get("finished", False)

    def finish(self, results: dict | None = None) -> None:
        self._record(finished=True, results=results or {})

    def _record(self, finished: bool, results: dict | None = None) -> None:
        record = {
            "command": self.command,
            "settings": self.settings,
            "finished": finished,
            "library_version": __version__,
        }
        if finished:
            record |= {"wall_time_s": round(time.perf_counter() - self.started, 1), "results": results}
        write_json_atomic(self.path / RECORD, record)
