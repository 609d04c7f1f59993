"""The model card: a README.md beside a saved predictor's weights that says what it is and what it costs.

It names the base model, the method and its settings (members, heads kept per member and layer, MLP neurons kept,
the fusion mode, and — when the directory was written by the CLI — the circuit or scores the heads were chosen
by), the cost relative to the unpruned base model (parameters; FLOPs of one input), and the metrics of the last
`hydra-ens evaluate` run that measured it: `save_predictor` writes the card, and `evaluate` rewrites the card of
every model it evaluated with its metrics (the card is derived from the directory, so no step fingerprints it).
The card's YAML header is Hugging Face's model-card metadata, so the directory stays a normal HF model folder.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

from ..adapters import UnsupportedModelError, get_adapter
from ..cost import count_flops, count_parameters, stored_parameters
from ..fusion import HydraEnsemble
from ..io import write_text_atomic
from ..pruning import kept_heads, kept_neurons
from ..pruning.persist import clear_structures
from ..version import __version__
from .wrapper import base_model, wrapper_chain

CARD_NAME = "README.md"
LIBRARY = "hydra-ensembles"  # the card's library_name: what marks a README.md as a card this library wrote
RECORD = "hydra-ens.json"  # a CLI step's record (cli/step.py), read here to say where the heads came from
PROBE_TOKENS = 128  # the text input the FLOPs are counted on: one sequence of this many tokens (or the maximum)


def write_card(predictor: nn.Module, path: str | os.PathLike, evaluation: Mapping[str, Any] | None = None) -> Path:
    """Write (atomically) the card of `predictor`, saved at `path`, as `path`/README.md; `evaluation`: the
    metrics an evaluate run measured for it ({"metrics": {"id": {...}, "near": ..., ...}, "report": where}).

    Raises FileExistsError when `path` holds a README.md that is not a hydra-ensembles card (a Hugging Face
    checkpoint's own model card is the user's: never replaced)."""
    target = Path(path) / CARD_NAME
    if target.is_file() and not is_own_card(target):
        raise FileExistsError(f"{str(target)!r} is not a hydra-ensembles model card; it is left as it is.")
    text = card_text(predictor, Path(path), evaluation)
    write_text_atomic(target, text)
    return target


def is_own_card(path: str | os.PathLike) -> bool:
    """Whether the file at `path` is a card this library wrote (its YAML header names the library)."""
    return Path(path).read_text(errors="replace").startswith(f"---\nlibrary_name: {LIBRARY}\n")


def card_text(predictor: nn.Module, path: Path | None = None, evaluation: Mapping[str, Any] | None = None) -> str:
    """The card of `predictor` (see the module docstring) as Markdown."""
    inner = base_model(predictor)
    own = _own_method(predictor)
    if own is not None:  # a baseline whose members are not pruned copies (Packed-Ensembles)
        base = own.reference_model()
    else:
        base = _unpruned(inner) if isinstance(inner, HydraEnsemble) or _is_hf(inner) else None
    lines = [*_header(inner), f"# {_title(predictor, inner, base)}", ""]
    lines += [
        f"Made with hydra-ensembles {__version__}; load it with `hydra_ensembles.predictors.load_predictor(path)`.",
        "",
    ]
    lines += _base_lines(inner, base) + _method_lines(predictor, inner, base, path) + _cost_lines(predictor, base)
    lines += _evaluation_lines(evaluation)
    return "\n".join(lines).rstrip() + "\n"


# ---- sections ----


def _header(inner: nn.Module) -> list[str]:
    base = _name_or_path(inner)
    return [
        "---",
        f"library_name: {LIBRARY}",
        *([f"base_model: {base}"] if base and not Path(base).is_absolute() else []),
        "tags: [hydra-ensembles, ensemble, uncertainty, pruning]",
        "---",
        "",
    ]


def _title(predictor: nn.Module, inner: nn.Module, base: nn.Module | None) -> str:
    """A kind that is its own method (a baseline built on a model) names itself (its `title`); else the title says
    what the model is, and which wrappers sit over it."""
    what, chain = _model_name(inner), wrapper_chain(predictor)
    owner = next((m for m in chain if getattr(m, "title", None) is not None), None)  # under a calibration too
    if owner is not None:
        wrappers = [getattr(m, "kind", type(m).__name__) for m in chain[: chain.index(owner)]]
        title = owner.title.format(members=owner.num_members, model=what)
        return title + (f" ({' + '.join(wrappers)})" if wrappers else "")
    if isinstance(inner, HydraEnsemble):
        title = f"A Hydra Ensemble of {inner.num_members} pruned {what} members, fused"
    else:
        title = f"{'A pruned' if base is not None and _is_pruned(inner, base) else 'A'} {what}"
    wrappers = [getattr(m, "kind", type(m).__name__) for m in chain[:-1]]
    return title + (f" ({' + '.join(wrappers)})" if wrappers else "")


def _base_lines(inner: nn.Module, base: nn.Module | None) -> list[str]:
    config = _config(inner)
    if config is None or base is None:
        return []
    sizes = {  # read from the unpruned model: configs name them differently (DistilBERT, CLIP, DINOv2's mlp_ratio)
        "layers": len(kept_heads(base)),
        "heads per layer": len(kept_heads(base)[0]),
        "hidden size": getattr(get_adapter(base).config(base), "hidden_size", None),
        "MLP width": _widths(base)[0],
    }
    lines = ["## Base model", "", f"- class: `{_model_name(inner)}` ({config.model_type})"]
    if _name_or_path(inner):
        lines.append(f"- checkpoint: `{_name_or_path(inner)}`")
    lines.append("- " + ", ".join(f"{name} {value}" for name, value in sizes.items() if value is not None))
    labels = getattr(config, "id2label", None)
    if labels and len(labels) <= 20:
        lines.append("- classes: " + ", ".join(str(labels[i]) for i in sorted(labels)))
    return [*lines, ""]


def _method_lines(predictor: nn.Module, inner: nn.Module, base: nn.Module | None, path: Path | None) -> list[str]:
    lines = ["## Method and settings", ""]
    for wrapper in wrapper_chain(predictor)[:-1]:
        lines.append(f"- wrapper: `{getattr(wrapper, 'kind', type(wrapper).__name__)}` around the model below")
    if (own := _own_method(predictor)) is not None:  # a method of its own, not pruned members
        return [*lines, *own.card_method_lines(), ""]
    if isinstance(inner, HydraEnsemble):
        lines += [
            f"- members: {inner.num_members}, fused into one module that runs them in one pass (paper 000, §4.2)",
            f"- fusion mode: `mlp={inner.mlp}` ("
            + ("each member keeps its own MLP, norms and embeddings: exact" if inner.mlp == "stack" else "merged MLP")
            + f"); tensors averaged over members that differ in them: {len(inner.averaged)}",
            f"- shared trunk: the first {inner.trunk} layers run once for all members",
        ]
        head_maps = inner.head_maps
    elif (ensemble := _members_of(predictor)) is not None:  # a deep ensemble: its base is only its first member
        head_maps = [kept_heads(member) if _is_hf(member) else {} for member in ensemble]
    elif _is_hf(inner):
        head_maps = [kept_heads(inner)]
    else:
        return [*lines, f"- {type(inner).__name__}", ""]
    lines += _source_lines(path)
    lines += ["", "Heads kept per layer (one column per member):", "", *_head_table(head_maps), ""]
    lines += _neuron_lines(inner, base)
    return lines


def _head_table(head_maps: list[dict[int, list[int]]]) -> list[str]:
    members = len(head_maps)
    rows = ["| layer | " + " | ".join(f"member {m}" for m in range(members)) + " |", "|---" * (members + 1) + "|"]
    for layer in sorted(head_maps[0]):
        rows.append(f"| {layer} | " + " | ".join(str(h.get(layer, [])) for h in head_maps) + " |")
    totals = [sum(len(heads) for heads in h.values()) for h in head_maps]
    return [*rows, "| total | " + " | ".join(str(t) for t in totals) + " |"]


def _neuron_lines(inner: nn.Module, base: nn.Module) -> list[str]:
    """MLP neurons kept per layer (adaptive MLP pruning, paper 002), when any were removed."""
    if isinstance(inner, HydraEnsemble):
        widths = [int(layer.mlp_in_weight.shape[-1]) for layer in inner.layers]  # (G, d, F): F neurons
    else:
        widths = _widths(inner)
    full = _widths(base)
    if widths == full:
        return [f"MLP neurons kept: all ({full[0]} per layer).", ""]
    return [f"MLP neurons kept per layer (of {full[0]}): {widths} ({sum(widths)} of {sum(full)}).", ""]


def _widths(model: nn.Module) -> list[int]:
    """The MLP hidden width of every layer of an HF model."""
    return [len(neurons) for _, neurons in sorted(kept_neurons(model).items())]


def _source_lines(path: Path | None) -> list[str]:
    """Where the heads came from, read from the CLI step records above `path` (fuse -> finetune -> members)."""
    members = _members_record(path)
    if members is None:
        return ["- head selection: not recorded (the model was not written by `hydra-ens members` / `fuse`)"]
    settings = members["settings"]
    source = settings.get("source", {}).get("path", "?")
    kind = "circuit" if source.endswith(".json") else "Taylor head scores"
    chosen = ", ".join(f"{k} {settings.get(k)}" for k in ("num_members", "budget", "pool", "seed"))
    return [f"- head selection: {kind} `{source}`; {chosen} (`hydra-ens members`)"]


def _cost_lines(predictor: nn.Module, base: nn.Module | None) -> list[str]:
    """The whole predictor's cost (every member of a deep ensemble, the M passes of a BatchEnsemble) against one
    unpruned copy of the model its members were made from (`base`)."""
    if base is None:
        return []
    probe = _probe(base)
    own, full = stored_parameters(predictor), count_parameters(base)
    flops, base_flops = count_flops(predictor, probe), count_flops(base, probe)
    shape = "x".join(str(s) for s in next(iter(probe.values())).shape)
    return [
        "## Cost relative to the base model",
        "",
        f"| | parameters | FLOPs (one input, {shape}) |",
        "|---|---|---|",
        f"| base model (unpruned, one) | {full / 1e6:.3g} M | {base_flops / 1e9:.3g} G |",
        f"| this model | {own / 1e6:.3g} M | {flops / 1e9:.3g} G |",
        f"| ratio | {own / full:.2f}x | {flops / base_flops:.2f}x |",
        "",
    ]


def _evaluation_lines(evaluation: Mapping[str, Any] | None) -> list[str]:
    if not evaluation:
        return ["## Evaluation", "", "Not evaluated yet: `hydra-ens evaluate --model PATH` adds its metrics here.", ""]
    metrics = evaluation.get("metrics", {})
    lines = ["## Evaluation", "", f"The last `hydra-ens evaluate` run: `{evaluation.get('report', '?')}`.", ""]
    lines += ["| data | metric | value |", "|---|---|---|"]
    for where, values in metrics.items():
        for key, value in values.items():
            if isinstance(value, (int, float)):
                lines.append(f"| {where} | {key} | {value:.4g} |")
    return [*lines, ""]


# ---- helpers ----


def _is_hf(model: nn.Module) -> bool:
    """An HF model of a supported family (what the head and neuron maps and the costs are read from)."""
    if not isinstance(model, transformers.PreTrainedModel):
        return False
    try:
        get_adapter(model)
    except UnsupportedModelError:
        return False
    return True


def _config(inner: nn.Module) -> transformers.PretrainedConfig | None:
    if isinstance(inner, HydraEnsemble):
        return inner.model_config
    return inner.config if _is_hf(inner) else None


def _model_name(inner: nn.Module) -> str:
    return inner.model_class.__name__ if isinstance(inner, HydraEnsemble) else type(inner).__name__


def _name_or_path(inner: nn.Module) -> str:
    config = _config(inner)
    return str(getattr(config, "_name_or_path", "") or "") if config is not None else ""


def _is_pruned(model: nn.Module, base: nn.Module) -> bool:
    """Heads or MLP neurons fewer than the unpruned model's (`base`)."""
    counts = [[len(h) for _, h in sorted(kept_heads(m).items())] for m in (model, base)]
    return counts[0] != counts[1] or _widths(model) != _widths(base)


