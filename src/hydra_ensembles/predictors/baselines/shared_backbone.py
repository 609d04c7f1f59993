"""Deep Ensembles (D), the paper's cheaper deep ensemble: one fine-tuned backbone and M classifier heads trained
on its frozen features with different seeds, fused so the backbone runs once (the shared trunk)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ...adapters import get_adapter
from ...data.loaders import Batch, materialize, split_batch, to_device
from ...fusion import HydraEnsemble
from ...seeding import seeded
from .heads import head_parameters, reset_classifier


def shared_backbone_ensemble(
    model: nn.Module,
    train_loader: Iterable[Batch],
    seeds: Sequence[int] = (0, 1, 2),
    *,
    epochs: int = 10,
    lr: float = 1e-3,
    progress: bool = True,
) -> HydraEnsemble:
    """Deep Ensembles (D): M heads (everything after the last layer; the final classifier re-initialised from
    each seed) trained with AdamW on the frozen backbone's features, fused so the backbone runs once."""
    adapter = get_adapter(model)
    batches = materialize(train_loader, "training loader")
    features = _features(model, batches)
    members = []
    for seed in seeds:
        member = copy.deepcopy(model)
        reset_classifier(member, seed)
        head = head_parameters(member, adapter)
        optimizer = torch.optim.AdamW(head, lr=lr, weight_decay=0.01)
        generator = torch.Generator().manual_seed(seed)
        member.train()
        with seeded(seed, next(member.parameters()).device):  # the heads' dropout masks too
            for _ in tqdm(range(epochs), desc=f"head, seed {seed}", disable=not progress, leave=False):
                for index in torch.randperm(len(features), generator=generator).tolist():
                    hidden, inputs, labels = features[index]
                    logits = adapter.head(member, hidden, to_device(inputs, hidden.device))
                    loss = nn.functional.cross_entropy(logits, labels)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
        members.append(member.eval())
    return HydraEnsemble.fuse(members, mlp="stack")


@torch.no_grad()
def _features(model: nn.Module, batches: list[Batch]) -> list[tuple[Tensor, dict, Tensor]]:
    """(last-layer hidden states of the tokens the head reads, inputs, labels) for every batch."""
    engine = HydraEnsemble.fuse([model])
    adapter, device = get_adapter(model), next(model.parameters()).device
    out = []
    for batch in batches:
        inputs, labels = split_batch(adapter, batch)  # kept where given (the CPU): the heads read little of them
        x, mask = engine.embed(to_device(inputs, device))
        hidden = engine.run_layers(x, mask, queries=engine.head_tokens)[0]  # (B, q, d)
        out.append((hidden, inputs, torch.as_tensor(labels, device=device)))
    return out
