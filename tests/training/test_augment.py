"""Image augmentation on tensors: random resized crop and horizontal flip, seeded, applied by the training loop
to training batches only when the config asks for it."""

import math

import pytest
import torch
from conftest import MODELS, make_inputs

from hydra_ensembles import training as ft
from hydra_ensembles.training.augment import CropFlip, crop_box, horizontal_flip, random_resized_crop


def _pixels(batch=6, seed=0):
    return torch.randn(batch, 3, 16, 12, generator=torch.Generator().manual_seed(seed))


def _seeded(seed):
    return torch.Generator().manual_seed(seed)


def test_shapes_are_kept_and_draws_are_deterministic_by_seed():
    pixels, batch = _pixels(), {"pixel_values": _pixels(), "labels": torch.arange(6)}
    out = CropFlip()(batch, _seeded(1))
    assert out["pixel_values"].shape == pixels.shape and out["pixel_values"].dtype == pixels.dtype
    assert out["labels"] is batch["labels"] and torch.equal(batch["pixel_values"], pixels)  # input untouched
    assert torch.equal(out["pixel_values"], CropFlip()(batch, _seeded(1))["pixel_values"])
    assert not torch.equal(out["pixel_values"], CropFlip()(batch, _seeded(2))["pixel_values"])
    assert not torch.equal(out["pixel_values"], pixels)


def test_crops_keep_to_the_scale_and_ratio_ranges():
    g = _seeded(3)
    for _ in range(200):
        top, left, h, w = crop_box(64, 48, g, (0.08, 1.0), (3 / 4, 4 / 3))
        assert 0 <= top and top + h <= 64 and 0 <= left and left + w <= 48
        assert 0.07 * 64 * 48 <= h * w <= 64 * 48
    assert crop_box(10, 40, g, (1.0, 1.0), (1.0, 1.0)) == (0, 15, 10, 10)  # no fit: the central crop at the ratio
    # on a large image (rounding small), with areas that always fit (no draw rejected, so none biased): the aspect
    # ratio w / h within its range and log-uniform, the area within its range (a w / h swap or a linear ratio draw
    # would fail here)
    boxes = [crop_box(640, 480, g, (0.08, 0.5), (3 / 4, 4 / 3)) for _ in range(2000)]
    log_ratios = torch.tensor([math.log(w / h) for _, _, h, w in boxes])
    assert log_ratios.min() >= math.log(3 / 4) - 0.02 and log_ratios.max() <= math.log(4 / 3) + 0.02
    assert abs(log_ratios.mean().item()) < 0.02 and 0.45 < (log_ratios < 0).float().mean().item() < 0.55
    areas = torch.tensor([h * w / (640 * 480) for _, _, h, w in boxes])
    assert areas.min() >= 0.08 - 0.005 and areas.max() <= 0.5 + 0.005


def test_a_whole_image_crop_is_the_identity_and_a_flip_is_a_flip():
    pixels = _pixels()
    whole = random_resized_crop(pixels, _seeded(0), scale=(1.0, 1.0), ratio=(12 / 16, 12 / 16))
    torch.testing.assert_close(whole, pixels, atol=1e-6, rtol=0)
    assert torch.equal(horizontal_flip(pixels, _seeded(0), 1.0), pixels.flip(-1))
    assert torch.equal(horizontal_flip(pixels, _seeded(0), 0.0), pixels)
    half = horizontal_flip(_pixels(64), _seeded(0), 0.5)
    flipped = [torch.equal(half[i], _pixels(64)[i].flip(-1)) for i in range(64)]
    kept = [torch.equal(half[i], _pixels(64)[i]) for i in range(64)]
    assert all(f != k for f, k in zip(flipped, kept)) and 16 < sum(flipped) < 48


def _seen_by_the_loop(config):
    """The pixel batches the loop's forward was given, one epoch over three batches."""
    seen = []

    def forward(model, inputs):
        seen.append(inputs["pixel_values"].clone())
        return model(**inputs).logits

    data = [make_inputs("vit", seed=5 + i) | {"labels": torch.arange(4)} for i in range(3)]
    ft.train(MODELS["vit"](), data, config, loss=ft.CrossEntropy(), forward=forward, progress=False)
    return seen, data


def test_the_loop_augments_training_batches_only_when_asked_and_the_key_is_unchanged_when_not():
    config = ft.IMAGE_RECIPE.with_(epochs=1)
    plain, data = _seen_by_the_loop(config)
    assert sorted(p.sum().item() for p in plain) == sorted(d["pixel_values"].sum().item() for d in data)  # identity
    augmented, _ = _seen_by_the_loop(config.with_(augment="crop_flip"))
    assert [p.shape for p in augmented] == [p.shape for p in plain]
    assert all(not torch.equal(a, p) for a, p in zip(augmented, plain))
    assert all(torch.equal(a, b) for a, b in zip(augmented, _seen_by_the_loop(config.with_(augment="crop_flip"))[0]))
    assert "augment" not in config.key() and "augment" not in repr(config)  # cached models keep their keys
    assert config.with_(augment="crop_flip").key()["augment"] == "crop_flip"
    with pytest.raises(ValueError, match="augment must be"):
        config.with_(augment="mixup")
    with pytest.raises(ValueError, match="pixel_values"):
        CropFlip()({"input_ids": torch.zeros(2, 3)}, _seeded(0))
