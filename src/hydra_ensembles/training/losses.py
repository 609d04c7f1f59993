"""Training losses: what the one training loop minimises. Each is called as `loss(output, batch)`, with
`output` what the loop's forward returned for this batch's inputs (logits (B, C) for the default forward) and
`batch` the batch itself (its `labels`, a teacher's `teacher_outputs`, and the inputs a teacher needs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.loaders import split_batch
from ..io import weights_digest
from ..metrics._checks import check_labels

Forward = Callable[[nn.Module, dict[str, Any]], Tensor]


class CrossEntropy:
    """Mean cross-entropy with the batch's labels, optionally label-smoothed (fine-tuning). Logits (B, C); or
    member logits (B, M, C) of M networks in one module: each member's own mean cross-entropy, summed over
    members, so each member's own parameters get exactly its own gradient (independent networks: a
    `distill.MultiHeadMLP`) and parameters the members share the sum of theirs (a fused ensemble fine-tuned
    as one module, `finetune_fused`). Not the cross-entropy of the mean logits, which would train one model."""

    name = "cross_entropy"

    def __init__(self, label_smoothing: float = 0.0):
        self.label_smoothing = label_smoothing

    def key(self) -> dict:
        """What a checkpoint records of this loss beyond its name: a resumed run must use the same."""
        return {"label_smoothing": self.label_smoothing}

    def __call__(self, logits: Tensor, batch: dict[str, Any]) -> Tensor:
        labels = batch.get("labels")
        if labels is None:
            raise ValueError("cross-entropy needs batches with 'labels'.")
        labels = _one_per_example(labels, logits, "cross-entropy", "class indices").to(logits.device)
        check_labels(labels, logits.shape[-1], "cross-entropy")
        if logits.dim() == 3:  # (B, M, C): every member against the labels
            members = logits.shape[1]
            labels = labels[:, None].expand(-1, members).flatten()
            return F.cross_entropy(logits.flatten(0, 1), labels, label_smoothing=self.label_smoothing) * members
        return F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)


class MIMOLoss:
    """MIMO's training loss (Havasi et al., 2020): each member's mean cross-entropy against the labels of the
    examples it read, summed over members. `output`: a `predictors.baselines.mimo.MIMOTrainingOutput`, member
    logits (N, M, C) and permutations (M, N) (member m's row i is example permutations[m, i] of the batch); reads
    the batch's `labels` (B,)."""

    name = "mimo_cross_entropy"
    batch_coupled = True  # the forward mixes each example with others of its batch: not shardable across processes

    def __init__(self, label_smoothing: float = 0.0):
        self.label_smoothing = label_smoothing

    def key(self) -> dict:
        return {"label_smoothing": self.label_smoothing}

    def __call__(self, output: Any, batch: dict[str, Any]) -> Tensor:
        labels = batch.get("labels")
        if labels is None:
            raise ValueError("MIMO's loss needs batches with 'labels'.")
        logits, permutations = output.member_logits, output.permutations  # (N, M, C), (M, N)
        check_labels(labels, logits.shape[-1], "MIMO's loss")
        targets = labels.to(logits.device)[permutations.to(logits.device)].T  # (N, M): what member m read
        members = logits.shape[1]
        ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), label_smoothing=self.label_smoothing)
        return ce * members  # the mean over N*M rows times M = the sum over members of each one's mean


class GaussianNLL:
    """Heteroscedastic regression: -log N(y; mean, exp(log_var)), averaged over the batch, for member Gaussians
    (B, M, 2) (mean, log-variance) against the batch's float `labels` (B,); each member's own NLL, summed over
    members (independent networks in one module, as `CrossEntropy`)."""

    name = "gaussian_nll"

    def __call__(self, gaussians: Tensor, batch: dict[str, Any]) -> Tensor:
        targets = batch.get("labels")
        if targets is None:
            raise ValueError("the Gaussian NLL needs batches with 'labels' (the regression targets).")
        if gaussians.dim() != 3 or gaussians.shape[-1] != 2:
            raise ValueError(
                "the Gaussian NLL needs member Gaussians (B, M, 2) of (mean, log-variance), got "
                f"{tuple(gaussians.shape)}."
            )
        targets = _one_per_example(targets, gaussians, "the Gaussian NLL", "regression targets")
        gaussians = gaussians.float()  # under bf16 autocast, the NLL in float32 (as the distillation losses)
        mean, log_var = gaussians[..., 0], gaussians[..., 1]  # (B, M)
        targets = targets.to(gaussians.device, gaussians.dtype)[:, None]
        nll = 0.5 * (math.log(2 * math.pi) + log_var + (targets - mean) ** 2 / log_var.exp())
        return nll.mean(dim=0).sum()


