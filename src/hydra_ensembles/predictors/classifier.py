"""A saved predictor put to work as a classifier: loaded with its classes (a two-tower model is given them, to
classify zero-shot), and the files beside it that say how it reads its inputs (tokenizer or image processor)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import transformers
from torch import nn

from ..adapters import get_adapter
from ..fusion import HydraEnsemble
from ..io import PREPROCESSOR_FILES
from .clip_zero_shot import DEFAULT_TEMPLATES, TwoTowerModel, ZeroShotEnsemble, zero_shot_ensemble
from .load import describe_saved, load_predictor
from .wrapper import base_model, wrapper_chain

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")


def load_classifier(
    path: str | os.PathLike, classes: Sequence[str] | None = None, templates: Sequence[str] | None = None
) -> nn.Module:
    """The predictor saved at `path`, in eval mode, refused unless it classifies. A two-tower model classifies
    `classes` zero-shot (prompts from `templates`); a saved zero-shot ensemble its own classes, or these.
    Errors begin with the path, so that a caller can put the flag that named it in front."""
    path = Path(path)
    model = load_predictor(path)
    if isinstance(model, TwoTowerModel):
        if not classes:
            raise ValueError(
                f"{str(path)!r} is a two-tower model: it classifies zero-shot, so name the classes (`classes`; "
                "--classes 'cat,dog,car' on the command line, and optionally --templates 'a photo of a {}.')."
            )
        return zero_shot_ensemble(model, classes, prompt_tokenizer(path), templates or DEFAULT_TEMPLATES)
    inner = base_model(model)
    if isinstance(inner, ZeroShotEnsemble):
        if templates and not classes:
            raise ValueError(
                f"{str(path)!r}: new templates re-prompt the saved classes; name them too (`classes`, --classes)."
            )
        if classes:
            if list(classes) != inner.classes or (templates and list(templates) != inner.templates):
                _check_not_fitted_to_classes(model, inner.classes, path)  # new prompts: new logits
            inner.set_classes(classes, templates or inner.templates, prompt_tokenizer(path))
        return model
    if isinstance(inner, HydraEnsemble) and not inner.is_classifier:
        raise ValueError(f"{str(path)!r} is an ensemble of encoders without a classifier.")
    if not isinstance(inner, HydraEnsemble) and not get_adapter(inner).is_classifier(inner):
        hint = head_hint(inner.config)
        raise ValueError(f"{str(path)!r} is a {type(inner).__name__}, which has no classifier; {hint}")
    if classes:
        raise ValueError(
            f"{str(path)!r} is {describe_saved(path)}, a classifier of its own classes {class_names(model)}: "
            "--classes (zero-shot class names, `classes` in Python) is for two-tower models."
        )
    return model


def head_hint(config: transformers.PretrainedConfig) -> str:
    """What to do with an encoder of this config where a classifier is needed: fine-tune one, where transformers
    has a classification class for it (`has_classifier_class`; DINOv3 and CLIP's towers have none)."""
    if has_classifier_class(config):
        return (
            "fine-tune it first (`finetune`, or hydra-ens finetune, gives it a classification head from your labelled "
            "data)."
        )
    return (
        f"transformers has no classification class for {config.model_type!r}, so it cannot be given a head here: "
        "prune and fuse it as an encoder in Python (the ensemble returns member_pooled), e.g. as the image tower of "
        "a two-tower model (docs/zero_shot.md)."
    )


def has_classifier_class(config: transformers.PretrainedConfig) -> bool:
    """Whether AutoModelFor{Sequence,Image}Classification builds a classifier for `config` (classes registered with
    them included)."""
    from transformers.models.auto import modeling_auto  # here: it loads HF's modeling code (seconds)

    mappings = (
        modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING,
        modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING,
    )
    return any(type(config) in mapping for mapping in mappings)


def _check_not_fitted_to_classes(model: nn.Module, saved_classes: list[str], path: Path) -> None:
    """Refuse other classes for a zero-shot ensemble under a wrapper fitted class by class (its per-class map
    would be applied to whichever class now sits at that index)."""
    fitted = [wrapper for wrapper in wrapper_chain(model)[:-1] if wrapper.fitted_to_classes]
    if fitted:
        raise ValueError(
            f"{str(path)!r} is {describe_saved(path)}, fitted class by class for its classes {saved_classes}: "
            "that fit does not carry over to other classes or prompts. Calibrate (or fit the detectors) again from the "
            "two-tower model with these classes, or use this one without new classes."
        )


def model_config(model: nn.Module) -> transformers.PretrainedConfig:
    """The config that names a predictor's classes (`id2label`): its base model's (a zero-shot ensemble's
    classes)."""
    inner = base_model(model)
    return inner.model_config if isinstance(inner, HydraEnsemble) else inner.config


def class_names(model: nn.Module) -> list[str]:
    config = model_config(model)
    return [str(config.id2label[i]) for i in range(config.num_labels)]


def prompt_tokenizer(path: Path) -> transformers.PreTrainedTokenizerBase:
    """A two-tower model's text tokenizer (for the class prompts): in its directory, or in its text/ tower."""
    for where in (path, path / "text"):
        if any((where / name).is_file() for name in TOKENIZER_FILES):
            return transformers.AutoTokenizer.from_pretrained(where)
    raise ValueError(f"{str(path)!r} has no tokenizer files (for the class prompts); save the tokenizer there.")


def load_preprocessor(path: Path) -> tuple[str, Any]:
    """("text", tokenizer) or ("image", image processor), read from a model directory."""
    if (path / "preprocessor_config.json").is_file():
        return "image", transformers.AutoImageProcessor.from_pretrained(path)
    if any((path / name).is_file() for name in TOKENIZER_FILES):
        return "text", transformers.AutoTokenizer.from_pretrained(path)
    raise ValueError(
        f"{str(path)!r} has no tokenizer or image processor files; save them next to the model "
        "(tokenizer.save_pretrained(dir) or processor.save_pretrained(dir))."
    )


def copy_preprocessor(source: Path, target: Path) -> None:
    """Copy the tokenizer / image-processor files, so that every saved step can be read on its own."""
    for name in PREPROCESSOR_FILES:
        if (source / name).is_file():
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, target / name)


def copy_tower_preprocessors(source: Path, target: Path) -> None:
    """`copy_preprocessor` of a checkpoint and of its text tower's folder (`text/`, where a two-tower checkpoint keeps
    its tokenizer), both into `target`."""
    for where in (source, source / "text"):
        copy_preprocessor(where, target)
