"""The real image data sets behind the image tables (bench/datasets/images.py; ../shared/DATA.md): their published
sizes, shapes and value ranges, and the OOD validation crops' determinism."""

import hashlib

import pytest
import torch

from hydra_ensembles.bench.datasets import images

SIZE = (28, 28)


def _digests(x: torch.Tensor) -> set[bytes]:
    return {hashlib.sha1(row.numpy().tobytes()).digest() for row in x}


def _grey(x: torch.Tensor, count: int) -> None:
    """`count` grey 28x28 float images in [0, 1] that use the range (not all black, not all one value)."""
    assert x.shape == (count, *SIZE) and x.dtype == torch.float32
    assert x.min() >= 0 and x.max() <= 1 and x.max() - x.min() > 0.5
    assert len(_digests(x)) > 0.99 * count  # distinct images


@pytest.mark.parametrize("split, count", [("train", 60_000), ("test", 10_000)])
def test_fashion_mnist_has_its_published_splits_and_balanced_labels(split, count):
    x, y = images.load_fashion_mnist(split)
    _grey(x, count)
    assert y.dtype == torch.long and torch.equal(torch.bincount(y), torch.full((10,), count // 10))
    assert len(images.FASHION_CLASSES) == 10


def test_fashion_mnist_test_images_are_not_training_images():
    assert not _digests(images.load_fashion_mnist("train")[0]) & _digests(images.load_fashion_mnist("test")[0])


def test_a_wrong_split_names_the_choices():
    with pytest.raises(ValueError, match="'train' or 'test'"):
        images.load_fashion_mnist("val")


def test_ood_digit_sets_have_their_published_sizes():
    _grey(images.load_mnist(), 5_000)
    _grey(images.load_digits(), 1_797)


@pytest.mark.real_model  # 91 MB of 300x300 images, ~15 s to read and downsample
def test_solar_cells_have_their_published_size():
    _grey(images.load_solar_cells(), 2_624)
