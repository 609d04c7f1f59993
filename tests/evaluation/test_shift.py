"""Shift curves (evaluation/shift.py): every shift is the identity at severity 0, changes its input more at each
higher severity, is deterministic under a seed and keeps shapes; the curve's clean point is the plain evaluation's
metrics; wrong names, modalities and severities are ValueErrors that say what to give."""

from __future__ import annotations

import difflib

import numpy as np
import pytest
import torch
import transformers as T

from hydra_ensembles.evaluation import plots
from hydra_ensembles.evaluation.report import classification_metrics
from hydra_ensembles.evaluation.shift import (
    SHIFTS,
    PixelSpace,
    curve_lines,
    mean_over_shifts,
    shift_curve,
    shift_images,
    shift_texts,
    shifted_loader,
    shifts_of,
    text_data,
)
from hydra_ensembles.outputs import collect_member_logits, labels_of
from hydra_ensembles.uncertainty import decompose

WORDS = "match goal team player coach league vote minister party election market shares profit bank".split()
TEXTS = [" ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(6 + i % 5)) for i in range(40)]
HALF = PixelSpace((0.5,), (0.5,))  # a ViT image processor's default: pixel_values = 2x - 1


def _images(seed: int = 0, side: int = 40) -> torch.Tensor:
    """Smooth [0, 1] images (B=4, C=3): a gradient plus mild noise, away from 0 and 1."""
    g = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(0.3, 0.7, side)
    return (
        ramp[None, None, :, None] * ramp[None, None, None, :] + 0.05 * torch.rand(4, 3, side, side, generator=g)
    ).clamp(0, 1)


# How far each image shift moved a [0, 1] image from the clean one: must grow with severity.
def _noise(clean, shifted):
    return (shifted - clean).std().item()


def _roughness(clean, shifted):  # total variation, lower when blurred: negated so that more shift = larger
    return -((shifted.diff(dim=-1).abs().mean() + shifted.diff(dim=-2).abs().mean()).item())


def _flatness(clean, shifted):
    return -shifted.std(dim=(1, 2, 3)).mean().item()


def _lightness(clean, shifted):
    return shifted.mean().item()


def _blockiness(clean, shifted):  # fewer distinct values as the blocks grow
    return -len(torch.unique(shifted[0, 0]))


IMAGE_MEASURES = {
    "gaussian_noise": _noise,
    "gaussian_blur": _roughness,
    "contrast": _flatness,
    "brightness": _lightness,
    "pixelate": _blockiness,
}


def _dissimilarity(clean: list[str], shifted: list[str]) -> float:
    return sum(1 - difflib.SequenceMatcher(None, a, b).ratio() for a, b in zip(clean, shifted, strict=True))


def _words_lost(clean: list[str], shifted: list[str]) -> int:
    return sum(len(a.split()) - len(b.split()) for a, b in zip(clean, shifted, strict=True))


def _words_moved(clean: list[str], shifted: list[str]) -> int:
    return sum(x != y for a, b in zip(clean, shifted, strict=True) for x, y in zip(a.split(), b.split(), strict=True))


TEXT_MEASURES = {"char_typos": _dissimilarity, "word_dropout": _words_lost, "word_swap": _words_moved}


def test_every_shift_is_measured_here():
    assert set(IMAGE_MEASURES) == set(shifts_of("image")) and set(TEXT_MEASURES) == set(shifts_of("text"))
    assert all(len(shift.levels) == 5 for shift in SHIFTS.values())


@pytest.mark.parametrize("name", list(IMAGE_MEASURES))
def test_an_image_shift_grows_with_severity_and_is_the_identity_at_zero(name):
    clean = _images()
    assert shift_images(clean, name, 0) is clean
    degrees = [IMAGE_MEASURES[name](clean, shift_images(clean, name, s)) for s in range(1, 6)]
    assert all(a < b for a, b in zip(degrees, degrees[1:])), degrees
    assert IMAGE_MEASURES[name](clean, clean) < degrees[0]


@pytest.mark.parametrize("name", list(TEXT_MEASURES))
def test_a_text_shift_grows_with_severity_and_is_the_identity_at_zero(name):
    assert shift_texts(TEXTS, name, 0) == TEXTS
    degrees = [TEXT_MEASURES[name](TEXTS, shift_texts(TEXTS, name, s)) for s in range(1, 6)]
    assert 0 < degrees[0] and all(a < b for a, b in zip(degrees, degrees[1:])), degrees


def test_word_dropout_drops_a_growing_subset_and_never_empties_a_text():
    shifted = [shift_texts(TEXTS, "word_dropout", s) for s in range(6)]
    for lighter, heavier in zip(shifted, shifted[1:]):
        for a, b in zip(lighter, heavier, strict=True):
            assert set(b.split()) <= set(a.split()) and b
    assert shift_texts(["one"], "word_dropout", 5, seed=3) == ["one"]


@pytest.mark.parametrize("name", list(SHIFTS))
def test_shifts_are_deterministic_under_a_seed(name):
    if SHIFTS[name].modality == "text":
        first, again, other = (shift_texts(TEXTS, name, 5, seed) for seed in (0, 0, 1))
        assert first == again and first != other
        return
    clean = _images()
    first, again, other = (shift_images(clean, name, 3, seed) for seed in (0, 0, 1))
    assert torch.equal(first, again)
    assert torch.equal(first, other) == (name != "gaussian_noise")  # only the noise draws


def test_a_higher_noise_severity_scales_the_same_draw():
    clean = _images()
    signs = [torch.sign(shift_images(clean, "gaussian_noise", s) - clean) for s in range(1, 6)]
    assert all(torch.equal(signs[0], other) for other in signs[1:])


@pytest.mark.parametrize("name", shifts_of("image"))
def test_image_shifts_keep_shape_and_dtype_and_the_other_entries_of_a_batch(name):
    for side in (16, 7):  # a blur kernel wider than the image is fine
        batch = {"pixel_values": _images(side=side).double() * 2 - 1, "labels": torch.arange(4)}
        (shifted,) = shifted_loader([batch], name, 5, pixels=HALF)
        assert shifted["pixel_values"].shape == (4, 3, side, side) and shifted["pixel_values"].dtype == torch.float64
        assert shifted["labels"] is batch["labels"]


@pytest.mark.parametrize("name", shifts_of("image"))
def test_normalised_pixels_are_shifted_as_their_zero_one_images(name):
    clean = _images(side=16)
    mean, std = torch.tensor([0.4, 0.5, 0.6]).view(1, 3, 1, 1), torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1)
    pixels = PixelSpace((0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
    shifted = shift_images((clean - mean) / std, name, 4, pixels=pixels)
    assert torch.allclose(shifted, (shift_images(clean, name, 4) - mean) / std, atol=1e-5)
    processor = T.ViTImageProcessor(image_mean=[0.4, 0.5, 0.6], image_std=[0.2, 0.25, 0.3])
    assert PixelSpace.of(processor) == pixels and PixelSpace.of(T.ViTImageProcessor(do_normalize=False)) == PixelSpace()
    processor.image_mean, processor.image_std = np.array([0.4, 0.5, 0.6]), 0.25  # an array, one number: both read
    assert PixelSpace.of(processor) == PixelSpace((0.4, 0.5, 0.6), (0.25,))


def test_image_shifts_by_hand():
    x = torch.tensor([[0.2, 0.4], [0.6, 0.0]]).expand(1, 3, 2, 2).clone()
    x[0, 1] = x[0, 0] / 2  # hue and saturation to keep: green is half of red and blue
    # brightness 1 (+0.1 on V = max_c, red and blue): green stays half of them; black becomes grey 0.1
    red = torch.tensor([[0.3, 0.5], [0.7, 0.1]])
    green = torch.tensor([[0.15, 0.25], [0.35, 0.1]])
    assert torch.allclose(shift_images(x, "brightness", 1)[0], torch.stack([red, green, red]))
    # contrast 5 (x 0.05 around the image's mean)
    mean = x.mean()
    assert torch.allclose(shift_images(x, "contrast", 5), (x - mean) * 0.05 + mean)
    # pixelate 2 (side x 0.5): 2 x 2 -> 1 x 1 (their mean) -> 2 x 2
    assert torch.allclose(shift_images(x, "pixelate", 2), x.mean(dim=(2, 3), keepdim=True).expand_as(x))
    # blur of a constant image is the image (replicated edges)
    assert torch.allclose(
        shift_images(torch.full((1, 1, 5, 5), 0.3), "gaussian_blur", 5), torch.full((1, 1, 5, 5), 0.3)
    )


def _vit() -> T.ViTForImageClassification:
    torch.manual_seed(0)
    config = T.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        num_labels=3,
    )
    return T.ViTForImageClassification(config)


def _image_batches() -> list[dict]:
    g = torch.Generator().manual_seed(5)
    return [
        {
            "pixel_values": torch.rand(6, 3, 16, 16, generator=g) * 2 - 1,
            "labels": torch.randint(0, 3, (6,), generator=g),
        }
        for _ in range(2)
    ]


def _plain(model, batches) -> dict[str, float]:
    logits = collect_member_logits(model, batches)
    return classification_metrics(logits, labels_of(batches)) | {
        "entropy": decompose(logits.double())["total"].mean().item()
    }


def test_the_curve_starts_at_the_plain_evaluation_and_measures_each_shifted_loader():
    model, batches = _vit(), _image_batches()
    curve = shift_curve(model, batches, ["gaussian_noise", "pixelate"], [2, 5], pixels=HALF)
    assert list(curve) == ["gaussian_noise", "pixelate"] and all(list(points) == [0, 2, 5] for points in curve.values())
    plain = _plain(model, batches)
    assert curve["gaussian_noise"][0] == curve["pixelate"][0] == plain  # exactly: one inference loop, one metric code
    assert curve["pixelate"][5] == _plain(model, shifted_loader(batches, "pixelate", 5, pixels=HALF))
    assert curve["gaussian_noise"][2] != plain
    assert set(plain) >= {"acc", "nll", "ece", "entropy", "mi"}
    means = mean_over_shifts(curve)
    assert means[0] == plain and means[5]["nll"] == pytest.approx(
        (curve["pixelate"][5]["nll"] + curve["gaussian_noise"][5]["nll"]) / 2
    )


def _text_model_and_tokenizer(tmp_path):
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = T.BertTokenizer(vocab={t: i for i, t in enumerate(special + sorted(set(WORDS)))})
    tokenizer.save_pretrained(tmp_path)
    torch.manual_seed(0)
    config = T.BertConfig(
        vocab_size=len(special) + len(set(WORDS)),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        num_labels=2,
    )
    return T.BertForSequenceClassification(config), T.BertTokenizer.from_pretrained(tmp_path)


def test_a_text_curve_perturbs_the_raw_strings_before_tokenisation(tmp_path):
    model, tokenizer = _text_model_and_tokenizer(tmp_path)
    labels = [i % 2 for i in range(len(TEXTS))]
    data = text_data(tokenizer, TEXTS, labels, batch_size=16)
    curve = shift_curve(model, data, severities=[1, 5])
    assert list(curve) == shifts_of("text")
    assert curve["word_swap"][0] == _plain(model, data.encode(TEXTS))
    assert curve["word_dropout"][5] == _plain(model, data.encode(shift_texts(TEXTS, "word_dropout", 5)))
    lines = curve_lines({"bert": curve})
    assert "| bert | mean |" in "\n".join(lines) and "## Accuracy (%)" in lines


def test_wrong_names_modalities_and_severities_say_what_to_give(tmp_path):
    model, batches = _vit(), _image_batches()
    with pytest.raises(ValueError, match=r"unknown shift\(s\) \['fog'\]; the known ones are image: \['gaussian_noise'"):
        shift_curve(model, batches, ["fog"])
    with pytest.raises(ValueError, match=r"\['word_dropout'\] do not apply to image data; the image shifts are"):
        shift_curve(model, batches, ["gaussian_noise", "word_dropout"])
    with pytest.raises(ValueError, match=r"\['contrast'\] do not apply to text data; the text shifts are"):
        shift_texts(TEXTS, "contrast", 1)
    for severities in ([0, 1], [6], [2.5]):
        with pytest.raises(ValueError, match="severities must be integers 1..5"):
            shift_curve(model, batches, severities=severities)
    with pytest.raises(ValueError, match="severities must be integers 0..5"):
        shift_images(batches[0]["pixel_values"], "contrast", 6)
    normalised = _images(side=16) * 4 - 2  # un-normalised as if in [0, 1]: was clamped there at every severity
    with pytest.raises(ValueError, match=r"once un-normalised, not in \[0, 1\]: .*pixels=PixelSpace.of\(processor\)"):
        shift_images(normalised, "contrast", 1)
    text_model, tokenizer = _text_model_and_tokenizer(tmp_path)
    tokenized = text_data(tokenizer, TEXTS, [0] * len(TEXTS)).encode(TEXTS)
    with pytest.raises(ValueError, match=r"or text as TextData\(texts, encode\): text shifts perturb the raw strings"):
        shift_curve(text_model, tokenized)


def test_the_shift_figure_is_written(tmp_path):
    series = {"single": {0: 90.0, 1: 80.0, 3: 50.0}, "hydra": {0: 91.0, 1: 85.0, 3: 60.0}}
    path = plots.shift_curves(series, tmp_path / "shift_acc.png", "Accuracy (%)")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
