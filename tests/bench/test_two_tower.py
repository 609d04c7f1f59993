"""LiT-style training of a text tower against fixed image embeddings: the contrastive loss by hand, and the
learnt logit scale actually moves."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import MODELS, make_inputs
from torch import nn

from hydra_ensembles.bench.two_tower import ContrastiveText
from hydra_ensembles.predictors import Tower
from hydra_ensembles.training import Contrastive, TrainConfig, train


def test_contrastive_loss_treats_a_class_captions_as_positives():
    texts, images = torch.randn(3, 5), torch.randn(3, 5)
    labels, scale = torch.tensor([0, 0, 1]), torch.tensor(7.0)
    got = Contrastive()((texts, scale), {"image_embeds": images, "labels": labels})
    logits = 7.0 * F.normalize(images, dim=-1) @ F.normalize(texts, dim=-1).T
    targets = torch.tensor([[0.5, 0.5, 0], [0.5, 0.5, 0], [0, 0, 1.0]])
    by_hand = 0.0
    for matrix in (logits, logits.T):
        by_hand += -(targets * matrix.log_softmax(dim=-1)).sum(dim=-1).mean() / 2
    assert got.item() == pytest.approx(by_hand.item(), rel=1e-6)
    with pytest.raises(ValueError, match="image_embeds"):
        Contrastive()((texts, scale), {"labels": labels})


def test_the_logit_scale_learns_at_its_own_pace():
    torch.manual_seed(0)
    student = ContrastiveText(Tower(MODELS["bert_encoder"](), nn.Linear(32, 8)))
    assert student.logit_scale.item() == pytest.approx(1 / 0.07, rel=1e-5)
    batches = [
        make_inputs("bert_encoder", seed=s) | {"image_embeds": torch.randn(4, 8), "labels": torch.tensor([0, 1, 2, 3])}
        for s in (1, 2)
    ]
    config = TrainConfig(epochs=5, lr=1e-3, warmup=0.0)
    train(student, batches, config, loss=Contrastive(), forward=lambda m, x: m(**x), progress=False)
    moved = abs(math.log(student.logit_scale.item()) - math.log(1 / 0.07))
    assert moved > 0.2  # 10 steps of lr 1e-3 move log s by up to SCALE_STEP x 1e-3 each
    assert student.logit_scale.item() <= 100 + 1e-4
