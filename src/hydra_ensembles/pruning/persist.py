"""One persistence path for every structural change: recorded in the saved config, replayed on load.

A structure is a change of a model's shapes (kept attention heads, kept MLP neurons) recorded as
plain JSON under its own key of `config.json`. `save_model` writes the model as Hugging Face does (atomically);
`load_model` builds the plain HF class, replays every recorded structure in the order they were registered, and
only then lets HF's own loader fill the weights (which `AutoModel.from_pretrained` cannot: the shapes no
longer match the config). A module that changes shapes registers its structure with `register_structure`.

The checkpoint's identity (`base_fingerprint`) is recorded the same way at the first change, so members pruned
from one checkpoint and fine-tuned later are still recognised as siblings.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import transformers
from torch import nn

from ..adapters import UnsupportedModelError, adapter_for_class, get_adapter
from ..io import reading_dir, save_dir_atomic, saved_inside

FINGERPRINT_KEY = "hydra_base_fingerprint"
# config key -> replay(model, saved value): re-applies the change to a freshly built, unchanged model
STRUCTURES: dict[str, Callable[[nn.Module, Any], object]] = {}
# config key -> what to redo once the weights are in (HF's loader resets what the replay set, e.g. requires_grad)
AFTER_LOAD: dict[str, Callable[[nn.Module], object]] = {}
# config key -> check(model): raises when the model's weights do not have the shapes its record says
CHECKS: dict[str, Callable[[nn.Module], object]] = {}


def register_structure(
    config_key: str,
    replay: Callable[[nn.Module, Any], object],
    loaded: Callable[[nn.Module], object] | None = None,
    check: Callable[[nn.Module], object] | None = None,
) -> None:
    """Record a kind of structural change: `load_model` replays `replay(model, config.<config_key>)` before the
    weights are loaded, and calls `loaded(model)` after; `save_model` calls `check(model)` before it writes (a
    record its weights do not match would otherwise be saved, and refused only on load)."""
    STRUCTURES[config_key] = replay
    if loaded is not None:
        AFTER_LOAD[config_key] = loaded
    if check is not None:
        CHECKS[config_key] = check


def clear_structures(config: transformers.PretrainedConfig) -> transformers.PretrainedConfig:
    """`config` with no structure recorded, in its sub-configs neither (a CLIP classifier's `vision_config`): the
    config of the unchanged model (in place; returns it)."""
    for key in STRUCTURES:
        setattr(config, key, None)
        for sub in _sub_configs(config):
            if getattr(sub, key, None) is not None:
                setattr(sub, key, None)
    return config


def read_structure(model: nn.Module, key: str) -> Any:
    """The structure `key` recorded for `model` (None: unchanged). One source of truth for every handle on one
    encoder: its own config (`Adapter.config`: for a CLIP or SigLIP classifier, the vision tower's, which the
    tower's handle `model.vision_model` holds as its config too), else the model's."""
    for config in _structure_configs(model):
        stored = getattr(config, key, None)
        if stored is not None:
            return stored
    return None


def write_structure(model: nn.Module, key: str, value: Any) -> None:
    """Record the structure `key` of `model` in the encoder's own config and in the model's, where they differ:
    either handle reads it back, and `save_model` of either saves it where `load_model` replays it."""
    for config in _structure_configs(model):
        setattr(config, key, value)


def _structure_configs(model: nn.Module) -> list[transformers.PretrainedConfig]:
    own = get_adapter(model).config(model)
    return [own] if own is model.config else [own, model.config]


def _sub_configs(config: transformers.PretrainedConfig) -> list[transformers.PretrainedConfig]:
    return [value for value in vars(config).values() if isinstance(value, transformers.PretrainedConfig)]


def save_model(model: nn.Module, path: str | os.PathLike, also: Callable[[Path], None] | None = None) -> Path:
    """`model.save_pretrained(path)`, atomically: a crash midway leaves the previous save at `path` intact.

    Every structural change travels in config.json; restore the model with `load_model`. `also(folder)` writes
    more files into the same atomic save (a tokenizer beside the weights): the folder appears whole or not at all.
    """
    _sync_structures(model)
    _check_structures(model)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        if also is not None:
            also(tmp)

    return save_dir_atomic(path, write)


def _sync_structures(model: nn.Module) -> None:
    """Bring the model's own config up to date with its encoder's (`read_structure`): a classifier pruned later
    through its tower's handle saves the structure its weights have."""
    try:
        for key in [*STRUCTURES, FINGERPRINT_KEY]:
            value = read_structure(model, key)
            if value is not None:
                write_structure(model, key, value)
    except UnsupportedModelError:  # not a model with structures of its own (a two-tower model as a whole)
        return


def _check_structures(model: nn.Module) -> None:
    """Refuse to save a model whose weights do not match a structure it records (`CHECKS`): a model built from a
    config that a pruned sibling shares carries the sibling's record."""
    try:
        checks = [check for key, check in CHECKS.items() if read_structure(model, key) is not None]
    except UnsupportedModelError:  # not a model with structures of its own (a two-tower model as a whole)
        return
    for check in checks:
        check(model)


def load_model(path: str | os.PathLike, **from_pretrained_kwargs) -> nn.Module:
    """Load a model saved by `save_model` (or `save_pretrained`), replaying its recorded structures.

    The model is built, changed to its saved structures, and only then filled by HF's own loader (which also
    maps checkpoint key names). The result is an instance of the plain HF class.
    """
    refused = sorted({"config", "output_loading_info"} & set(from_pretrained_kwargs))
    if refused:
        raise TypeError(f"load_model sets {refused} itself (the saved config, checked loading): leave them out.")
    with reading_dir(path, "saved model") as path:
        if not (path / "config.json").is_file():  # HF would say "Unrecognized model ... should have a model_type"
            raise FileNotFoundError(f"{str(path)!r} has no config.json: it is not a saved model.{saved_inside(path)}")
        config = transformers.AutoConfig.from_pretrained(path)
        cls = model_class(config)
        recorded = _recorded(config, cls, path)
        if not recorded:
            return cls.from_pretrained(path, config=config, **from_pretrained_kwargs).eval()

        class Restructured(cls):  # builds the saved shapes inside HF's loader, then hands back a plain `cls`
            def __init__(self, config, *args, **kwargs):
                clear_structures(config)
                super().__init__(config, *args, **kwargs)
                for key, value in recorded.items():
                    STRUCTURES[key](self, value)

        # HF maps old checkpoint key names (ViT, DINOv2: encoder.layer.N.attention.attention.query -> ...) only for
        # its own classes, told by the module: a subclass defined here would load those weights as missing, at random
        Restructured.__module__ = cls.__module__
        Restructured.__name__ = Restructured.__qualname__ = cls.__name__
        # Weights of other shapes are let through to the loading info, which names them, and refused there (HF's
        # own refusal only points at a report it logs, which the CLI's verbosity hides).
        options = {"ignore_mismatched_sizes": True} | from_pretrained_kwargs
        try:
            model, info = Restructured.from_pretrained(path, config=config, output_loading_info=True, **options)
        except RuntimeError as error:  # ignore_mismatched_sizes=False asked for: HF refused, saying no key
            if "ignore_mismatched_sizes" not in str(error):
                raise
            _check_loaded({"mismatched_keys": ["(not named by HF: load without ignore_mismatched_sizes=False)"]}, path)
        _check_loaded(info, path)
        model.__class__ = cls
        for key in recorded.keys() & AFTER_LOAD.keys():
            AFTER_LOAD[key](model)
        return model.eval()


def _recorded(config: transformers.PretrainedConfig, cls: type, path: Path) -> dict[str, Any]:
    """The structures to replay, read as `read_structure` reads them: for a supported class, the encoder's own
    sub-config first (a CLIP classifier saved by `save_pretrained` after pruning through its tower records them
    only there), else the top level. A class not supported whole (a two-tower CLIPModel) whose only structures
    sit in a tower's sub-config is refused with the fix."""
    top = {key: getattr(config, key) for key in STRUCTURES if getattr(config, key, None) is not None}
    nested = {key: getattr(sub, key) for sub in _sub_configs(config) for key in STRUCTURES if getattr(sub, key, None)}
    if not nested:
        return top
    try:
        adapter_for_class(cls, getattr(config, "model_type", "unknown"))
    except UnsupportedModelError:
        if top:
            return top
        raise ValueError(
            f"the model at {str(path)!r} has a pruned tower ({', '.join(sorted(nested))} in a sub-config) but "
            "records no structure of its own: a tower of a two-tower model was pruned through its own handle. Save "
            "the pruned tower itself with save_model (e.g. save_model(model.text_model, DIR))."
        ) from None
    return top | nested


def _check_loaded(info: dict[str, Any], path: Path) -> None:
    """A restructured model is loaded from its own save: every tensor must find its place (HF only warns)."""
    problems = {
        kind: sorted(map(_loading_key, info.get(kind) or ()))
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")
    }
    problems = {kind: keys for kind, keys in problems.items() if keys}
    if list(problems) == ["missing_keys"] and all(".pooler." in f".{key}" for key in problems["missing_keys"]):
        raise ValueError(
            f"the pruned model at {str(path)!r} was saved without its pooler (built with add_pooling_layer=False, "
            f"missing {problems['missing_keys'][:2]}): load it so, load_model(path, add_pooling_layer=False)."
        )
    if problems:
        listed = "; ".join(
            f"{kind.replace('_', ' ')}: {keys[:4]}{' ...' if len(keys) > 4 else ''}" for kind, keys in problems.items()
        )
        raise ValueError(
            f"the pruned model at {str(path)!r} does not load whole ({listed}): its weights do not match the "
            "structure its config.json records (a hand-edited config, or files of two saves mixed). Use the "
            "config.json and weights that one save_model call wrote together."
        )


def _loading_key(key: Any) -> str:
    """A key of HF's loading info as a message says it: mismatched keys come as (key, file's shape, model's)."""
    if isinstance(key, tuple) and len(key) == 3:
        name, in_file, in_model = key
        return f"{name} {list(in_file)} in the file, {list(in_model)} in the model"
    return str(key)


def model_class(config: transformers.PretrainedConfig) -> type:
    """The HF class named in `config.architectures`."""
    names = getattr(config, "architectures", None) or []
    if not names:
        raise ValueError(f"config.architectures is {names!r}: cannot tell which HF model class to build.")
    if not hasattr(transformers, names[0]):
        raise ValueError(
            f"config.architectures names {names[0]!r}, which transformers does not define (a subclass of your own?): "
            "set config.json's architectures to the HF class it derives from (e.g. BertForSequenceClassification), "
            "load it with load_model, then set model.__class__ = YourClass (a subclass adding no weights of its own)."
        )
    return getattr(transformers, names[0])


def base_fingerprint(model: nn.Module) -> str:
    """Identity of the pretrained checkpoint a model (or member) comes from.

    Recorded in the config at the first pruning, from the embedding weights, so that members pruned from one
    checkpoint and fine-tuned later still match; computed afresh for a model that was never pruned.
    """
    stored = read_structure(model, FINGERPRINT_KEY)
    if stored:
        return stored
    adapter = get_adapter(model)
    digest = hashlib.sha256(type(adapter).__name__.encode())
    for path in adapter.embedding_paths:
        module = _optional_submodule(adapter.backbone(model), path)  # ELECTRA's projection is optional
        for name, tensor in sorted(module.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _optional_submodule(root: nn.Module, path: str) -> nn.Module:
    """The submodule at `path`, or an empty module where the model has none."""
    try:
        return root.get_submodule(path)
    except AttributeError:
        return nn.Module()


def record_fingerprint(model: nn.Module) -> None:
    if any(p.is_meta for p in model.parameters()):  # replayed inside HF's loader: no weights to hash yet
        return
    if not read_structure(model, FINGERPRINT_KEY):  # one per encoder, whichever handle pruned it first
        write_structure(model, FINGERPRINT_KEY, base_fingerprint(model))
