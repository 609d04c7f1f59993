"""The distillation experiments' small data sets."""

import copy

import torch

from hydra_ensembles.bench.datasets.toy import diabetes_splits, spiral, spiral_ood, spiral_splits
from hydra_ensembles.bench.distillation import MLP_CONFIG
from hydra_ensembles.distill import MultiHeadMLP
from hydra_ensembles.training import CrossEntropy, train


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


def test_every_spiral_batch_mixes_the_classes():
    """spiral lists its points arm by arm: batches of 64 cut in that order held one class (or two) each."""
    splits = spiral_splits(0)
    for _, y in (splits.train, splits.val, splits.test):
        assert all(len(y[i : i + 64].unique()) == 3 for i in range(0, len(y) - 63, 64))


def test_the_mlp_ensembles_members_train_apart():
    """The benchmark's MLP ensemble is M networks in one pass: clipping the norm of all their gradients together
    (TrainConfig's default clip) scaled each member's step by the others'. Member 0 must train as it would alone,
    whatever the other members hold."""
    x, y = spiral_splits(0).train
    batches = [{"inputs": x[i : i + 64], "labels": y[i : i + 64]} for i in range(0, 256, 64)]
    first = MultiHeadMLP(2, 3, body=(), head=(16,), heads=3, seed=0)
    second = copy.deepcopy(first)
    with torch.no_grad():  # other members, far larger gradients (each parameter stacks the members: (M, ...))
        for parameter in second.parameters():
            parameter[1:].mul_(10)
    config = MLP_CONFIG.with_(epochs=3)
    for model in (first, second):
        train(model, batches, config, loss=CrossEntropy(), progress=False)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first.parameters(), second.parameters(), strict=True))
