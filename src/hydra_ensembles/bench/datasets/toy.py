"""Small data sets of the distillation paper (001): the spiral toy set and a bundled regression set."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Splits:
    """Inputs and targets of train / val / test (float32 inputs; long labels or float targets)."""

    train: tuple[Tensor, Tensor]
    val: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]


def spiral(per_class: int = 300, classes: int = 3, noise: float = 0.15, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Interleaved spiral arms in 2-D, one per class (radius 0..1 over 1.5 turns, scaled to 4), with Gaussian
    noise of std `noise`: inputs (classes * per_class, 2), labels (classes * per_class,)."""
    g = torch.Generator().manual_seed(seed)
    radius = torch.linspace(0.05, 1.0, per_class)
    parts, labels = [], []
    for c in range(classes):
        angle = 3 * math.pi * radius + 2 * math.pi * c / classes
        points = 4 * radius[:, None] * torch.stack([angle.cos(), angle.sin()], dim=1)
        parts.append(points + noise * torch.randn(per_class, 2, generator=g))
        labels.append(torch.full((per_class,), c))
    return torch.cat(parts), torch.cat(labels)


def spiral_splits(seed: int = 0) -> Splits:
    """Three independent draws of the spiral (600 / 300 / 600 points) for train, val and test, each in a seeded
    random order: `spiral` lists its points arm by arm, so batches cut in that order held one class each."""
    draws = [spiral(200, seed=3 * seed), spiral(100, seed=3 * seed + 1), spiral(200, seed=3 * seed + 2)]
    shuffled = []
    for i, (x, y) in enumerate(draws):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(3 * seed + i))
        shuffled.append((x[order], y[order]))
    return Splits(*shuffled)


def spiral_ood(count: int = 600, seed: int = 0) -> Tensor:
    """Points on a ring outside the spirals (radius 5.5 to 8): out of distribution. (count, 2)"""
    g = torch.Generator().manual_seed(10_000 + seed)
    angle = 2 * math.pi * torch.rand(count, generator=g)
    radius = 5.5 + 2.5 * torch.rand(count, generator=g)
    return radius[:, None] * torch.stack([angle.cos(), angle.sin()], dim=1)


def diabetes_splits(seed: int = 0) -> tuple[Splits, float]:
    """scikit-learn's bundled diabetes regression set (442 patients, 10 features), split 60 / 20 / 20 at random,
    standardised on the training split; and the targets' training std (NLL in the original units: + log std)."""
    from sklearn.datasets import load_diabetes  # the `data` extra: bundled with scikit-learn, no download

    x, y = load_diabetes(return_X_y=True)
    x, y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut1, cut2 = int(0.6 * len(x)), int(0.8 * len(x))
    parts = [order[:cut1], order[cut1:cut2], order[cut2:]]
    x_mean, x_std = x[parts[0]].mean(0), x[parts[0]].std(0)
    y_mean, y_std = y[parts[0]].mean(), y[parts[0]].std()
    split = [((x[p] - x_mean) / x_std, (y[p] - y_mean) / y_std) for p in parts]
    return Splits(*split), y_std.item()
