"""One saver and one loader for every predictor: each kind names itself (`kind`), saves and loads itself
(`save_pretrained` / `from_pretrained`) and says what a saved one is (`describe`), and is found by its name in
`PREDICTOR_KINDS` (`register_predictor` adds one).

What a directory holds tells its kind:
    predictor.json      {"kind": ...}: a wrapper (temperature, MC dropout), a deep ensemble, an MLP student, or a
                        zero-shot two-tower ensemble, with its models in sub-directories or model.safetensors
    hydra_config.json   "hydra_ensemble" (`HydraEnsemble.save_pretrained`; also a distilled transformer student)
    two_tower.json      "two_tower" (`TwoTowerModel.save_pretrained`), as is an HF CLIPModel or SiglipModel checkpoint
    config.json         "hf_model": a Hugging Face model, pruned or not (`save_model`; its structure is replayed)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Protocol

import torch
import transformers
from torch import nn

from ..adapters import UnsupportedModelError, adapter_for_class
from ..distill import MultiHeadMLP
from ..fusion import HydraEnsemble
from ..io import (
    HYDRA_CONFIG,
    PREDICTOR_FILE,
    SAVED_MODEL_FILES,
    TWO_TOWER_FILE,
    save_dir_atomic,
    saved_inside,
    settle_dir,
    write_json_atomic,
)
from ..pruning import load_model, save_model
from .card import write_card
from .wrapper import Wrapper

HF_TWO_TOWER_MODELS = {"clip": "CLIPModel", "siglip": "SiglipModel"}  # model_type -> the HF two-tower class


class SavedPredictor(Protocol):
    """What a predictor kind declares to be saved and loaded by name."""

    kind: ClassVar[str]

    def save_pretrained(self, path: str | os.PathLike) -> Path: ...

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> nn.Module: ...

    @classmethod
    def describe(cls, path: Path) -> str:
        """What the predictor saved at `path` is, e.g. "a fused ensemble of 3 members", from its records alone."""


class HFModel:
    """The kind of a plain Hugging Face model, pruned or not: HF's classes are not ours, so this stands for them.
    It has no `save_pretrained` of its own: `save_predictor` saves an HF model with `save_model`, which is atomic
    and records the pruned structure that `load_model` replays."""

    kind = "hf_model"

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> nn.Module:
        return load_model(path)

    @classmethod
    def describe(cls, path: Path) -> str:
        config = json.loads((path / "config.json").read_text())
        return f"one model ({(config.get('architectures') or [config.get('model_type')])[0]})"


PREDICTOR_KINDS: dict[str, type[SavedPredictor]] = {
    HFModel.kind: HFModel,
    HydraEnsemble.kind: HydraEnsemble,
    MultiHeadMLP.kind: MultiHeadMLP,
}


def register_predictor(cls: type[SavedPredictor]) -> type[SavedPredictor]:
    """Make `load_predictor` read a saved `cls` by its `kind` (usable as a class decorator)."""
    PREDICTOR_KINDS[cls.kind] = cls
    return cls


def saved_kind(path: str | os.PathLike) -> str:
    """The kind saved at `path`: predictor.json names it; the formats that do not are told by their files."""
    path = Path(path)
    settle_dir(path)  # a save cut off between its two renames is put back before its files are read
    marks = [name for name in SAVED_MODEL_FILES if (path / name).is_file()]
    if len(marks) > 1:  # e.g. an HF save_pretrained into an ensemble's folder (it adds, where ours replace)
        raise ValueError(
            f"{str(path)!r} holds files of two saves ({' and '.join(marks)}), so which one it is cannot be told: "
            "save each predictor into its own directory (or save this one again, which replaces the folder whole)."
        )
    if (path / HYDRA_CONFIG).is_file():
        return HydraEnsemble.kind
    if (path / PREDICTOR_FILE).is_file():
        return str(json.loads((path / PREDICTOR_FILE).read_text()).get("kind"))
    if (path / TWO_TOWER_FILE).is_file() or _is_hf_two_tower(path):
        return "two_tower"
    if (path / "config.json").is_file():
        return HFModel.kind
    raise FileNotFoundError(
        f"{str(path)!r} holds no saved predictor (it is not a model directory): it has neither {PREDICTOR_FILE} "
        f"(its kind), {HYDRA_CONFIG} (a Hydra Ensemble), {TWO_TOWER_FILE} (a two-tower model) nor config.json (a "
        f"Hugging Face checkpoint).{saved_inside(path)}"
    )


def predictor_kind(path: str | os.PathLike) -> type[SavedPredictor]:
    """The registered kind saved at `path`."""
    kind = saved_kind(path)
    if kind not in PREDICTOR_KINDS:
        raise ValueError(
            f"{str(Path(path))!r} holds a predictor of unknown kind {kind!r} ({PREDICTOR_FILE}); known kinds: "
            f"{sorted(PREDICTOR_KINDS)} (`register_predictor` adds one)."
        )
    return PREDICTOR_KINDS[kind]


def describe_saved(path: str | os.PathLike) -> str:
    """What is saved at `path`, in a few words ("a fused ensemble of 3 members"), without reading its weights."""
    return predictor_kind(path).describe(Path(path))


def load_predictor(path: str | os.PathLike) -> nn.Module:
    """The predictor saved at `path` (any registered kind), in eval mode."""
    return predictor_kind(path).from_pretrained(path).eval()


def save_predictor(
    model: nn.Module, path: str | os.PathLike, *, card: bool = True, also: Callable[[Path], None] | None = None
) -> Path:
    """Save any predictor atomically so that `load_predictor(path)` returns an equal one, with its model card
    (README.md: what it is and costs, `card.py`) beside the weights, in the same atomic save; card=False for a
    model saved inside a wrapper's directory (the wrapper's card describes both). `also(folder)` writes more files
    into the same save (the tokenizer or image processor beside the weights)."""
    if not isinstance(model, (transformers.PreTrainedModel, *PREDICTOR_KINDS.values())):
        raise TypeError(f"no saved kind for a {type(model).__name__}; known kinds: {sorted(PREDICTOR_KINDS)}.")

    def write(tmp: Path) -> None:
        save_model(model, tmp) if isinstance(model, transformers.PreTrainedModel) else model.save_pretrained(tmp)
        if also is not None:
            also(tmp)
        if card:
            write_card(model, tmp)  # tmp sits beside path: the card finds the same step records

    return save_dir_atomic(path, write)


def num_members(model: nn.Module) -> int:
    """M, the members whose outputs a predictor returns (1 for a plain model)."""
    return 1 if isinstance(model, transformers.PreTrainedModel) else model.num_members


class ModelWrapper(Wrapper):
    """A wrapper around one predictor, `model` (calibration, MC dropout, fitted detectors, a precision), saved as
    `model/` beside the wrapper's predictor.json. Returns its M members unless a subclass says otherwise."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    @property
    def base(self) -> nn.Module:
        return self.model

    @property
    def num_members(self) -> int:
        return num_members(self.model)

    def save_wrapped(
        self, path: str | os.PathLike, record: dict, write_more: Callable[[Path], None] | None = None
    ) -> Path:
        """Write model/ (the wrapped predictor), what `write_more(tmp)` adds and predictor.json ({"kind": ...} and
        `record`), atomically."""

        def write(tmp: Path) -> None:
            save_predictor(self.model, tmp / "model", card=False)
            if write_more is not None:
                write_more(tmp)
            write_json_atomic(tmp / PREDICTOR_FILE, {"kind": self.kind} | record)

        return save_dir_atomic(path, write)

    @classmethod
    def load_wrapped(cls, path: str | os.PathLike) -> tuple[nn.Module, dict]:
        """The wrapped predictor saved at `path`/model and the wrapper's predictor.json record."""
        record = saved_record(path, cls)
        return load_predictor(Path(path) / "model"), record


