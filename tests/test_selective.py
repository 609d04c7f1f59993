"""Selective classification metrics (AURC, AUGRC, risk at coverage, coverage at risk): hand-computed cases, the
AUGRC identity against scikit-learn's AUROC, a brute-force oracle of the curve, and torch-uncertainty 0.11's
formulas (written out here: torch-uncertainty does not import on this machine, its torchvision fails)."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from tolerances import reordered_sum

from hydra_ensembles import metrics as M
from hydra_ensembles.evaluation import plots
from hydra_ensembles.evaluation.report import selective_metrics
from hydra_ensembles.metrics.augrc import _compute as augrc_compute
from hydra_ensembles.metrics.aurc import confidence_and_error


def _two_class(confidence, error):
    """probs (N, 2) whose prediction is class 0 with probability `confidence`, labels wrong where `error`."""
    confidence = torch.tensor(confidence, dtype=torch.float64)
    return torch.stack([confidence, 1 - confidence], dim=1), torch.tensor(error, dtype=torch.long)


# Five inputs, confidences 0.95 > 0.85 > 0.75 > 0.65 > 0.55, the 2nd and 5th wrong. Accepting the k most confident:
# errors 0, 1, 1, 1, 2; coverage k/5; selective risk 0, 1/2, 1/3, 1/4, 2/5; generalized risk 0, 1/5, 1/5, 1/5, 2/5.
HAND = _two_class([0.95, 0.85, 0.75, 0.65, 0.55], [0, 1, 0, 0, 1])
FIRST_WRONG = _two_class([0.95, 0.85, 0.75, 0.65, 0.55], [1, 0, 0, 0, 0])


def test_aurc_by_hand():
    # c_1 r_1 + trapezoids: 0 + 1/5 [(0 + 1/2)/2 + (1/2 + 1/3)/2 + (1/3 + 1/4)/2 + (1/4 + 2/5)/2] = 1/5 * 154/120
    assert M.aurc(*HAND) == pytest.approx(float(Fraction(77, 300)), abs=1e-15)
    # the most confident input wrong: risk 1, 1/2, 1/3, 1/4, 1/5, the first held flat to coverage 0:
    # 1/5 + 1/5 [3/4 + 5/12 + 7/24 + 9/40] = 1/5 + 202/600
    assert M.aurc(*FIRST_WRONG) == pytest.approx(float(Fraction(161, 300)), abs=1e-15)


def test_augrc_by_hand():
    # from (0, 0): 1/5 [(0 + 0)/2 + (0 + 1/5)/2 + 1/5 + 1/5 + (1/5 + 2/5)/2] = 4/25; pairwise: the 2nd input is wrong
    # with 3 inputs below it (+ 1/2 for itself), the 5th with none (+ 1/2): (3.5 + 0.5) / 25
    assert M.augrc(*HAND) == pytest.approx(4 / 25, abs=1e-15)
    assert M.augrc(*FIRST_WRONG) == pytest.approx(4.5 / 25, abs=1e-15)  # 4 inputs below it, + 1/2


def test_risk_at_coverage_by_hand():
    assert M.risk_at_coverage(*HAND) == pytest.approx(1 / 4, abs=1e-15)  # 80 %: the 4 most confident, 1 wrong
    assert M.risk_at_coverage(*HAND, coverage=0.5) == pytest.approx(1 / 3, abs=1e-15)  # ceil(2.5) = 3 inputs
    assert M.risk_at_coverage(*HAND, coverage=0.2) == 0.0 and M.risk_at_coverage(*HAND, coverage=1.0) == 0.4
    # 0.28 * 25 = 7.000000000000001 in float64: still the 7 most confident of 25, not 8
    many = _two_class(np.linspace(0.99, 0.6, 25).tolist(), [0] * 6 + [1] + [0] + [1] * 17)
    assert M.risk_at_coverage(*many, coverage=0.28) == pytest.approx(1 / 7, abs=1e-15)


def test_coverage_at_risk_by_hand():
    assert M.coverage_at_risk(*HAND) == pytest.approx(0.2)  # 5 %: only the most confident input
    assert M.coverage_at_risk(*HAND, risk=0.3) == pytest.approx(0.8)  # risk 1/4 at 4 inputs, though 1/2 at 2
    assert M.coverage_at_risk(*HAND, risk=0.4) == 1.0  # 2/5 at all five: "at most" includes equality
    assert M.coverage_at_risk(*FIRST_WRONG) == 0.0  # no threshold qualifies: abstain on everything


# Ties: confidences 0.9, 0.7, 0.7, 0.5, errors at one of the 0.7s and at 0.5. Thresholds accept 1, 3, 4 inputs
# (the tied pair together) with 0, 1, 2 errors: coverage 1/4, 3/4, 1; risk 0, 1/3, 1/2; generalized 0, 1/4, 1/2.
TIED = ([0.9, 0.7, 0.7, 0.5], [0, 1, 0, 1])


def test_ties_by_hand_and_independent_of_row_order():
    expected = {
        "aurc": 1 / 4 * 0 + 1 / 2 * (0 + 1 / 3) / 2 + 1 / 4 * (1 / 3 + 1 / 2) / 2,  # = 3/16
        "augrc": 1 / 4 * (0 + 0) / 2 + 1 / 2 * (0 + 1 / 4) / 2 + 1 / 4 * (1 / 4 + 1 / 2) / 2,  # = 5/32
        "risk_at_coverage": 1 / 2,  # 80 % of 4 = 3.2: the 4 most confident, 2 wrong
        "coverage_at_risk": 1 / 4,  # 5 %: only the first threshold (no error)
    }
    for order in itertools.permutations(range(4)):
        probs, labels = _two_class([TIED[0][i] for i in order], [TIED[1][i] for i in order])
        got = {
            "aurc": M.aurc(probs, labels),
            "augrc": M.augrc(probs, labels),
            "risk_at_coverage": M.risk_at_coverage(probs, labels),
            "coverage_at_risk": M.coverage_at_risk(probs, labels),
        }
        assert got == pytest.approx(expected, abs=1e-15), order
        # half coverage takes the tied pair whole: 3 inputs, 1 wrong; risk 1/3 allows 3/4 coverage
        assert M.risk_at_coverage(probs, labels, coverage=0.5) == pytest.approx(1 / 3, abs=1e-15)
        assert M.coverage_at_risk(probs, labels, risk=0.35) == pytest.approx(0.75, abs=1e-15)


def test_augrc_with_ties_is_the_mean_over_orders_of_the_tied_inputs():
    # breaking the tie both ways (the wrong 0.7 above the right one, or below): pairwise (2.5 + 0.5) / 16 and
    # (1.5 + 0.5) / 16, the 0.5 for the wrong input at 0.5; their mean is 5/32
    confidence, error = np.array(TIED[0]), np.array(TIED[1], dtype=bool)
    untied = [augrc_compute(np.array(c), error) for c in ([0.9, 0.71, 0.7, 0.5], [0.9, 0.7, 0.71, 0.5])]
    assert untied == pytest.approx([3 / 16, 2 / 16], abs=1e-15)
    assert augrc_compute(confidence, error) == pytest.approx(np.mean(untied), abs=1e-15)


def _random(seed, n=300, classes=4, ties=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=g, dtype=torch.float64) * 2
    labels = torch.randint(0, classes, (n,), generator=g)
    logits[torch.arange(n), labels] += 1.5
    probs = logits.softmax(-1)
    if ties:  # six distinct confidences 0.4 .. 0.9 on the same arg-max, the rest spread evenly
        top = 0.4 + 0.1 * torch.randint(0, 6, (n,), generator=g).double()
        predicted = probs.argmax(dim=1)
        probs = ((1 - top) / (classes - 1))[:, None].repeat(1, classes)
        probs[torch.arange(n), predicted] = top
    return probs, labels


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_augrc_equals_its_auroc_form_with_sklearn(seed, ties):
    # AUGRC = (1 - AUROC_f) acc (1 - acc) + (1 - acc)^2 / 2, AUROC_f separating right from wrong by confidence
    probs, labels = _random(seed, ties=ties)
    confidence, error = confidence_and_error(probs, labels)
    acc = 1 - error.mean()
    auroc_f = roc_auc_score(~error, confidence)
    expected = (1 - auroc_f) * acc * (1 - acc) + (1 - acc) ** 2 / 2
    # float64 both: the curve's trapezoids and sklearn's rank sums, each <= 300 terms adding up to <= 1
    assert M.augrc(probs, labels) == pytest.approx(expected, abs=2 * reordered_sum(len(labels)))


def _oracle(confidence, error):
    """The risk-coverage curve threshold by threshold, with masks: (coverage, selective risk, generalized risk)."""
    points = [
        ((confidence >= t).mean(), error[confidence >= t].mean(), (error & (confidence >= t)).mean())
        for t in sorted(set(confidence), reverse=True)
    ]
    return [np.array(column) for column in zip(*points)]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_curve_metrics_match_a_threshold_by_threshold_oracle(seed, ties):
    probs, labels = _random(seed, ties=ties)
    confidence, error = confidence_and_error(probs, labels)
    coverage, risk, generalized = _oracle(confidence, error)
    tol = 2 * reordered_sum(len(labels))  # float64 sums of <= 300 terms adding up to <= 1, in two orders
    assert M.aurc(probs, labels) == pytest.approx(coverage[0] * risk[0] + np.trapezoid(risk, coverage), abs=tol)
    augrc = coverage[0] * generalized[0] / 2 + np.trapezoid(generalized, coverage)
    assert M.augrc(probs, labels) == pytest.approx(augrc, abs=tol)
    assert M.risk_at_coverage(probs, labels, 0.8) == pytest.approx(risk[coverage >= 0.8][0], abs=tol)
    assert M.coverage_at_risk(probs, labels, 0.2) == pytest.approx(coverage[risk <= 0.2].max(initial=0.0), abs=tol)


def _torch_uncertainty(confidence, error):
    """torch-uncertainty 0.11's risk_coverage.py, written out: inputs sorted by confidence, descending; risk of the k
    most confident E_k / k; AURC and AUGRC the trapezoids over coverage k / N, k = 1..N, divided by 1 - 1/N; risk at
    80 % the risk of the ceil(0.8 N) most confident; coverage at 5 % the largest k / N with risk <= 5 % (NaN: none)."""
    n = len(confidence)
    errors = np.cumsum(error[np.argsort(-confidence, kind="stable")])
    risk, coverage = errors / np.arange(1, n + 1), np.arange(1, n + 1) / n
    admissible = np.flatnonzero(risk <= 0.05)
    return {
        "aurc": np.trapezoid(risk, coverage) / (1 - 1 / n),
        "augrc": np.trapezoid(errors / n, coverage) / (1 - 1 / n),
        "risk_at_coverage": risk[int(np.ceil(0.8 * n)) - 1],
        "coverage_at_risk": coverage[admissible[-1]] if len(admissible) else float("nan"),
        "first_risk": risk[0],
    }


@pytest.mark.parametrize("first_wrong", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_without_ties_torch_uncertainty_differs_only_by_its_normalisation(seed, first_wrong):
    # its curve starts at coverage 1/N and is divided by 1 - 1/N; ours starts at 0 (the risk of the most confident
    # input held flat, the generalized risk from 0): ours = theirs (1 - 1/N) + r_1 / N, and + g_1 / (2N) for AUGRC
    probs, labels = _random(seed, n=400, classes=3)
    if first_wrong:  # the most confident prediction made wrong: r_1 = 1, the boundary terms count
        top = probs.max(dim=1).values.argmax()
        labels[top] = (probs[top].argmax() + 1) % 3
    confidence, error = confidence_and_error(probs, labels)
    assert len(np.unique(confidence)) == len(confidence)
    theirs, n = _torch_uncertainty(confidence, error), len(labels)
    tol = 2 * reordered_sum(n)
    assert M.aurc(probs, labels) == pytest.approx(theirs["aurc"] * (1 - 1 / n) + theirs["first_risk"] / n, abs=tol)
    augrc = theirs["augrc"] * (1 - 1 / n) + theirs["first_risk"] / (2 * n * n)  # g_1 = r_1 / N: one input accepted
    assert M.augrc(probs, labels) == pytest.approx(augrc, abs=tol)
    assert abs(M.aurc(probs, labels) - theirs["aurc"]) <= 1 / n  # (r_1 - theirs) / N
    assert M.risk_at_coverage(probs, labels) == pytest.approx(theirs["risk_at_coverage"], abs=tol)
    assert M.coverage_at_risk(probs, labels) == pytest.approx(np.nan_to_num(theirs["coverage_at_risk"]), abs=tol)


def test_edge_cases():
    right, wrong = _two_class([0.9, 0.8, 0.6], [0, 0, 0]), _two_class([0.9, 0.8, 0.6], [1, 1, 1])
    assert (M.aurc(*right), M.augrc(*right), M.risk_at_coverage(*right), M.coverage_at_risk(*right)) == (0, 0, 0, 1)
    assert (M.aurc(*wrong), M.augrc(*wrong), M.risk_at_coverage(*wrong), M.coverage_at_risk(*wrong)) == (1, 0.5, 1, 0)
    one_tie = _two_class([0.7] * 4, [1, 0, 0, 0])  # one threshold: everything or nothing
    assert M.aurc(*one_tie) == 0.25 and M.augrc(*one_tie) == 0.125 and M.coverage_at_risk(*one_tie) == 0.0
    assert M.aurc(*_two_class([0.9], [1])) == 1.0 and M.augrc(*_two_class([0.9], [1])) == 0.5
    # confident inputs whose max p rounds to 1.0 keep their order (ranked by the off-top mass, as MSP)
    margins = torch.tensor([40.0, 50.0, 60.0], dtype=torch.float64)
    confident = torch.stack([margins, torch.zeros(3, dtype=torch.float64)], dim=1).softmax(-1)
    assert (confident.max(dim=1).values == 1.0).all()
    # margin 60, 50 right, 40 wrong: risk 0, 0, 1/3 at coverage 1/3, 2/3, 1 -> AURC 1/3 (0 + 1/3) / 2 = 1/18 (tied: 1/3)
    assert M.aurc(confident, torch.tensor([1, 0, 0])) == pytest.approx(1 / 18, abs=1e-15)


def test_errors_name_the_problem():
    probs, labels = HAND
    with pytest.raises(ValueError, match="coverage must be in"):
        M.risk_at_coverage(probs, labels, coverage=0.0)
    with pytest.raises(ValueError, match="risk must be in"):
        M.coverage_at_risk(probs, labels, risk=1.5)
    with pytest.raises(ValueError, match=r"probs \(N, C\) and labels \(N,\)"):
        M.aurc(probs, labels[:3])
    with pytest.raises(ValueError, match="NaN"):
        M.augrc(torch.full((2, 2), float("nan")), torch.tensor([0, 1]))


def test_selective_metrics_of_member_logits_and_the_plot(tmp_path):
    g = torch.Generator().manual_seed(0)
    member_logits, labels = torch.randn(60, 3, 4, generator=g) * 2, torch.randint(0, 4, (60,), generator=g)
    member_logits[torch.arange(60), :, labels] += 2  # better than chance: every level reads a different point
    got = selective_metrics(member_logits, labels)
    assert (
        got
        != selective_metrics(member_logits, labels, coverage=0.7)
        != selective_metrics(member_logits, labels, risk=0.1)
    )
    probs = member_logits.double().softmax(-1).mean(dim=1)  # the ensemble's prediction, float64
    assert got == {
        "aurc": M.aurc(probs, labels),
        "augrc": M.augrc(probs, labels),
        "risk_at_coverage": M.risk_at_coverage(probs, labels, 0.8),
        "coverage_at_risk": M.coverage_at_risk(probs, labels, 0.05),
    }
    sharper = probs**2 / (probs**2).sum(dim=1, keepdim=True)
    path = plots.risk_coverage({"a": (probs, labels), "b": (sharper, labels)}, tmp_path / "rc.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
