"""Feature-space OOD detectors (MDS, RMDS, KNN, ViM): hand-computed cases, scikit-learn's Mahalanobis
distance, a brute-force nearest-neighbour loop, and the ensemble rules (mean of members, concatenation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.covariance import EmpiricalCovariance
from tolerances import U64

from hydra_ensembles.predictors.feature_ood import (
    FEATURE_SCORES,
    KNN,
    MDS,
    RMDS,
    EnsembleDetector,
    Settings,
    TrainingFeatures,
    ViM,
    concatenate,
)

# two classes in 2-D: class 0 around (0, 0), class 1 the same points moved up by 10
SPREAD = torch.tensor([[-1.0, 0.0], [1.0, 0.0], [0.0, -2.0], [0.0, 2.0]], dtype=torch.float64)
TWO_CLASSES = torch.cat([SPREAD, SPREAD + torch.tensor([0.0, 10.0], dtype=torch.float64)])
LABELS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def _train(features: torch.Tensor, labels: torch.Tensor, classes: int = 2, seed: int = 0) -> TrainingFeatures:
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(classes, features.shape[1], generator=g, dtype=torch.float64)
    return TrainingFeatures(features, labels, weight, torch.randn(classes, generator=g, dtype=torch.float64))


def _random_train(n=60, size=5, classes=3, seed=0) -> TrainingFeatures:
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centres = 3 * torch.randn(classes, size, generator=g, dtype=torch.float64)
    mixing = torch.randn(size, size, generator=g, dtype=torch.float64) + 2 * torch.eye(size, dtype=torch.float64)
    features = centres[labels] + torch.randn(n, size, generator=g, dtype=torch.float64) @ mixing
    return _train(features, labels, classes, seed)


def test_mds_by_hand():
    """Shared covariance diag(1/2, 2) (class-centred spread), precision diag(2, 1/2): (1, 1) is 2 + 1/2 from class
    0's mean; (0, 6) is 0.5 * 36 = 18 from class 0 and 0.5 * 16 = 8 from class 1's (0, 10)."""
    detector = MDS.fit(_train(TWO_CLASSES, LABELS), Settings())
    scores = detector.score(torch.tensor([[1.0, 1.0], [0.0, 6.0]], dtype=torch.float64), torch.zeros(2, 2))
    assert scores.dtype == torch.float64
    torch.testing.assert_close(scores, torch.tensor([2.5, 8.0], dtype=torch.float64), rtol=0, atol=1e-12)


def test_rmds_by_hand():
    """Background Gaussian of all 8 points: mean (0, 5), covariance diag(1/2, 27) (y - 5 in +-5, +-5, -7, -3, 3, 7:
    216 / 8). RMDS = MDS - background distance: 2.5 - (2 + 16/27) at (1, 1); 8 - 1/27 at (0, 6)."""
    detector = RMDS.fit(_train(TWO_CLASSES, LABELS), Settings())
    scores = detector.score(torch.tensor([[1.0, 1.0], [0.0, 6.0]], dtype=torch.float64), torch.zeros(2, 2))
    expected = torch.tensor([2.5 - 2 - 16 / 27, 8 - 1 / 27], dtype=torch.float64)
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n, size", [(60, 5), (6, 10)])  # (6, 10): fewer inputs than features, S singular
def test_mds_equals_scikit_learn_empirical_covariance(n, size):
    """min_c of `EmpiricalCovariance(assume_centered=True).fit(class-centred features).mahalanobis(x - mu_c)`.
    Both are float64 and invert S by its eigenvalues above the same cutoff; the distances are O(10-100) and S's
    kept eigenvalues within a factor ~1e3, so they agree to ~1e3 * D * eps relative: 1e-9 is a wide margin."""
    train = _random_train(n, size)
    test = _random_train(20, size, seed=1).features
    features, labels = train.features.numpy(), train.labels.numpy()
    means = {c: features[labels == c].mean(axis=0) for c in np.unique(labels)}
    centred = features - np.stack([means[c] for c in labels])
    covariance = EmpiricalCovariance(assume_centered=True).fit(centred)
    expected = np.min([covariance.mahalanobis(test.numpy() - mean) for mean in means.values()], axis=0)
    got = MDS.fit(train, Settings()).score(test, torch.zeros(20, 3))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9)


def test_knn_by_hand():
    """Training directions at 0, 90 and 180 degrees (lengths differ: only the direction counts). From 0 degrees
    the k-th nearest is at cosine distance 0, 1, 2 for k = 1, 2, 3."""
    bank = torch.tensor([[3.0, 0.0], [0.0, 0.5], [-2.0, 0.0]])
    query = torch.tensor([[5.0, 0.0], [0.0, 0.0]])  # a zero feature has cosine 0 with everything: distance 1
    train = _train(bank.double(), torch.zeros(3, dtype=torch.long))
    for k, expected in ((1, [0.0, 1.0]), (2, [1.0, 1.0]), (3, [2.0, 1.0])):
        got = KNN.fit(train, Settings(k=k)).score(query.double(), torch.zeros(2, 2))
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-15)


def test_knn_equals_a_brute_force_loop():
    """The k-th largest cosine similarity found by sorting each query's similarities one by one, as q.r / (|q| |r|)
    where the detector takes (q / |q|).(r / |r|). Each float64 cosine is within (2D + 6) u of the exact one (a D-term
    dot product, two D-term norms and their roots, two divisions; Higham, Lemma 3.1), so they differ by twice that."""
    train, test = _random_train(40, 5), _random_train(15, 5, seed=2).features
    k = 7
    got = KNN.fit(train, Settings(k=k)).score(test, torch.zeros(15, 3))
    bank = train.features.float().double()  # the bank is kept as the model's float32 features
    expected = []
    for query in test:
        similarities = sorted((float(query @ row / (query.norm() * row.norm())) for row in bank), reverse=True)
        expected.append(1 - similarities[k - 1])
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=2 * (2 * 5 + 6) * U64)


def test_knn_k_beyond_the_training_set_reads_the_farthest():
    train = _random_train(4, 3)
    assert int(KNN.fit(train, Settings(k=50)).k) == 4
    with pytest.raises(ValueError, match="k >= 1"):
        KNN.fit(train, Settings(k=0))


def _vim_case() -> tuple[ViM, torch.Tensor]:
    """W = [[1, 0, 0], [0, 1, 0]], b = (1, -2): u = -W^+ b = (-1, 2, 0). Training features u + v, v in (+-2, 0, 0),
    (0, +-2, 0), (0, 0, +-1): the principal plane is e1, e2, the residual direction e3; residuals 0 0 0 0 1 1
    (mean 1/3), max logits 2 0 2 0 0 0 (mean 2/3): alpha = 2."""
    origin = torch.tensor([-1.0, 2.0, 0.0], dtype=torch.float64)
    offsets = torch.tensor([[2, 0, 0], [-2, 0, 0], [0, 2, 0], [0, -2, 0], [0, 0, 1], [0, 0, -1]], dtype=torch.float64)
    weight = torch.tensor([[1.0, 0, 0], [0, 1.0, 0]], dtype=torch.float64)
    train = TrainingFeatures(
        origin + offsets, torch.zeros(6, dtype=torch.long), weight, torch.tensor([1.0, -2.0]).double()
    )
    return ViM.fit(train, Settings(vim_dim=2)), origin


def test_vim_by_hand():
    detector, origin = _vim_case()
    torch.testing.assert_close(detector.origin, origin)
    assert float(detector.alpha) == pytest.approx(2.0, abs=1e-12)
    features = origin + torch.tensor([[0.0, 0.0, 3.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    logits = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)  # W f + b = W v
    expected = torch.tensor([2 * 3 - math.log(2), 2 * 0 - (1 + math.log(2))], dtype=torch.float64)
    torch.testing.assert_close(detector.score(features, logits), expected, rtol=0, atol=1e-12)


def test_vim_residual_is_zero_inside_the_principal_subspace():
    """Any u + a e1 + b e2 has no residual: its score is the energy alone."""
    detector, origin = _vim_case()
    g = torch.Generator().manual_seed(0)
    plane = 5 * torch.randn(10, 2, generator=g, dtype=torch.float64)
    inside = origin + torch.cat([plane, torch.zeros(10, 1, dtype=torch.float64)], dim=1)
    logits = torch.randn(10, 2, generator=g, dtype=torch.float64)
    torch.testing.assert_close(detector.score(inside, logits), -torch.logsumexp(logits, 1), rtol=0, atol=1e-12)


def test_vim_refuses_a_dimension_without_residual():
    """dim = D leaves no direction; 5 inputs span at most 5 directions, so dim = 6 leaves only rounding."""
    with pytest.raises(ValueError, match="principal dimension"):
        ViM.fit(_random_train(30, 4), Settings(vim_dim=4))
    with pytest.raises(ValueError, match="no residual to scale: pass a vim_dim below 5"):
        ViM.fit(_random_train(5, 10), Settings(vim_dim=6))


@pytest.mark.parametrize("name", sorted(FEATURE_SCORES))
def test_an_ensemble_averages_its_members_scores_and_concatenates_their_features(name):
    """Each member's detector fit on its own features alone; the mean of their scores; the concatenated variant
    equals one detector fit on the features side by side, reading the mean member logits."""
    members = [_random_train(50, 4, seed=s) for s in range(3)]
    members = [TrainingFeatures(m.features, members[0].labels, m.weight, m.bias) for m in members]
    ensemble = EnsembleDetector.fit(name, members, Settings(k=5, vim_dim=2))
    test = torch.stack([_random_train(12, 4, seed=10 + s).features for s in range(3)], dim=1)  # (B, M, D)
    logits = torch.randn(12, 3, 3, dtype=torch.float64)
    alone = [
        FEATURE_SCORES[name].fit(m, Settings(k=5, vim_dim=2)).score(test[:, i], logits[:, i])
        for i, m in enumerate(members)
    ]
    torch.testing.assert_close(ensemble.score(test, logits), torch.stack(alone).mean(0), rtol=0, atol=0)
    joined = FEATURE_SCORES[name].fit(concatenate(members), Settings(k=5, vim_dim=2))
    expected = joined.score(test.flatten(1), logits.mean(1))
    torch.testing.assert_close(ensemble.score(test, logits, concatenated=True), expected, rtol=0, atol=0)


def test_the_concatenated_classifier_gives_the_mean_member_logits():
    members = [_random_train(20, 4, seed=s) for s in range(3)]
    joined = concatenate(members)
    torch.testing.assert_close(joined.logits, torch.stack([m.logits for m in members]).mean(0))
