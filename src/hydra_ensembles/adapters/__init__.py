"""Architecture adapters, one module per model family, looked up by the model's class."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from .base import Adapter, Block, LayerNames, ModelSpec
from .bert import BertAdapter
from .clip import CLIPTextAdapter, CLIPVisionAdapter
from .deberta_v2 import DebertaV2Adapter
from .dinov2 import Dinov2Adapter
from .dinov3 import Dinov3Adapter
from .distilbert import DistilBertAdapter
from .electra import ElectraAdapter
from .modernbert import ModernBertAdapter
from .mpnet import MPNetAdapter
from .siglip import SiglipTextAdapter, SiglipVisionAdapter
from .vit import ViTAdapter

__all__ = [
    "Adapter",
    "Block",
    "LayerNames",
    "ModelSpec",
    "UnsupportedModelError",
    "adapter_by_name",
    "adapter_for_class",
    "class_mismatch",
    "get_adapter",
    "register_adapter",
    "supported_models",
]


class UnsupportedModelError(ValueError):
    """The model's class has no adapter."""


_BY_CLASS: dict[str, Adapter] = {}
_BY_NAME: dict[str, Adapter] = {}


def register_adapter(adapter: Adapter, replace: bool = False) -> Adapter:
    """Make `adapter` handle every model class in `adapter.specs`. Returns it, so it can decorate an instance.
    A name or model class another adapter already holds is refused unless `replace=True` (a fused save records
    its adapter's name: reloaded under another adapter, it would be read by other code)."""
    taken = [f"name {adapter.name!r}"] if adapter.name in _BY_NAME else []
    taken += [name for name in adapter.specs if name in _BY_CLASS]
    if taken and not replace and not _same_adapter(adapter):
        shown = ", ".join(taken[:4]) + (f" and {len(taken) - 4} more" if len(taken) > 4 else "")
        raise ValueError(
            f"{shown} already belong(s) to a registered adapter: give yours another name and only new "
            "model classes, or pass replace=True to take them over for this process."
        )
    _BY_NAME[adapter.name] = adapter
    for class_name in adapter.specs:
        _BY_CLASS[class_name] = adapter
    return adapter


def _same_adapter(adapter: Adapter) -> bool:
    """Whether `adapter` registers again what an adapter of its class registered (a module imported twice, a test
    run again): the same name and classes, nothing taken from another."""
    mine = _BY_NAME.get(adapter.name)
    return type(mine) is type(adapter) and all(type(_BY_CLASS.get(c, adapter)) is type(adapter) for c in adapter.specs)


for _adapter in (
    BertAdapter(),
    DistilBertAdapter(),
    ElectraAdapter(),
    ViTAdapter(),
    Dinov2Adapter(),
    Dinov3Adapter(),
    MPNetAdapter(),
    DebertaV2Adapter(),
    ModernBertAdapter(),
    CLIPTextAdapter(),
    CLIPVisionAdapter(),
    SiglipTextAdapter(),
    SiglipVisionAdapter(),
):
    register_adapter(_adapter)


def supported_models() -> list[str]:
    """The HF model classes hydra-ensembles can prune and fuse."""
    return sorted(_BY_CLASS)


def get_adapter(model: nn.Module) -> Adapter:
    """The adapter for `model`'s class (or the nearest supported base class)."""
    return adapter_for_class(type(model), getattr(getattr(model, "config", None), "model_type", "unknown"))


def adapter_for_class(model_class: type, model_type: str = "unknown") -> Adapter:
    """The adapter for a model class (or its nearest supported base class), without building a model."""
    for cls in model_class.__mro__:
        if cls.__name__ in _BY_CLASS:
            return _BY_CLASS[cls.__name__]
    hint = ""
    if model_class.__name__ in ("CLIPModel", "SiglipModel"):
        hint = f" A {model_class.__name__} holds two towers: pass model.text_model or model.vision_model."
    raise UnsupportedModelError(
        f"hydra-ensembles has no adapter for {model_class.__name__} (model_type={model_type!r}).{hint} "
        f"Supported classes: {', '.join(supported_models())}. To add a family, subclass "
        "hydra_ensembles.adapters.Adapter (a name map plus embed and head functions) and call "
        "hydra_ensembles.register_adapter(YourAdapter()); see docs/adapters.md."
    )


def adapter_by_name(name: str) -> Adapter:
    """The registered adapter called `name` (as saved in a fused ensemble's config, e.g. "bert")."""
    if name not in _BY_NAME:
        raise UnsupportedModelError(f"no adapter named {name!r}; known: {', '.join(sorted(_BY_NAME))}")
    return _BY_NAME[name]


def class_mismatch(models: Sequence[nn.Module]) -> str | None:
    """How `models` differ in the classes they predict (`config.num_labels`, then `config.id2label` in class
    order), or None when they agree: an ensemble that averaged them would mix different classes' probabilities."""
    configs = [getattr(model, "config", None) for model in models]
    counts = [getattr(config, "num_labels", None) for config in configs]
    if len(set(counts)) > 1:
        return f"num_labels = {counts}"
    names = [_class_names(config) for config in configs]
    named = [m for m, member_names in enumerate(names) if member_names is not None]
    differ = next((m for m in named[1:] if names[m] != names[named[0]]), None)
    if differ is not None:
        return f"id2label: member {named[0]} names its classes {names[named[0]]}, member {differ} {names[differ]}"
    return None


def _class_names(config: object) -> list[str] | None:
    """`config.id2label`'s names in class order (keys as ints: a hand-set map keeps string keys, and '10' sorts
    before '2'), or None for HF's placeholders LABEL_0, LABEL_1, ... (a model given only num_labels names none)."""
    labels = {int(i): str(name) for i, name in (getattr(config, "id2label", None) or {}).items()}
    names = [labels[i] for i in sorted(labels)]
    return None if names == [f"LABEL_{i}" for i in sorted(labels)] else names
