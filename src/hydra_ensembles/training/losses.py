"""Training losses: what the one training loop minimises. Each is called as `loss(output, batch)`, with
`output` what the loop's forward returned for this batch's inputs (logits (B, C) for the default forward) and
`batch` the batch itself (its `labels`, and the inputs a teacher needs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Forward = Callable[[nn.Module, dict[str, Any]], Tensor]


class CrossEntropy:
    """Mean cross-entropy with the batch's labels, optionally label-smoothed (fine-tuning)."""

    name = "cross_entropy"

    def __init__(self, label_smoothing: float = 0.0):
        self.label_smoothing = label_smoothing

    def __call__(self, logits: Tensor, batch: dict[str, Any]) -> Tensor:
        labels = batch.get("labels")
        if labels is None:
            raise ValueError("cross-entropy needs batches with 'labels'.")
        return F.cross_entropy(logits, labels.to(logits.device), label_smoothing=self.label_smoothing)


class TeacherKL:
    """Knowledge distillation (Hinton et al., 2015): KL(softmax(z_t / T) || softmax(z_s / T)) x T^2, averaged
    over the batch, against a frozen teacher's logits on the same inputs. Shapes: student logits (B, C)."""

    name = "teacher_kl"

    def __init__(self, teacher: nn.Module, forward: Forward, temperature: float = 1.0):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}.")
        self.teacher, self.forward, self.temperature = teacher.eval(), forward, temperature

    def __call__(self, logits: Tensor, batch: dict[str, Any]) -> Tensor:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        with torch.no_grad():
            teacher = self.forward(self.teacher, inputs).to(logits.device)
        t = self.temperature
        log_student, log_teacher = F.log_softmax(logits / t, dim=-1), F.log_softmax(teacher / t, dim=-1)
        return F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean") * t * t


class FeatureMSE:
    """Feature distillation for recovery after pruning (paper 002, Eq. 8): per example,
    (1/C) ||z_cls - z^_cls||^2 + (1/(N C)) ||z_rest - z^_rest||^2 between the teacher's and the student's
    last-layer token features (B, T, C), token 0 being [CLS]; padded tokens (attention_mask 0) are left out of
    the second term. Averaged over the batch."""

    name = "feature_mse"

    def __init__(self, teacher: nn.Module, forward: Forward):
        self.teacher, self.forward = teacher.eval(), forward

    def __call__(self, features: Tensor, batch: dict[str, Any]) -> Tensor:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        with torch.no_grad():
            target = self.forward(self.teacher, inputs).to(features.device)
        first = ((features[:, 0] - target[:, 0]) ** 2).mean(dim=-1)  # (B,)
        rest = ((features[:, 1:] - target[:, 1:]) ** 2).mean(dim=-1)  # (B, T-1)
        mask = batch.get("attention_mask")
        valid = torch.ones_like(rest) if mask is None else mask[:, 1:].to(rest.dtype)
        return (first + (rest * valid).sum(dim=1) / valid.sum(dim=1).clamp_min(1)).mean()
