"""Fine-tuning of members and baselines: seeded, checkpointed every epoch, resumable, data-parallel.

Two recipes from paper 000, scaled to our data:
- `TEXT_RECIPE` (§C.2, §D.2 BERT/SST-2): AdamW with decoupled weight decay 0.01 (not on biases and norms),
  linear warm-up over 10% of the steps then linear decay to zero, gradient clipping at 1.0, early stopping on
  validation accuracy (patience 2, delta 5e-4), the epoch with the best validation accuracy kept.
- `IMAGE_RECIPE` (§C.1, §D.2 ViT): SGD with momentum 0.9, no weight decay, linear warm-up then cosine decay to
  a floor of 1e-5 x lr, label smoothing 0.1; "stop at validation convergence": the best validation NLL.
Both take `train_last=k` to update only the last k blocks (plus the final norm and the head) — the paper's
partial unfreezing — and `freeze_embeddings`.

Under `torchrun --nproc-per-node N` the model is wrapped in DistributedDataParallel and each rank takes every
N-th example of each batch, so a step averages the gradient over the whole batch, as one process would.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from tqdm.auto import tqdm

from .adapters import Adapter, get_adapter
from .data.loaders import Batch, materialize, split_batch, to_device
from .distributed import barrier, is_distributed, is_main, rank, world_size
from .metrics import accuracy


@dataclass(frozen=True)
class TrainConfig:
    """How to fine-tune. `warmup` is a fraction of all steps; `min_lr` a fraction of `lr` (cosine only)."""

    epochs: int = 3
    lr: float = 5e-5
    optimizer: Literal["adamw", "sgd"] = "adamw"
    weight_decay: float = 0.01
    momentum: float = 0.9
    warmup: float = 0.1
    schedule: Literal["linear", "cosine"] = "linear"
    min_lr: float = 0.0
    label_smoothing: float = 0.0
    clip: float | None = 1.0
    train_last: int | None = None
    freeze_embeddings: bool = False
    patience: int | None = None
    monitor: Literal["nll", "acc"] = "nll"  # what picks the best epoch when a validation loader is given
    min_delta: float = 5e-4
    seed: int = 0

    def with_(self, **changes) -> TrainConfig:
        return replace(self, **changes)


TEXT_RECIPE = TrainConfig(
    epochs=3,
    lr=5e-5,
    optimizer="adamw",
    weight_decay=0.01,
    warmup=0.1,
    schedule="linear",
    clip=1.0,
    patience=2,
    monitor="acc",
)
IMAGE_RECIPE = TrainConfig(
    epochs=10,
    lr=0.01,
    optimizer="sgd",
    weight_decay=0.0,
    momentum=0.9,
    warmup=0.05,
    schedule="cosine",
    min_lr=1e-5,
    label_smoothing=0.1,
    clip=1.0,
)

CHECKPOINT = "checkpoint.pt"


def finetune(
    model: nn.Module,
    train_loader: Iterable[Batch],
    config: TrainConfig = TEXT_RECIPE,
    *,
    val_loader: Iterable[Batch] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> nn.Module:
    """Fine-tune a classifier in place; returns it in eval mode (with its best-validation weights if
    `val_loader` is given).

    With a validation loader, the epoch with the best `config.monitor` ("acc": highest accuracy, "nll": lowest
    NLL; an improvement must exceed `min_delta`, so a tie keeps the earlier epoch) is kept, and training stops
    after `patience` epochs without one. `model.training_history` lists every epoch; `model.kept_epoch` is the
    epoch whose weights were returned (the last one without a validation loader).

    Batches are reshuffled every epoch from `config.seed`, and dropout is seeded per epoch, so a run is
    reproducible and a run resumed from `checkpoint_dir` (written atomically after every epoch) ends with the
    same weights as an uninterrupted one. A checkpoint written under a different config is refused.
    """
    adapter = get_adapter(_unwrapped(model))
    if config.monitor not in ("nll", "acc"):
        raise ValueError(f"monitor must be 'nll' or 'acc', got {config.monitor!r}.")
    if not adapter.is_classifier(_unwrapped(model)):
        raise ValueError(f"{type(_unwrapped(model)).__name__} has no classifier to fine-tune.")
    batches = materialize(train_loader, "training loader")
    if any(batch.get("labels") is None for batch in batches):
        raise ValueError("training batches need 'labels'.")
    val_batches = materialize(val_loader, "validation loader") if val_loader is not None else None
    trainable = _select_trainable(model, adapter, config)
    optimizer = _optimizer(trainable, config)
    total = config.epochs * len(batches)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(config, total))
    state = {"epoch": 0, "history": [], "best": None, "best_epoch": None, "best_score": -math.inf, "stale": 0}
    path = Path(checkpoint_dir) / CHECKPOINT if checkpoint_dir is not None else None
    if path is not None and path.exists():
        state = _resume(path, model, optimizer, schedule, config)
    device = next(model.parameters()).device
    runner = nn.parallel.DistributedDataParallel(model) if is_distributed() else model
    done = state["epoch"] * len(batches)
    with tqdm(total=total, initial=done, desc="fine-tuning", disable=not progress or not is_main()) as bar:
        for epoch in range(state["epoch"], config.epochs):
            if config.patience is not None and state["stale"] >= config.patience:
                break
            model.train()
            torch.manual_seed(config.seed * 1000 + epoch)  # dropout masks
            order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(config.seed * 1000 + epoch))
            losses = []
            for index in order.tolist():
                inputs, labels = split_batch(adapter, _my_rows(batches[index]))
                logits = adapter.output(runner, to_device(inputs, device))
                loss = nn.functional.cross_entropy(logits, labels.to(device), label_smoothing=config.label_smoothing)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if config.clip is not None:
                    nn.utils.clip_grad_norm_(trainable, config.clip)
                optimizer.step()
                schedule.step()
                losses.append(loss.item())
                bar.update()
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.3f}")
            record = {"epoch": epoch + 1, "loss": sum(losses) / len(losses)}
            if val_batches is not None:
                record.update(_validate(model, adapter, val_batches))
                score = -record["val_nll"] if config.monitor == "nll" else record["val_acc"]  # higher = better
                if score > state["best_score"] + config.min_delta:
                    state["best_score"], state["stale"], state["best_epoch"] = score, 0, epoch + 1
                    state["best"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
                else:
                    state["stale"] += 1
            state["history"].append(record)
            state["epoch"] = epoch + 1
            if path is not None and is_main():
                _save(path, model, optimizer, schedule, config, state)
            barrier()
    if state["best"] is not None:
        model.load_state_dict(state["best"])
    model.training_history = state["history"]
    model.kept_epoch = state.get("best_epoch") or state["epoch"]
    return model.eval()


def _select_trainable(model: nn.Module, adapter: Adapter, config: TrainConfig) -> list[nn.Parameter]:
    """Freeze what the config keeps fixed; return the parameters left to train (those trainable already)."""
    base = _unwrapped(model)
    embedding_prefixes = tuple(adapter.full_path(base, p) + "." for p in adapter.embedding_paths)
    layers_prefix = adapter.full_path(base, adapter.layers_path) + "."
    num_layers = adapter.num_layers(base)
    for name, param in base.named_parameters():
        if config.freeze_embeddings and name.startswith(embedding_prefixes):
            param.requires_grad_(False)
        if config.train_last is not None:
            if name.startswith(embedding_prefixes):
                param.requires_grad_(False)
            elif name.startswith(layers_prefix):
                layer = int(name[len(layers_prefix) :].split(".")[0])
                if layer < num_layers - config.train_last:
                    param.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("nothing to train: every parameter is frozen.")
    return trainable


def _optimizer(params: list[nn.Parameter], config: TrainConfig) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    if config.optimizer != "adamw":
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {config.optimizer!r}.")
    decay = [p for p in params if p.dim() >= 2]  # matrices; biases and norm weights are 1-D and not decayed
    rest = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr)


def _lr_lambda(config: TrainConfig, total: int):
    warm = max(1, int(config.warmup * total))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, total - warm)
        if config.schedule == "cosine":
            return config.min_lr + (1 - config.min_lr) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        return max(0.0, 1 - progress)

    if config.schedule not in ("linear", "cosine"):
        raise ValueError(f"schedule must be 'linear' or 'cosine', got {config.schedule!r}.")
    return factor


@torch.no_grad()
def _validate(model: nn.Module, adapter: Adapter, batches: list[Batch]) -> dict[str, float]:
    """Validation accuracy and NLL of a classifier."""
    model.eval()
    device = next(model.parameters()).device
    logits, labels = [], []
    for batch in batches:
        inputs, batch_labels = split_batch(adapter, batch)
        logits.append(adapter.output(model, to_device(inputs, device)).float().cpu())
        labels.append(torch.as_tensor(batch_labels))
    logits, labels = torch.cat(logits), torch.cat(labels)
    return {"val_acc": accuracy(logits, labels), "val_nll": nn.functional.cross_entropy(logits, labels).item()}


def _save(path: Path, model, optimizer, schedule, config: TrainConfig, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    payload = {
        "config": asdict(config),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "state": state,
    }
    torch.save(payload, tmp)
    os.replace(tmp, path)


def _resume(path: Path, model, optimizer, schedule, config: TrainConfig) -> dict:
    payload = torch.load(path, map_location=next(model.parameters()).device, weights_only=False)
    if payload["config"] != asdict(config):
        changed = sorted(k for k in payload["config"] if payload["config"][k] != asdict(config).get(k))
        raise ValueError(
            f"the checkpoint at {str(path)!r} was written with a different config ({changed}); "
            "delete it or pass another checkpoint_dir."
        )
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    schedule.load_state_dict(payload["schedule"])
    return payload["state"]


def _unwrapped(model: nn.Module) -> nn.Module:
    """The HF model inside a PEFT wrapper (LoRA), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _my_rows(batch: Batch) -> Batch:
    """This rank's rows of a batch (every world_size-th example), or the batch itself on one process."""
    if not is_distributed():
        return batch
    rows = slice(rank(), None, world_size())
    return {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
