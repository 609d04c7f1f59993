"""The classifier head of an HF model: re-initialising it from a seed, and its parameters (what the
Deep Ensembles (D) and LoRA baselines train anew per member)."""

from __future__ import annotations

import torch
from torch import nn

from ...adapters import Adapter, get_adapter


def reset_classifier(model: nn.Module, seed: int) -> None:
    """Re-initialise, from `seed`, the linear layers after the encoder that output the class logits."""
    adapter = get_adapter(model)
    classes = model.config.num_labels
    std = getattr(adapter.config(model), "initializer_range", 0.02)
    generator = torch.Generator().manual_seed(seed)
    found = False
    for name, module in model.named_modules():
        inside = name.startswith(adapter.full_path(model, adapter.layers_path)) or not name
        if isinstance(module, nn.Linear) and module.out_features == classes and not inside:
            with torch.no_grad():
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)
                if module.bias is not None:
                    module.bias.zero_()
            found = True
    if not found:
        raise ValueError(f"found no classifier layer with {classes} outputs in {type(model).__name__}.")


def head_parameters(model: nn.Module, adapter: Adapter) -> list[nn.Parameter]:
    """Parameters outside the embeddings and the layers: final norm, pooler, classifier."""
    return [p for name, p in model.named_parameters() if adapter.locate(model, name)[0] == "head"]