def _members_of(predictor: nn.Module) -> list[nn.Module] | None:
    """The separate models of a deep ensemble in the wrapper chain (`models`), or None."""
    owner = next((m for m in wrapper_chain(predictor) if isinstance(getattr(m, "models", None), nn.ModuleList)), None)
    return list(owner.models) if owner is not None else None


def _own_method(predictor: nn.Module) -> nn.Module | None:
    """The predictor in the wrapper chain that describes itself (`reference_model`, `card_method_lines`): a
    baseline such as Packed-Ensembles, whose fused engine holds members that are not pruned copies of a model."""
    return next((m for m in wrapper_chain(predictor) if hasattr(m, "reference_model")), None)


def _unpruned(inner: nn.Module) -> nn.Module:
    """The base model, unpruned, randomly initialised (only its size and FLOPs are read; its buffers, such as
    position ids, must be real, so it is not built on the meta device)."""
    model_class = inner.model_class if isinstance(inner, HydraEnsemble) else type(inner)
    return model_class(clear_structures(copy.deepcopy(_config(inner)))).eval()


def _probe(inner: nn.Module) -> dict[str, torch.Tensor]:
    """One input of the model's kind: an image of its size, or PROBE_TOKENS tokens (at most its maximum)."""
    adapter = inner.adapter if isinstance(inner, HydraEnsemble) else get_adapter(inner)
    config = _config(inner)
    if "pixel_values" in adapter.required_inputs:
        vision = getattr(config, "vision_config", config)
        size = vision.image_size if isinstance(vision.image_size, (list, tuple)) else [vision.image_size] * 2
        return {"pixel_values": torch.zeros(1, vision.num_channels, *size)}  # DINOv3's may be (height, width)
    text = getattr(config, "text_config", config)
    tokens = min(PROBE_TOKENS, getattr(text, "max_position_embeddings", PROBE_TOKENS) - 2)
    ids = torch.ones(1, tokens, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _members_record(path: Path | None, hops: int = 4) -> dict | None:
    """The `members` step record the model at `path` descends from, following the CLI records' inputs."""
    where = path.parent if path is not None else None
    for _ in range(hops):
        if where is None or not (where / RECORD).is_file():
            return None
        record = json.loads((where / RECORD).read_text())
        if record.get("command") == "members":
            return record
        settings = record.get("settings", {})
        source = settings.get("members") or settings.get("model")
        where = Path(source["path"]) if isinstance(source, dict) and "path" in source else None
    return None
