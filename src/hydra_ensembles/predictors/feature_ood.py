"""Feature-space OOD detectors, fit once on training features: MDS, RMDS, KNN and ViM (OpenOOD v1.5's strongest
post-hoc detectors). Every score is "higher = more OOD" (as `evaluation.ood`) and computed in float64.

Each detector reads one member's penultimate features f (what its final linear classifier z = W f + b reads):

    mds    min_c (f - mu_c)^T S^+ (f - mu_c)                   class means mu_c, one shared (tied) covariance S
    rmds   mds(f) - (f - mu_0)^T S_0^+ (f - mu_0)               minus the class-blind background Gaussian's distance
    knn    1 - cos(f, its k-th most similar training feature)   the k-th smallest cosine distance
    vim    alpha ||P_perp (f - u)|| - logsumexp_c z_c          residual off the principal subspace, plus energy

An ensemble fits one detector per member on that member's own features and averages the members' scores
(`EnsembleDetector`); the "_concat" variant fits one detector on the members' features concatenated (its logits:
the mean member logits, which are affine in the concatenated features). Squared Mahalanobis distances, as
scikit-learn's `EmpiricalCovariance.mahalanobis` returns them; S^+ is the pseudo-inverse (directions with
eigenvalue <= D * eps * largest are dropped, as `scipy.linalg.pinvh`), so fewer training inputs than D is fine.

Shapes: N training inputs, B inputs scored, D features, C classes, M members, r kept directions.
References: Lee et al., 2018 (MDS); Ren et al., 2021 (RMDS); Sun et al., 2022 (KNN); Wang et al., 2022 (ViM).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import torch
from torch import Tensor

CONCAT = "_concat"  # suffix of a score name: one detector on the members' concatenated features
ROWS_PER_CHUNK = 2**22  # elements of the (chunk, C|N, ...) intermediates: bounds the memory of a pairwise step
RESIDUAL_FLOOR = 1e-6  # a training residual this small relative to the features is float64 rounding (~1e-15), not data


@dataclass(frozen=True)
class TrainingFeatures:
    """One member's training data: features (N, D) and labels (N,), and the classifier that reads the features,
    logits = features @ weight.T + bias, weight (C, D), bias (C,). All float64 except the labels."""

    features: Tensor
    labels: Tensor
    weight: Tensor
    bias: Tensor

    @property
    def logits(self) -> Tensor:
        return self.features @ self.weight.T + self.bias  # (N, C)


@dataclass(frozen=True)
class Settings:
    """What the detectors take besides the data: k of KNN (Sun et al.: 50; at most N), the principal dimension
    of ViM (None: Wang et al.'s rule, 1000 for D >= 2048, 512 for D >= 768, else D // 2)."""

    k: int = 50
    vim_dim: int | None = None


class FeatureDetector(ABC):
    """One member's detector: a dataclass of fitted tensors (its saved state), fit on `TrainingFeatures`."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def fit(cls, train: TrainingFeatures, settings: Settings) -> FeatureDetector: ...

    @abstractmethod
    def score(self, features: Tensor, logits: Tensor) -> Tensor:
        """OOD scores (B,) float64 of features (B, D) and the logits (B, C) the classifier gives them."""

    def state(self) -> dict[str, Tensor]:
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_state(cls, state: dict[str, Tensor]) -> FeatureDetector:
        return cls(**{field.name: state[field.name] for field in fields(cls)})


@dataclass
class MDS(FeatureDetector):
    """Mahalanobis distance to the nearest class mean under one shared covariance (Lee et al., 2018).

    centres (C, r): the class means in whitened coordinates; whiten (D, r): S^+ = whiten @ whiten.T."""

    centres: Tensor
    whiten: Tensor
    name: ClassVar[str] = "mds"

    @classmethod
    def fit(cls, train: TrainingFeatures, settings: Settings) -> MDS:
        means, centred = class_means(train.features, train.labels)
        whiten = whitening(centred.T @ centred / len(centred))
        return cls(means @ whiten, whiten)

    def score(self, features: Tensor, logits: Tensor) -> Tensor:
        return min_squared_distance(features.double() @ self.whiten, self.centres)


@dataclass
class RMDS(FeatureDetector):
    """Relative Mahalanobis distance (Ren et al., 2021): MDS minus the squared Mahalanobis distance under the
    background Gaussian N(mu_0, S_0) of all training features, class-blind. background (1, r0) and
    background_whiten (D, r0) are that Gaussian's mean and S_0^+ factor, as `MDS`'s."""

    centres: Tensor
    whiten: Tensor
    background: Tensor
    background_whiten: Tensor
    name: ClassVar[str] = "rmds"

    @classmethod
    def fit(cls, train: TrainingFeatures, settings: Settings) -> RMDS:
        classes = MDS.fit(train, settings)
        mean = train.features.mean(dim=0, keepdim=True)  # (1, D)
        centred = train.features - mean
        background_whiten = whitening(centred.T @ centred / len(centred))
        return cls(classes.centres, classes.whiten, mean @ background_whiten, background_whiten)

    def score(self, features: Tensor, logits: Tensor) -> Tensor:
        features = features.double()
        nearest = min_squared_distance(features @ self.whiten, self.centres)
        return nearest - min_squared_distance(features @ self.background_whiten, self.background)


@dataclass
class KNN(FeatureDetector):
    """Cosine distance to the k-th nearest training feature (Sun et al., 2022), on L2-normalised features.

    bank (N, D): the training features as the model gave them (float32: normalised here, in float64); k: 0-d."""

    bank: Tensor
    k: Tensor
    name: ClassVar[str] = "knn"

    @classmethod
    def fit(cls, train: TrainingFeatures, settings: Settings) -> KNN:
        if settings.k < 1:
            raise ValueError(f"KNN needs k >= 1 neighbours, got k={settings.k}.")
        k = min(settings.k, len(train.features))  # with fewer training inputs than k, the farthest of them
        return cls(train.features.float(), torch.tensor(k))

    def score(self, features: Tensor, logits: Tensor) -> Tensor:
        bank = normalised(self.bank.double())  # (N, D)
        k, step = int(self.k), max(1, ROWS_PER_CHUNK // max(1, len(bank)))
        kth = [
            (chunk @ bank.T).topk(k, dim=1).values[:, -1]  # (b, N) cosines -> the k-th largest, (b,)
            for chunk in normalised(features.double()).split(step)
        ]
        return 1 - torch.cat(kth) if kth else features.new_zeros(0, dtype=torch.float64)


@dataclass
class ViM(FeatureDetector):
    """Virtual-logit matching (Wang et al., 2022): alpha times the norm of f - u off the principal subspace of
    the training features (centred at u = -W^+ b, the point the classifier maps to zero logits), minus the
    logsumexp of the logits (plus energy, in our sign). alpha = mean max logit / mean residual on the training
    data, so that the two terms have one scale.

    origin (D,): u; null_basis (D, D - dim): the eigenvectors of the D - dim smallest eigenvalues of the
    uncentred covariance of f - u; alpha: 0-d."""

    origin: Tensor
    null_basis: Tensor
    alpha: Tensor
    name: ClassVar[str] = "vim"

    @classmethod
    def fit(cls, train: TrainingFeatures, settings: Settings) -> ViM:
        size = train.features.shape[1]
        dim = settings.vim_dim if settings.vim_dim is not None else vim_dim(size)
        if not 0 < dim < size:
            raise ValueError(f"ViM's principal dimension must be in [1, {size - 1}] for {size} features, got {dim}.")
        origin = -torch.linalg.pinv(train.weight) @ train.bias  # (D,)
        centred = train.features - origin
        _, vectors = torch.linalg.eigh(centred.T @ centred / len(centred))  # ascending eigenvalues
        null_basis = vectors[:, : size - dim].contiguous()  # (D, D - dim), stored as saved: one matmul order
        residual = (centred @ null_basis).norm(dim=1).mean()
        if residual <= RESIDUAL_FLOOR * centred.norm(dim=1).mean():  # rounding alone: the data span <= dim directions
            raise ValueError(
                f"the {len(centred)} training features lie inside a {dim}-dimensional subspace, so ViM has no "
                f"residual to scale: pass a vim_dim below {min(len(centred), size)}, or fit on more inputs."
            )
        return cls(origin, null_basis, train.logits.amax(dim=1).mean() / residual)

    def score(self, features: Tensor, logits: Tensor) -> Tensor:
        residual = ((features.double() - self.origin) @ self.null_basis).norm(dim=1)
        return self.alpha * residual - torch.logsumexp(logits.double(), dim=1)


FEATURE_SCORES: dict[str, type[FeatureDetector]] = {cls.name: cls for cls in (MDS, RMDS, KNN, ViM)}


@dataclass
class EnsembleDetector:
    """One detector per member (each fit on its member's features; scores averaged), and one on the members'
    features concatenated. With one member, `concatenated` is that member's detector."""

    members: list[FeatureDetector]
    concatenated: FeatureDetector

    @classmethod
    def fit(cls, name: str, train: Sequence[TrainingFeatures], settings: Settings) -> EnsembleDetector:
        detector = FEATURE_SCORES[name]
        members = [detector.fit(member, settings) for member in train]
        joined = members[0] if len(train) == 1 else detector.fit(concatenate(train), settings)
        return cls(members, joined)

    def score(self, features: Tensor, logits: Tensor, concatenated: bool = False) -> Tensor:
        """features (B, M, D), logits (B, M, C) -> (B,): the mean of the members' scores, or the concatenated
        detector's score (of the features flattened to (B, M*D) and the mean logits)."""
        if concatenated:
            return self.concatenated.score(features.flatten(1), logits.double().mean(dim=1))
        scores = [d.score(features[:, m], logits[:, m]) for m, d in enumerate(self.members)]
        return torch.stack(scores, dim=1).mean(dim=1)


def concatenate(train: Sequence[TrainingFeatures]) -> TrainingFeatures:
    """The members' features side by side (N, M*D), read by the classifier of the mean logits: weight
    [W_1 ... W_M] / M (C, M*D), bias mean_m b_m."""
    members = len(train)
    return TrainingFeatures(
        torch.cat([t.features for t in train], dim=1),
        train[0].labels,
        torch.cat([t.weight for t in train], dim=1) / members,
        torch.stack([t.bias for t in train]).mean(dim=0),
    )


def class_means(features: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """The mean feature of every class present (C', D) and each feature minus its class's mean (N, D)."""
    _, index = labels.unique(return_inverse=True)
    counts = torch.bincount(index).to(features.dtype)  # (C',)
    means = torch.zeros(len(counts), features.shape[1], dtype=features.dtype).index_add_(0, index, features)
    means = means / counts[:, None]
    return means, features - means[index]


def whitening(covariance: Tensor) -> Tensor:
    """W (D, r) with W @ W.T the pseudo-inverse of a covariance (D, D): its eigenvectors over the square roots of
    the eigenvalues above D * eps * the largest (`scipy.linalg.pinvh`'s cutoff); r of them."""
    values, vectors = torch.linalg.eigh(covariance)
    kept = values > len(values) * torch.finfo(values.dtype).eps * values.abs().max()
    return vectors[:, kept] / values[kept].sqrt()


def min_squared_distance(points: Tensor, centres: Tensor) -> Tensor:
    """min_c ||points_b - centres_c||^2, (B, r) and (C, r) -> (B,), from the differences themselves (an
    expansion ||x||^2 - 2 x.y + ||y||^2 would cancel near a centre), in chunks of inputs."""
    step = max(1, ROWS_PER_CHUNK // max(1, centres.numel()))
    parts = [((chunk[:, None] - centres[None]) ** 2).sum(dim=-1).amin(dim=1) for chunk in points.split(step)]
    return torch.cat(parts) if parts else points.new_zeros(0)


def normalised(features: Tensor) -> Tensor:
    """Each row divided by its L2 norm (a zero row stays zero)."""
    return torch.nn.functional.normalize(features, dim=-1)


def vim_dim(size: int) -> int:
    """ViM's principal dimension for D = `size` features (Wang et al., 2022, Sec. 4.1)."""
    return 1000 if size >= 2048 else 512 if size >= 768 else size // 2
