"""A tiny BERT classifier and validation data on which a circuit search has something to find.

At HF's init (weights std 0.02) the tiny BERT's logits are ~0.03 and hardly depend on any head: on 8 examples
nearly every candidate leaves the winner's S, both searches return index order, and a scorer that ignores the
removed head passes. Here every linear weight is 10x (std 0.2, logits O(1)) and 24 ID examples carry labels
drawn at random (a draw, seed 5, chosen so that S_acc does not tie either), beside 24 OOD examples: removing a
head moves S_acc, S_ood and S_avg, and in the first four steps of each search no candidate ties with the winner
(measured; the tests assert it), so the removal order is the scores' and not index order.

`tied_data` is the opposite: the tiny model at HF's init on 8 ID / 8 OOD examples, where every candidate leaves
the winner's S_acc (and nearly every one its S_avg), so only the tie rule decides: under "order" the search
returns index order, under "score" the criterion's secondary score ranks the heads.
"""

from __future__ import annotations

import torch
from conftest import HEADS, LAYERS, MODELS, make_inputs

WEIGHT_SCALE = 10.0
EXAMPLES, BATCH = 24, 12
CANDIDATES = [(layer, h) for layer in range(LAYERS) for h in range(HEADS)]  # index order


def circuit_model(seed: int = 0) -> torch.nn.Module:
    """MODELS["bert"](seed) with every linear weight scaled by WEIGHT_SCALE."""
    model = MODELS["bert"](seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.mul_(WEIGHT_SCALE)
    return model


def tied_data(name: str = "bert") -> tuple[list[dict], list[dict]]:
    """(ID batches with labels, OOD batches) for MODELS[name]: 8 examples each, in batches of 4."""
    id_batches = [make_inputs(name, seed=s) | {"labels": torch.tensor([0, 1, 2, 1])} for s in (1, 2)]
    ood_batches = [make_inputs(name, seed=s) for s in (3, 4)]
    return id_batches, ood_batches


def circuit_data() -> tuple[list[dict], list[dict]]:
    """(ID batches with labels, OOD batches): EXAMPLES each, in batches of BATCH (padded rows of varied lengths)."""
    labels = torch.randint(0, 3, (EXAMPLES,), generator=torch.Generator().manual_seed(5))
    id_batches = [
        make_inputs("bert", batch=BATCH, seed=1 + i) | {"labels": labels[i * BATCH : (i + 1) * BATCH]}
        for i in range(EXAMPLES // BATCH)
    ]
    ood_batches = [make_inputs("bert", batch=BATCH, seed=101 + i) for i in range(EXAMPLES // BATCH)]
    return id_batches, ood_batches
