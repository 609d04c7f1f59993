"""LoRA ensembles: M LoRA fine-tunes (r = 4, alpha = 8 on the attention projections, paper 000 §C.1.4) with
different seeds, merged into plain HF models."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable, Sequence

from torch import nn

from ...adapters import get_adapter
from ...data.loaders import Batch
from ...seeding import seeded
from ...training import TrainConfig, finetune
from .deep_ensemble import DeepEnsemble
from .heads import reset_classifier


def lora_ensemble(
    model: nn.Module,
    train_loader: Iterable[Batch],
    config: TrainConfig,
    seeds: Sequence[int] = (0, 1, 2),
    *,
    rank: int = 4,
    alpha: int = 8,
    fresh_classifier: bool = True,
    val_loader: Iterable[Batch] | None = None,
    progress: bool = True,
) -> DeepEnsemble:
    """M LoRA fine-tunes of `model` (adapters on the attention query and value projections, the head trained
    in full), merged into plain HF models. `stored_parameters` counts the shared base once plus each member's
    adapters and head."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:  # pragma: no cover - peft is a pinned dependency
        raise ImportError("LoRA ensembles need peft: pip install peft==0.21.2") from error
    adapter = get_adapter(model)
    names = adapter.layer_names
    targets = sorted({names.query.rsplit(".", 1)[-1], names.value.rsplit(".", 1)[-1]})
    backbone = adapter.backbone_path(model).split(".")[0]
    head_modules = [n for n, m in model.named_children() if n != backbone and any(True for _ in m.parameters())]
    members, stored = [], sum(p.numel() for p in model.parameters())
    for seed in seeds:
        member = copy.deepcopy(model)
        if fresh_classifier:
            reset_classifier(member, seed)
        lora_config = LoraConfig(
            r=rank, lora_alpha=alpha, lora_dropout=0.1, target_modules=targets, modules_to_save=head_modules
        )
        with warnings.catch_warnings():  # peft 0.21.2 reads transformers v5's deprecated `is_gradient_checkpointing`
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            with seeded(seed, next(member.parameters()).device):  # LoRA's A matrices: drawn from the member's seed
                peft_model = get_peft_model(member, lora_config)
        stored += sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        finetune(peft_model, train_loader, config.with_(seed=seed), val_loader=val_loader, progress=progress)
        members.append(peft_model.merge_and_unload().eval())
    return DeepEnsemble(members, stored_parameters=stored)