class DistillKL:
    """Distillation from a teacher's member logits (paper 001 Eq. 1-4), at temperature T, scaled by T^2 so that
    gradients keep their size across temperatures; averaged over the batch. Reads the batch's
    `teacher_outputs` (B, M, C) (`distill.attach_teacher` puts them there), student logits (B, K, C):

    - K = 1, one head against the ensemble mean (Eq. 1-2; Hinton et al.'s knowledge distillation, the
      "Hinton head"): KL(mean_m softmax(z_m / T) || softmax(s / T)) T^2. A single teacher is M = 1.
    - K = M, head m against member m (Eq. 3-4, Hydra): (1/M) sum_m KL(softmax(z_m / T) || softmax(s_m / T)) T^2.
    """

    name = "distill_kl"

    def __init__(self, temperature: float = 1.0):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}.")
        self.temperature = temperature
        self.name = f"distill_kl(T={temperature:g})"  # a checkpoint resumes only at the same temperature

    def __call__(self, student: Tensor, batch: dict[str, Any]) -> Tensor:
        student, teacher = _paired(student[:, None] if student.dim() == 2 else student, batch, "teacher_outputs")
        t = self.temperature
        if student.shape[1] == 1:  # against the mean of the members' (heated) probabilities
            target = F.softmax(teacher / t, dim=-1).mean(dim=1, keepdim=True)  # (B, 1, C)
            log_target = torch.log(target.clamp_min(torch.finfo(target.dtype).tiny))
        else:  # head m against member m
            log_target = F.log_softmax(teacher / t, dim=-1)  # (B, M, C)
        log_student = F.log_softmax(student / t, dim=-1)
        kl = (log_target.exp() * (log_target - log_student)).sum(dim=-1)  # (B, K)
        return kl.mean() * t * t


def gaussian_kl(mean_p: Tensor, log_var_p: Tensor, mean_q: Tensor, log_var_q: Tensor) -> Tensor:
    """KL(N(mean_p, var_p) || N(mean_q, var_q)) = 1/2 [log(var_q / var_p) + (var_p + (mean_p - mean_q)^2) / var_q - 1],
    elementwise (broadcast)."""
    return 0.5 * (log_var_q - log_var_p + (log_var_p.exp() + (mean_p - mean_q) ** 2) / log_var_q.exp() - 1)


class GaussianKL:
    """Distillation of heteroscedastic regressors (paper 001 §2, Regression): (1/M) sum_m KL(N_m || N^_k), in
    closed form (`gaussian_kl`), averaged over the batch. The paper's printed derivation flips the sign of the
    quadratic term; this is the correct form, tested against a Monte-Carlo estimate. Reads the batch's
    `teacher_gaussians` (B, M, 2) (mean, log-variance per member; `attach_teacher` of a regressor); student (B, K, 2):

    - K = M: head m against member m (Hydra).
    - K = 1: the one head against every member (knowledge distillation, Eq. 5). It differs from
      KL(mixture || N^) only by a constant of the teacher (the mixture's entropy minus the members' mean
      entropy), so it has the same minimiser and gradients; Eq. 5 itself has no closed form.
    """

    name = "gaussian_kl"

    def __call__(self, student: Tensor, batch: dict[str, Any]) -> Tensor:
        student, teacher = _paired(student, batch, "teacher_gaussians")  # (B, K, 2), (B, M, 2)
        return gaussian_kl(teacher[..., 0], teacher[..., 1], student[..., 0], student[..., 1]).mean()


def _paired(student: Tensor, batch: dict[str, Any], key: str) -> tuple[Tensor, Tensor]:
    """The student's outputs (B, K, ...) and the batch's teacher outputs under `key` (B, M, ...), both at least
    float32 on the student's device (half precision is computed in float32), with K = 1 or K = M checked."""
    teacher = batch.get(key)
    if teacher is None:
        raise ValueError(f"distillation needs batches with {key!r}: {teacher_mismatch(key, batch)}")
    student = student.to(torch.promote_types(student.dtype, torch.float32))
    if student.dim() != 3 or teacher.dim() != 3 or student.shape[::2] != teacher.shape[::2]:
        raise ValueError(
            f"distillation needs student outputs (B, K, D) and {key} (B, M, D) of the same B and D, got "
            f"{tuple(student.shape)} and {tuple(teacher.shape)}."
        )
    if student.shape[1] not in (1, teacher.shape[1]):
        raise ValueError(
            f"the student has {student.shape[1]} heads and the teacher {teacher.shape[1]} members: distil "
            "into one head (knowledge distillation) or one head per member (Hydra)."
        )
    return student, teacher.to(student.device, student.dtype)