def saved_record(path: str | os.PathLike, cls: type[SavedPredictor]) -> dict:
    """The predictor.json record at `path`, refused unless what is saved there is a `cls` (its `kind`, or an
    earlier name of it): a kind's own `from_pretrained` given another kind's folder failed with a bare KeyError."""
    kind = saved_kind(path)
    saved = PREDICTOR_KINDS.get(kind)
    if saved is None or not (issubclass(cls, saved) or issubclass(saved, cls)):  # a subclass reads its parent's
        raise ValueError(
            f"{str(Path(path))!r} holds a {kind!r} predictor, not a {cls.kind!r}: load it with load_predictor, "
            "which reads every kind."
        )
    return json.loads((Path(path) / PREDICTOR_FILE).read_text())


def check_supported(path: str | os.PathLike) -> None:
    """Refuse a Hugging Face checkpoint whose architecture has no adapter, from its config alone (before any
    other work)."""
    path = Path(path)
    config = transformers.AutoConfig.from_pretrained(path)
    named = [getattr(transformers, name, None) for name in getattr(config, "architectures", None) or []]
    classes = [cls for cls in named if cls is not None]
    if not classes:
        with torch.device("meta"):  # the base model's class, without allocating its weights
            classes = [type(transformers.AutoModel.from_config(config))]
    try:
        adapter_for_class(classes[0], config.model_type)
    except UnsupportedModelError as error:
        raise UnsupportedModelError(f"{str(path)!r}: {error}") from None


def _is_hf_two_tower(path: Path) -> bool:
    """An HF CLIPModel or SiglipModel checkpoint (both towers, not one tower alone)."""
    if not (path / "config.json").is_file():
        return False
    config = json.loads((path / "config.json").read_text())
    model_class = HF_TWO_TOWER_MODELS.get(config.get("model_type"))
    return model_class is not None and model_class in (config.get("architectures") or [model_class])  # or null
