"""A small, seeded classifier fine-tuning loop: AdamW, linear warm-up then linear decay, gradient clipping.

The text recipe of paper 000 (§C.2, §D.2) scaled down: decoupled weight decay 0.01 (not on biases and norms),
warm-up over 10% of the steps, clipping at 1.0.

Data-parallel under `torchrun --nproc-per-node N`: the model is wrapped in DistributedDataParallel and each
rank takes every N-th example of each batch, so a step averages the gradient over the whole batch, as one
process would.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from tqdm.auto import tqdm

from .adapters import get_adapter
from .data.loaders import Batch, materialize, split_batch, to_device
from .distributed import is_distributed, is_main, rank, world_size


def finetune_classifier(
    model: nn.Module,
    loader: Iterable[Batch],
    *,
    epochs: int = 1,
    lr: float = 5e-5,
    weight_decay: float = 0.01,
    warmup: float = 0.1,
    seed: int = 0,
    progress: bool = True,
) -> nn.Module:
    """Fine-tune `model` in place on labelled batches (reshuffled each epoch by `seed`); returns it in eval mode."""
    adapter = get_adapter(model)
    if not adapter.is_classifier(model):
        raise ValueError(f"{type(model).__name__} has no classifier to fine-tune.")
    batches = materialize(loader, "training loader")
    if any(batch.get("labels") is None for batch in batches):
        raise ValueError("training batches need 'labels'.")
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout masks
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    no_decay = [p for n, p in trainable if n.endswith("bias") or "norm" in n.lower()]
    decay = [p for n, p in trainable if not (n.endswith("bias") or "norm" in n.lower())]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )
    total = epochs * len(batches)
    warm = max(1, int(warmup * total))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warm, max(0.0, (total - step) / max(1, total - warm)))
    )
    device = next(model.parameters()).device
    runner = nn.parallel.DistributedDataParallel(model) if is_distributed() else model
    model.train()
    with tqdm(total=total, desc="fine-tuning", disable=not progress or not is_main()) as bar:
        for _ in range(epochs):
            for index in torch.randperm(len(batches), generator=generator).tolist():
                inputs, labels = split_batch(adapter, _my_rows(batches[index]))
                logits = adapter.output(runner, to_device(inputs, device))
                loss = nn.functional.cross_entropy(logits, labels.to(device))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                schedule.step()
                bar.update()
                bar.set_postfix(loss=f"{loss.item():.3f}")
    return model.eval()


def _my_rows(batch: Batch) -> Batch:
    """This rank's rows of a batch (every world_size-th example), or the batch itself on one process."""
    if not is_distributed():
        return batch
    rows = slice(rank(), None, world_size())
    return {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
