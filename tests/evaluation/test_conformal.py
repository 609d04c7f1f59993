"""Split conformal prediction: each score on small cases computed by hand, the quantile by hand, and the coverage
guarantee tested statistically over many random calibration / test splits of exchangeable synthetic data."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import betabinom

from hydra_ensembles.evaluation.conformal import (
    SCORES,
    Aps,
    Raps,
    SplitConformal,
    Thr,
    coverage_and_size,
    mass_and_rank,
    minimum_calibration,
    split_evaluation,
)
from hydra_ensembles.evaluation.report import conformal_metrics

ONE = torch.ones(1, dtype=torch.float64)  # u = 1: the non-randomised scores


def _p(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_thr_is_one_minus_the_class_probability():
    assert torch.allclose(Thr()(_p([0.6, 0.3, 0.1]), ONE), _p([0.4, 0.7, 0.9]), rtol=0, atol=1e-15)


def test_aps_by_hand():
    # classes by probability 0.5, 0.3, 0.2: mass strictly above 0, 0.5, 0.8, plus u p_y
    assert torch.allclose(Aps()(_p([0.5, 0.3, 0.2]), ONE), _p([0.5, 0.8, 1.0]), rtol=0, atol=1e-15)
    u = torch.tensor([0.25], dtype=torch.float64)  # randomised: 0.25 * 0.5, 0.5 + 0.25 * 0.3, 0.8 + 0.25 * 0.2
    assert torch.allclose(Aps()(_p([0.5, 0.3, 0.2]), u), _p([0.125, 0.575, 0.85]), rtol=0, atol=1e-15)
    # the classes' order does not matter; tied classes count only the strictly larger mass
    assert torch.allclose(Aps()(_p([0.2, 0.5, 0.3]), ONE), _p([1.0, 0.5, 0.8]), rtol=0, atol=1e-15)
    assert torch.allclose(Aps()(_p([0.4, 0.4, 0.2]), ONE), _p([0.4, 0.4, 1.0]), rtol=0, atol=1e-15)


def test_raps_by_hand():
    # APS 0.5, 0.8, 1.0 plus 0.1 * max(0, rank - k_reg) for ranks 1, 2, 3
    assert torch.allclose(Raps()(_p([0.5, 0.3, 0.2]), ONE), _p([0.5, 0.9, 1.2]), rtol=0, atol=1e-15)
    assert torch.allclose(Raps(k_reg=2, lam=0.1)(_p([0.5, 0.3, 0.2]), ONE), _p([0.5, 0.8, 1.1]), rtol=0, atol=1e-15)
    # ties share the better rank: ranks 1, 1, 3
    assert torch.allclose(Raps()(_p([0.4, 0.4, 0.2]), ONE), _p([0.4, 0.4, 1.2]), rtol=0, atol=1e-15)
    _, rank = mass_and_rank(_p([0.1, 0.4, 0.4, 0.1]))
    assert rank.tolist() == [[3.0, 1.0, 1.0, 3.0]]
    with pytest.raises(ValueError, match="k_reg >= 0 and lam >= 0"):
        Raps(lam=-0.1)


def test_the_quantile_and_the_sets_by_hand():
    # THR on two classes, label 0 with p_0 = 1 - s: calibration scores s = 0.05, 0.10, ..., 0.50 (n = 10)
    s = torch.arange(1, 11, dtype=torch.float64) / 20
    calibration, labels = torch.stack([1 - s, s], dim=1), torch.zeros(10, dtype=torch.long)
    # alpha 0.2: the ceil(11 * 0.8) = 9th smallest, 0.45; alpha 0.1: the ceil(11 * 0.9) = 10th, 0.50
    at_20 = SplitConformal(0.2, "thr").calibrate(calibration, labels)
    assert at_20.quantile == pytest.approx(0.45, abs=1e-15) and at_20.calibration_size == 10
    assert SplitConformal(0.1, "lac").calibrate(calibration, labels).quantile == pytest.approx(0.5, abs=1e-15)
    new = _p([0.6, 0.4], [0.5, 0.5], [0.3, 0.7])  # THR scores (0.4, 0.6), (0.5, 0.5), (0.7, 0.3)
    assert at_20.sets(new).tolist() == [[True, False], [False, False], [False, True]]  # an empty set
    at_10 = SplitConformal(0.1, "thr").calibrate(calibration, labels)
    assert at_10.sets(new).tolist() == [[True, False], [True, True], [False, True]]
    assert coverage_and_size(at_10.sets(new), torch.tensor([1, 1, 0])) == {"coverage": 1 / 3, "set_size": 4 / 3}
    # APS, non-randomised, n = 4 at alpha 0.4: true-class scores 0.5 + 0.3, 0.6, 0.7 + 0.2 + 0.1, 0.4; the
    # ceil(5 * 0.6) = 3rd smallest is 0.8
    calibration = _p([0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.7, 0.2, 0.1], [0.4, 0.35, 0.25])
    aps = SplitConformal(0.4, "aps", randomized=False).calibrate(calibration, torch.tensor([1, 0, 2, 0]))
    assert aps.quantile == pytest.approx(0.8, abs=1e-15)
    # scores (0.6, 0.85, 1.0), (0.7, 0.7, 0.4), (0.9, 0.95, 0.95): the confident input gets an empty set (u = 1)
    new = _p([0.6, 0.25, 0.15], [0.3, 0.3, 0.4], [0.9, 0.05, 0.05])
    assert aps.sets(new).tolist() == [[True, False, False], [True, True, True], [False, False, False]]


def test_too_few_calibration_inputs_and_bad_arguments():
    assert [minimum_calibration(a) for a in (0.1, 0.2, 0.3, 0.5)] == [9, 4, 3, 1]
    with pytest.raises(ValueError, match="needs at least 9 labelled calibration inputs, got 8"):
        SplitConformal(0.1).calibrate(torch.full((8, 2), 0.5), torch.zeros(8, dtype=torch.long))
    SplitConformal(0.1).calibrate(torch.full((9, 2), 0.5), torch.zeros(9, dtype=torch.long))  # 9 is enough
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\)"):
        SplitConformal(1.5)
    with pytest.raises(ValueError, match="unknown conformal score 'naive'"):
        SplitConformal(0.1, "naive")
    with pytest.raises(ValueError, match="not calibrated"):
        SplitConformal(0.1).sets(torch.full((1, 2), 0.5))
    logits = torch.tensor([[5.0, 0.0], [4.0, -10.0]]).repeat(5, 1)  # a quantile of 4.85 fitted on logits, once
    with pytest.raises(ValueError, match="needs probabilities .* not logits"):
        SplitConformal(0.1).calibrate(logits, torch.zeros(10, dtype=torch.long))
    with pytest.raises(ValueError, match=r"integer class ids in \[0, 2\)"):
        SplitConformal(0.1).calibrate(torch.full((10, 2), 0.5), torch.full((10,), 2))
    with pytest.raises(ValueError, match="needs probabilities"):
        SplitConformal(0.5).calibrate(torch.full((3, 2), 0.5), torch.zeros(3, dtype=torch.long)).sets(logits)


def _exchangeable(trials, n, classes, seed):
    """`trials` independent data sets of n inputs: the model's probabilities p = softmax(z), z ~ N(0, 4), and labels
    drawn from softmax(z / 2), so the model is overconfident (the guarantee must not depend on it)."""
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(trials, n, classes, generator=g, dtype=torch.float64)
    labels = torch.multinomial((logits / 2).softmax(-1).view(-1, classes), 1, generator=g).view(trials, n)
    return logits.softmax(-1), labels


VARIANTS = {"thr": ("thr", True), "aps": ("aps", True), "aps, non-randomised": ("aps", False), "raps": ("raps", True)}


@pytest.mark.parametrize("variant", VARIANTS)
def test_coverage_over_random_splits_is_within_its_finite_sample_law(variant):
    """With exchangeable inputs and scores without ties, the number of the n_t test inputs covered by a split
    calibrated on n inputs is Beta-Binomial(n_t, k, n + 1 - k), k = ceil((n + 1)(1 - alpha)): the coverage
    probability given the calibration is F(q) = Beta(k, n + 1 - k) (q the k-th of n scores), each test input covered
    independently given it (Vovk 2012; Angelopoulos & Bates 2021, Sec. 3.2). Every score here is continuous in p, so
    there are no ties. From that law:
    - each split's count lies within the law's delta / 2 and 1 - delta / 2 quantiles, delta = 1e-3 / T: all T
      splits do with probability >= 1 - 1e-3 (Bonferroni, whatever the dependence);
    - the mean coverage over T independent splits has expectation k / (n + 1), in [1 - alpha, 1 - alpha + 1/(n+1)],
      and by Bernstein's inequality (coverage in [0, 1], variance sigma^2 from the law) lies within
      t = (2L/3 + sqrt((2L/3)^2 + 8 T L sigma^2)) / (2T) of it, L = ln(1e4), except with probability 2e-4.
    Each trial draws a fresh data set and splits it at random (a random split of i.i.d. data), so trials are
    independent."""
    score, randomized = VARIANTS[variant]
    trials, n, n_test, alpha = 2000, 100, 100, 0.1
    probs, labels = _exchangeable(trials, n + n_test, 5, seed=list(VARIANTS).index(variant))
    g = torch.Generator().manual_seed(7)
    covered = []
    for t in range(trials):
        order = torch.randperm(n + n_test, generator=g)
        calibration, test = order[:n], order[n:]
        conformal = SplitConformal(alpha, score, randomized, seed=t).calibrate(
            probs[t, calibration], labels[t, calibration]
        )
        sets = conformal.sets(probs[t, test])
        covered.append(int(sets.gather(1, labels[t, test][:, None]).sum()))
    covered = np.array(covered)

    k = math.ceil((n + 1) * (1 - alpha))
    law = betabinom(n_test, k, n + 1 - k)
    delta = 1e-3 / trials
    low, high = law.ppf(delta / 2), law.ppf(1 - delta / 2)
    assert ((covered >= low) & (covered <= high)).all(), (covered.min(), covered.max(), low, high)

    coverage = covered / n_test
    expected, sigma2, log_term = k / (n + 1), law.var() / n_test**2, math.log(1e4)
    tolerance = (2 * log_term / 3 + math.sqrt((2 * log_term / 3) ** 2 + 8 * trials * log_term * sigma2)) / (2 * trials)
    assert abs(coverage.mean() - expected) <= tolerance  # the exact expectation, k / (n + 1)
    assert coverage.mean() >= 1 - alpha - tolerance
    assert coverage.mean() <= 1 - alpha + 1 / (n + 1) + tolerance


def test_split_evaluation_on_member_logits_is_seeded_and_covers():
    g = torch.Generator().manual_seed(0)
    member_logits, labels = torch.randn(400, 3, 4, generator=g) * 2, torch.randint(0, 4, (400,), generator=g)
    first = split_evaluation(member_logits, labels, 0.1, "aps", splits=20)
    assert first == split_evaluation(member_logits, labels, 0.1, "aps", splits=20)  # seeded
    assert first["calibration_size"] == 200 and first["splits"] == 20 and 1 <= first["set_size"] <= 4
    # 20 splits of 200 / 200: mean coverage within 5 standard deviations of the law's (sd of one split ~0.03)
    assert abs(first["coverage"] - 0.9) < 5 * 0.03 / math.sqrt(20) + 1 / 201
    for share, splits, message in ((1.0, 20, "0 < calibration_share < 1"), (0.5, 0, "splits >= 1")):
        with pytest.raises(ValueError, match=message):
            split_evaluation(member_logits, labels, 0.1, "aps", splits=splits, calibration_share=share)
    with pytest.raises(ValueError, match="leaves no calibration inputs"):
        split_evaluation(member_logits, labels, 0.1, "aps", calibration_share=0.001)
    report = conformal_metrics(member_logits, labels, 0.1, splits=5)
    assert set(report) == {"thr", "aps", "raps"} and set(SCORES) == {"thr", "lac", "aps", "raps"}
    assert report["thr"]["set_size"] <= report["aps"]["set_size"]  # THR: the smallest sets on average


def test_the_same_inputs_get_the_same_randomised_sets_on_every_call():
    """The draws u are the seeded stream's, calibration first: a second call on the same inputs repeats the first
    (one generator advanced by every call gave another set to the same input)."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(2 * torch.randn(300, 5, generator=g), dim=1)
    labels = torch.multinomial(probs, 1, generator=g).squeeze(1)
    conformal = SplitConformal(0.1, "aps", seed=3).calibrate(probs[:200], labels[:200])
    first = conformal.sets(probs[200:])
    assert torch.equal(conformal.sets(probs[200:]), first)
    stream = torch.rand(300, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    by_hand = conformal.score(probs[200:].double(), stream[200:]) <= conformal.quantile  # draws 200.. of the stream
    assert torch.equal(first, by_hand)
    assert conformal.quantile == SplitConformal(0.1, "aps", seed=3).calibrate(probs[:200], labels[:200]).quantile
