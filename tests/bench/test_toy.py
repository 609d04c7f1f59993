"""The distillation experiments' small data sets."""

import torch

from hydra_ensembles.bench.datasets.toy import diabetes_splits, spiral, spiral_ood, spiral_splits


def test_spiral_arms_are_balanced_and_the_ood_ring_lies_outside_them():
    x, y = spiral(50, classes=3, seed=0)
    assert x.shape == (150, 2) and torch.equal(torch.bincount(y), torch.tensor([50, 50, 50]))
    assert x.norm(dim=1).max() < 5.0 < spiral_ood(100).norm(dim=1).min()
    splits = spiral_splits(1)
    assert not torch.equal(splits.train[0][:10], splits.test[0][:10])  # independent draws


def test_diabetes_is_split_and_standardised_on_train():
    splits, y_std = diabetes_splits(0)
    sizes = [len(part[0]) for part in (splits.train, splits.val, splits.test)]
    assert sum(sizes) == 442 and sizes[0] == 265 and y_std > 10
    x, y = splits.train
    assert x.mean(0).abs().max() < 1e-5 and (y.std() - 1).abs() < 1e-5
