"""Augmentation of image batches, written on tensors (torchvision does not import here): what the training loop
applies to each training batch when `TrainConfig.augment` names an entry of `AUGMENTATIONS` (paper 000 §D.2
trains its ViT members with random resized crops and flips). Every draw comes from the generator the loop
passes, seeded per epoch from the config's seed, so a run and a resumed run see the same crops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def _uniform(low: float, high: float, generator: torch.Generator) -> float:
    return low + (high - low) * torch.rand((), generator=generator).item()


def _randint(high: int, generator: torch.Generator) -> int:
    """An integer in [0, high)."""
    return int(torch.randint(high, (), generator=generator).item())


def crop_box(
    height: int, width: int, generator: torch.Generator, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a random crop whose area is a fraction in `scale` of the image's and whose aspect
    ratio w / h is log-uniform in `ratio`; torchvision's rule: ten tries, then the central crop at the ratio
    nearest the image's."""
    area, log_ratio = height * width, (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * _uniform(*scale, generator)
        aspect = math.exp(_uniform(*log_ratio, generator))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return _randint(height - h + 1, generator), _randint(width - w + 1, generator), h, w
    image_ratio = width / height
    if image_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif image_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def random_resized_crop(
    pixels: Tensor,
    generator: torch.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Tensor:
    """pixels (B, C, H, W) -> (B, C, H, W): each image's own random crop (`crop_box`), resized back to (H, W)
    bilinearly with antialiasing (as torchvision's RandomResizedCrop on tensors)."""
    height, width = pixels.shape[-2:]
    crops = []
    for image in pixels:
        top, left, h, w = crop_box(height, width, generator, scale, ratio)
        crop = image[None, :, top : top + h, left : left + w].float()
        crops.append(F.interpolate(crop, size=(height, width), mode="bilinear", align_corners=False, antialias=True))
    return torch.cat(crops).to(pixels.dtype)


def horizontal_flip(pixels: Tensor, generator: torch.Generator, probability: float = 0.5) -> Tensor:
    """pixels (B, C, H, W) with each image mirrored left-right with `probability`."""
    flip = torch.rand(len(pixels), generator=generator) < probability  # (B,)
    return torch.where(flip.to(pixels.device)[:, None, None, None], pixels.flip(-1), pixels)


@dataclass(frozen=True)
class CropFlip:
    """Random resized crop, then a horizontal flip with probability `flip`, on a batch's `pixel_values`
    (B, C, H, W); other entries pass unchanged. The defaults are the standard ranges (Inception's, and
    torchvision's): crop area 8-100% of the image, aspect ratio 3/4-4/3."""

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5

    def __call__(self, batch: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
        pixels = batch.get("pixel_values")
        if pixels is None:
            raise ValueError(
                "image augmentation needs batches with 'pixel_values' (B, C, H, W); train text models with "
                "augment=None."
            )
        cropped = random_resized_crop(pixels, generator, self.scale, self.ratio)
        return {**batch, "pixel_values": horizontal_flip(cropped, generator, self.flip)}


# what `TrainConfig.augment` names: a transform (batch, generator) -> batch, applied to training batches only
AUGMENTATIONS: dict[str, CropFlip] = {"crop_flip": CropFlip()}