def _one_per_example(labels: Tensor, outputs: Tensor, loss: str, kind: str) -> Tensor:
    """The batch's labels, checked to be one per example (B,): labels (B, 1) or soft labels (B, C) would
    broadcast against member outputs into a loss of every example against every other's label."""
    if labels.dim() != 1 or len(labels) != len(outputs):
        raise ValueError(
            f"{loss} needs 'labels' of shape (B,) ({kind}), one per example of outputs {tuple(outputs.shape)}, "
            f"got {tuple(labels.shape)}."
        )
    return labels


def teacher_mismatch(key: str, batch: dict[str, Any]) -> str:
    """Why a batch lacks the teacher outputs `key`, and the fix."""
    other = {"teacher_outputs": "teacher_gaussians", "teacher_gaussians": "teacher_outputs"}[key]
    kinds = {"teacher_outputs": "a classifier (member logits)", "teacher_gaussians": "a regressor (member Gaussians)"}
    if batch.get(other) is not None:
        return (
            f"its teacher is {kinds[other]} and this student {kinds[key].split(' (')[0]}: distil a classifier's "
            "ensemble into a classifier, a regressor's into a regressor."
        )
    return "attach them with hydra_ensembles.distill.attach_teacher(batches, teacher)."


class FeatureMSE:
    """Feature distillation for recovery after pruning (paper 002, Eq. 8): per example,
    (1/C) ||z_cls - z^_cls||^2 + (1/(N C)) ||z_rest - z^_rest||^2 between the teacher's and the student's
    last-layer token features (B, T, C), token 0 being [CLS]; padded tokens (attention_mask 0) are left out of
    the second term. Averaged over the batch."""

    name = "feature_mse"

    def __init__(self, teacher: nn.Module, forward: Forward):
        self.teacher, self.forward = teacher.eval(), forward

    def key(self) -> dict:
        return {"teacher": weights_digest(self.teacher)}  # another teacher is another run

    def __call__(self, features: Tensor, batch: dict[str, Any]) -> Tensor:
        inputs = split_batch(None, batch)[0]  # what the student was given: the batch less its targets
        with torch.no_grad():  # float32, as the other losses: under bf16 autocast both sides are bf16-rounded
            target = self.forward(self.teacher, inputs).to(features.device).float()
        features = features.float()
        first = ((features[:, 0] - target[:, 0]) ** 2).mean(dim=-1)  # (B,)
        rest = ((features[:, 1:] - target[:, 1:]) ** 2).mean(dim=-1)  # (B, T-1)
        mask = batch.get("attention_mask")
        valid = torch.ones_like(rest) if mask is None else mask[:, 1:].to(rest.dtype)
        return (first + (rest * valid).sum(dim=1) / valid.sum(dim=1).clamp_min(1)).mean()


class Contrastive:
    """The CLIP / LiT loss for training a text tower against fixed image embeddings (paper 000 §D.3 trains
    CLIP's text tower with the image tower locked, after LiT): the symmetric InfoNCE of the logits
    s * v_i . t_j between the batch's image embeddings v (`image_embeds`, normalised) and text embeddings t,

        L = (CE(s V T^T, Y) + CE(s T V^T, Y)) / 2,   Y_ij = [labels_i == labels_j] / #{k: labels_k == labels_i},

    where captions of one class are all positives of each other (class captions repeat in a batch; CLIP's
    one-positive targets would push a caption away from its own class). `output` = (t (B, P), s) from the
    forward: the embeddings and the learnt logit scale."""

    name = "contrastive"
    batch_coupled = True  # each row's loss reads the whole batch: not shardable across processes

    def __call__(self, output: tuple[Tensor, Tensor], batch: dict[str, Any]) -> Tensor:
        texts, scale = output
        images = batch.get("image_embeds")
        if images is None or batch.get("labels") is None:
            raise ValueError("the contrastive loss needs batches with 'image_embeds' and 'labels'.")
        texts = F.normalize(texts.float(), dim=-1)
        images = F.normalize(images.to(texts.device).float(), dim=-1)
        labels = batch["labels"].to(texts.device)
        same = (labels[:, None] == labels[None, :]).float()
        targets = same / same.sum(dim=1, keepdim=True)  # symmetric: rows and columns of `same` alike
        with torch.autocast(texts.device.type, enabled=False):  # bf16 would round the scaled cosines (s ~ 100)
            logits = scale.float() * images @ texts.T  # (B images, B texts)
        return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets)) / 2
