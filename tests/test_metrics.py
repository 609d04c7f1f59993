"""Metrics against scikit-learn and torchmetrics, on random inputs and edge cases."""

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, average_precision_score, log_loss, roc_auc_score, roc_curve
from tolerances import U32, reordered_sum
from torchmetrics.functional.classification import multiclass_calibration_error

import hydra_ensembles as he
from hydra_ensembles import metrics as M
from hydra_ensembles.evaluation.ood import OOD_SCORES


def _probs(n=400, classes=4, seed=0, sharp=2.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=g) * sharp
    labels = torch.randint(0, classes, (n,), generator=g)
    logits[torch.arange(n), labels] += 1.0  # better than chance
    return logits.softmax(-1), labels


def _ood(seed, n=300, ties=False):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=n)
    is_ood = rng.random(n) < 0.4
    scores[is_ood] += 0.8
    if ties:
        scores = np.round(scores)  # a handful of distinct values
    return torch.tensor(scores), torch.tensor(is_ood)


# ---- classification ----


@pytest.mark.parametrize("seed", range(3))
def test_accuracy_nll_brier_match_sklearn(seed):
    probs, labels = _probs(seed=seed)
    assert M.accuracy(probs, labels) == pytest.approx(accuracy_score(labels, probs.argmax(-1)))
    exact = probs.double() / probs.double().sum(-1, keepdim=True)
    # sklearn gets rows renormalised in float64; ours sum to 1 within the float32 rounding of 4 terms, so the two
    # log-probabilities differ by at most log(1 + reordered_sum(4, 1, U32)) ~ 4.8e-7, plus float64 noise
    assert M.nll(probs, labels) == pytest.approx(log_loss(labels, exact, labels=range(4)), abs=reordered_sum(4, 1, U32))
    one_hot = np.eye(4)[labels]
    reference = ((probs.double().numpy() - one_hot) ** 2).sum(1).mean()  # float64 both: 400 rows x 4 terms <= 2
    assert M.brier(probs, labels) == pytest.approx(reference, abs=reordered_sum(1600, 2.0))


@pytest.mark.parametrize("seed", range(3))
def test_ece_matches_torchmetrics(seed):
    probs, labels = _probs(seed=seed, sharp=1.0 + seed)
    reference = multiclass_calibration_error(probs.double(), labels, num_classes=4, n_bins=15, norm="l1").item()
    # torchmetrics sums the 400 inputs' gaps (each <= 1, so <= 400 in all) in float32, then divides by 400
    assert M.ece(probs, labels) == pytest.approx(reference, abs=reordered_sum(400, 400, U32) / 400)


def test_calibration_edge_cases():
    one_hot = torch.eye(3)[[0, 1, 2, 0]]
    assert M.ece(one_hot, torch.tensor([0, 1, 2, 0])) == 0.0  # confident and right
    assert M.ece(one_hot, torch.tensor([1, 2, 0, 1])) == 1.0  # confident and wrong
    assert M.adaptive_ece(one_hot, torch.tensor([1, 2, 0, 1])) == 1.0
    # p = 0 costs -log(float64 eps) = 36.04 nats (the documented clamp, sklearn's), not inf
    assert M.nll(one_hot, torch.tensor([1, 2, 0, 1])) == pytest.approx(-np.log(np.finfo(np.float64).eps), abs=1e-12)
    assert M.nll(one_hot, torch.tensor([1, 2, 0, 1])) == pytest.approx(
        log_loss([1, 2, 0, 1], one_hot.double().numpy(), labels=range(3)), abs=1e-9
    )
    assert M.brier(one_hot, torch.tensor([1, 2, 0, 1])) == 2.0
    single_class = torch.tensor([[1.0], [1.0]])
    assert M.ece(single_class, torch.tensor([0, 0])) == 0.0 and M.nll(single_class, torch.tensor([0, 0])) == 0.0
    nan = torch.tensor([[0.5, 0.5], [float("nan"), float("nan")]])  # softmax of an inf logit
    for metric in (M.ece, M.adaptive_ece, M.nll, M.brier):  # ECE crashed (index out of range), the rest gave NaN
        with pytest.raises(ValueError, match="1 row.s. of the probabilities hold NaN"):
            metric(nan, torch.tensor([0, 1]))
        with pytest.raises(ValueError, match="N > 0"):
            metric(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))


def test_adaptive_ece_does_not_depend_on_the_order_of_tied_rows():
    # confidences 0.9 (right), 0.7 x 3 (right, wrong, wrong), 0.6 (right), 0.5 (wrong) in 3 equal-mass bins of 2:
    # the run of 0.7s crosses the bin boundaries and goes whole to the bin of its first input (sorted position 2).
    # Bins: {0.5, 0.6}: |1 - 1.1| = 0.1; {0.7, 0.7, 0.7}: |1 - 2.1| = 1.1; {0.9}: |1 - 0.9| = 0.1 -> 1.3 / 6.
    confidence = torch.tensor([0.9, 0.7, 0.7, 0.7, 0.6, 0.5], dtype=torch.float64)
    correct = torch.tensor([1, 1, 0, 0, 1, 0])
    probs = torch.stack([confidence, 1 - confidence], dim=1)
    labels = torch.where(correct.bool(), 0, 1)
    values = {M.adaptive_ece(probs[order], labels[order], bins=3) for order in map(torch.tensor, PERMUTATIONS)}
    assert len(values) == 1 and values.pop() == pytest.approx(1.3 / 6, abs=1e-12)


PERMUTATIONS = [[0, 1, 2, 3, 4, 5], [0, 3, 2, 1, 4, 5], [5, 4, 3, 2, 1, 0], [2, 0, 5, 3, 1, 4], [3, 1, 2, 5, 0, 4]]


def test_ood_scores_are_float64_so_near_scores_do_not_tie():
    # two inputs whose MSPs differ by less than float32 can resolve: float32 would rank them as a tie
    logits = torch.tensor([[[0.0, 20.0]], [[0.0, 20.0 + 1e-6]]], dtype=torch.float64)
    for name, score in OOD_SCORES.items():
        assert score(logits).dtype == torch.float64, name
    msp = OOD_SCORES["msp"](logits)
    assert msp[0] != msp[1]
    assert M.auroc(msp, torch.tensor([True, False])) == 1.0  # input 0, the less sure, scores higher: no tie


def test_adaptive_ece_by_hand():
    # confidences 0.9, 0.8, 0.7, 0.6 with correctness 1, 0, 1, 1 in 2 equal-mass bins:
    # bin {0.6, 0.7}: acc 1, conf 0.65 -> 0.35 * 2/4; bin {0.8, 0.9}: acc 0.5, conf 0.85 -> 0.35 * 2/4
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    labels = torch.tensor([0, 1, 0, 0])
    assert M.adaptive_ece(probs, labels, bins=2) == pytest.approx(0.35)
    assert M.adaptive_ece(probs, labels, bins=15) == pytest.approx(M.ece(probs, labels, bins=100))  # 1 per bin


# ---- OOD detection ----


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_ood_metrics_match_sklearn(seed, ties):
    scores, is_ood = _ood(seed, ties=ties)
    tol = reordered_sum(len(scores))  # float64 both; sums of <= N = 300 terms that add up to <= 1
    assert M.auroc(scores, is_ood) == pytest.approx(roc_auc_score(is_ood, scores), abs=tol)
    assert M.aupr_out(scores, is_ood) == pytest.approx(average_precision_score(is_ood, scores), abs=tol)
    assert M.aupr_in(scores, is_ood) == pytest.approx(average_precision_score(~is_ood, -scores), abs=tol)
    fpr, tpr, _ = roc_curve(is_ood, scores, drop_intermediate=False)
    assert M.fpr_at_tpr(scores, is_ood) == pytest.approx(fpr[np.searchsorted(tpr, 0.95, side="left")], abs=tol)


def test_ood_edge_cases():
    perfect = torch.tensor([0.1, 0.2, 0.8, 0.9])
    labels = torch.tensor([False, False, True, True])
    assert M.auroc(perfect, labels) == 1.0 and M.fpr_at_tpr(perfect, labels) == 0.0
    assert M.aupr_in(perfect, labels) == 1.0 and M.aupr_out(perfect, labels) == 1.0
    assert M.fpr_at_tpr(-perfect, labels) == 1.0  # reversed: every ID sample flagged
    tied = torch.tensor([0.5, 0.5, 0.5, 0.5])
    assert M.auroc(tied, labels) == 0.5 and M.fpr_at_tpr(tied, labels) == 1.0
    assert M.aupr_out(tied, labels) == 0.5
    with pytest.raises(ValueError, match="only one class"):
        M.fpr_at_tpr(perfect, torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="only one class"):
        M.auroc(perfect, torch.zeros(4, dtype=torch.bool))
    # a NaN score: AUROC ranked it last, AUPR first, FPR95 never flagged it; refused by every metric
    nan = torch.tensor([0.1, float("nan"), 0.8, 0.9])
    # an overflowed logit's energy or max logit, -inf: passed for the most in-distribution input of all
    minus_inf = torch.tensor([0.1, 0.2, float("-inf"), 0.9])
    for metric in (M.auroc, M.aupr_in, M.aupr_out, M.fpr_at_tpr):
        for bad in (nan, minus_inf):
            with pytest.raises(ValueError, match="1 OOD score.s. are NaN or infinite"):
                metric(bad, labels)
        # class ids or OpenOOD's -1 labels read as "every nonzero is OOD" (AUROC 1.0 here); 0/1 ints are flags
        with pytest.raises(ValueError, match=r"is_positive as bool \(True = OOD\) or 0/1, got the values \[-1, 0, 2\]"):
            metric(perfect, torch.tensor([0, -1, 2, 2]))
        assert metric(perfect, labels.long()) == metric(perfect, labels)
    # integer scores: negating uint8 wrapped around (AUPR-Out 0.583 where the float scores give 1.0)
    small = torch.tensor([0, 10, 200, 250], dtype=torch.uint8)
    for metric in (M.aupr_in, M.aupr_out, M.auroc, M.fpr_at_tpr):
        assert metric(small, labels) == metric(small.double(), labels)


# ---- model uncertainty ----


def test_ensemble_probs_average_member_softmax():
    member_logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])  # (B=1, M=2, C=2), members disagree
    p = torch.tensor([2.0, 0.0]).softmax(-1)
    # float32 softmax of 2 classes, averaged over 2 members: each probability within 2 roundings of 0.5
    assert torch.allclose(he.ensemble_probs(member_logits), torch.tensor([[0.5, 0.5]]), atol=4 * U32, rtol=0)
    expected_mi = np.log(2) + (p * p.log()).sum().item()  # H(mean) - mean H
    # float32: softmax, log, product and sum of 2 members x 2 classes are <= 8 roundings of values <= 1
    assert he.mutual_information(member_logits).item() == pytest.approx(expected_mi, abs=reordered_sum(8, 1, U32))
    for uncertainty in (he.ensemble_probs, he.mutual_information):  # an HF model's (B, C) logits: averaged over C
        with pytest.raises(ValueError, match=r"must be \(B, M, C\), got shape \(1, 2\).*logits\[:, None\]"):
            uncertainty(member_logits[:, 0])


def test_mutual_information_is_zero_when_members_agree_and_bounded_by_log_m():
    agree = torch.randn(5, 1, 3).expand(5, 4, 3)
    # float32: H[mean] - mean H of 4 equal members of 3 classes: softmax, log, product and the sums over 3 classes
    # and 4 members are <= 16 roundings of values <= log 3 per entropy
    assert torch.allclose(he.mutual_information(agree), torch.zeros(5), atol=reordered_sum(16, np.log(3), U32))
    confident_disagreement = torch.eye(3)[None] * 50.0  # 3 members, each sure of a different class
    # exact value log 3 - (entropies of 50-logit softmaxes, ~1e-20): <= 16 float32 roundings of values <= log 3
    assert he.mutual_information(confident_disagreement).item() == pytest.approx(
        np.log(3), abs=reordered_sum(16, np.log(3), U32)
    )


def test_disagreement_counts_member_pairs():
    logits = torch.tensor([[[1.0, 0], [1, 0], [0, 1]], [[1, 0], [1, 0], [1, 0]]])  # (2, 3, 2)
    assert M.disagreement(logits).tolist() == pytest.approx([4 / 6, 0.0])
    assert M.disagreement(logits[:, :1]).tolist() == [0.0, 0.0]


def test_msp_does_not_saturate_for_confident_inputs():
    # margins of 40-60 nats: max_c p_c rounds to 1.0 in float64, but 1 - max_c p_c is sigmoid(-margin), exactly
    margins = torch.tensor([40.0, 50.0, 60.0], dtype=torch.float64)
    logits = torch.stack([torch.zeros(3, dtype=torch.float64), margins], dim=-1)[:, None, :]  # (3, 1, 2)
    assert (he.ensemble_probs(logits).amax(-1) == 1.0).all()  # the subtraction would tie all three
    score = OOD_SCORES["msp"](logits)
    assert torch.allclose(score, torch.sigmoid(-margins), rtol=1e-12, atol=0)
    assert M.auroc(score, torch.tensor([True, False, False])) == 1.0  # the least confident scores highest
    # an ensemble: the mean of its members' mass off the ensemble's top class
    members = torch.tensor([[[0.0, 45.0, 0.0], [0.0, 50.0, 3.0]]], dtype=torch.float64)
    off_top = members.softmax(-1)[..., [0, 2]].sum(-1).mean(-1)
    assert torch.allclose(OOD_SCORES["msp"](members), off_top, rtol=1e-12, atol=0)


def test_logits_bad_labels_and_bad_arguments_are_refused_not_measured():
    """Logits passed as probabilities gave a negative NLL (-0.896), an ECE of 1.5, a Brier score of 3.1; a label
    out of range was counted wrong by ECE and crashed NLL with an index error."""
    logits, probs = torch.tensor([[3.0, -1.0], [0.5, 2.0]]), torch.tensor([[0.9, 0.1], [0.3, 0.7]])
    for metric in (M.nll, M.ece, M.brier, M.adaptive_ece):
        with pytest.raises(ValueError, match="needs probabilities .* not logits"):
            metric(logits, torch.tensor([0, 1]))
        with pytest.raises(ValueError, match=r"integer class ids in \[0, 2\)"):
            metric(probs, torch.tensor([0, 2]))
    for metric in (M.aurc, M.augrc):  # ranked by a meaningless off-top sum of logits; label 5 counted wrong
        with pytest.raises(ValueError, match="needs probabilities .* not logits"):
            metric(logits, torch.tensor([0, 1]))
        with pytest.raises(ValueError, match=r"integer class ids in \[0, 2\)"):
            metric(probs, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="bins >= 1"):
        M.ece(probs, torch.tensor([0, 1]), bins=0)
    # accuracy counted a NaN row and an out-of-range or float label as wrong
    with pytest.raises(ValueError, match="1 row.s. of the predictions hold NaN"):
        M.accuracy(torch.tensor([[0.2, 0.8], [float("nan"), 0.0]]), torch.tensor([1, 0]))
    for labels in (torch.tensor([1, 5]), torch.tensor([1.0, 1.7])):
        with pytest.raises(ValueError, match=r"accuracy needs integer class ids in \[0, 2\)"):
            M.accuracy(logits, labels)
    scores, is_ood = torch.tensor([0.1, 0.9, 0.4]), torch.tensor([False, True, True])
    with pytest.raises(ValueError, match=r"true-positive rate in \(0, 1\]"):
        M.fpr_at_tpr(scores, is_ood, tpr=1.5)
    for metric in (M.fpr_at_tpr, M.average_precision, M.auroc):
        with pytest.raises(ValueError, match=r"both \(N,\)"):
            metric(scores, is_ood[:2])


def test_labels_of_refuses_a_shuffling_loader_and_a_loader_labelled_in_part():
    """calibrate(model, collect_member_logits(model, loader), labels_of(loader)) reads the loader twice: a shuffling
    DataLoader would pair logits with another order's labels, silently."""
    from hydra_ensembles.outputs import labels_of

    rows = [{"x": torch.tensor([float(i)]), "labels": torch.tensor(i % 2)} for i in range(6)]
    data = torch.utils.data
    reshuffling = {
        "RandomSampler": dict(shuffle=True),
        "SubsetRandomSampler": dict(sampler=data.SubsetRandomSampler(range(4))),
        "WeightedRandomSampler": dict(sampler=data.WeightedRandomSampler([1.0] * 6, 6)),
    }
    for name, how in reshuffling.items():
        with pytest.raises(ValueError, match=f"sampler \\({name}\\) may read another order on each pass"):
            labels_of(data.DataLoader(rows, batch_size=2, **how))
    assert labels_of(data.DataLoader(rows, batch_size=2)).tolist() == [0, 1, 0, 1, 0, 1]
    # a list of indices and a custom batch sampler read their own order on every pass: taken, not refused
    assert labels_of(data.DataLoader(rows, batch_size=2, sampler=[5, 4, 3, 2, 1, 0])).tolist() == [1, 0] * 3
    assert labels_of(data.DataLoader(rows, batch_sampler=[[1, 0], [2]])).tolist() == [1, 0, 0]
    batches = [{"labels": torch.tensor([0, 1])}, {"x": torch.ones(2)}]
    with pytest.raises(ValueError, match="1 of the loader's 2 batches have no 'labels'"):
        labels_of(batches)


def test_shapes_that_would_broadcast_into_a_wrong_value_are_refused():
    """(N, 1) labels or targets broadcast against (N,) into (N, N): accuracy and the Gaussian NLL returned a number."""
    probs, labels = _probs(n=30)
    with pytest.raises(ValueError, match=r"labels \(N,\).*got \(30, 4\) and \(30, 1\)"):
        M.accuracy(probs, labels[:, None])
    gaussians, targets = torch.randn(30, 3, 2), torch.randn(30)
    with pytest.raises(ValueError, match=r"targets \(N,\), got \(30, 3, 2\) and \(30, 1\)"):
        M.gaussian_mixture_nll(gaussians, targets[:, None])
    with pytest.raises(ValueError, match=r"\(N, M, 2\)"):
        M.gaussian_mixture_nll(gaussians[..., 0], targets)
    with pytest.raises(ValueError, match="N > 0"):
        M.gaussian_mixture_nll(gaussians[:0], targets[:0])
    gaussians[3, 1, 0] = float("nan")  # returned NaN where every other metric refuses it
    with pytest.raises(ValueError, match="1 NaN prediction row"):
        M.gaussian_mixture_nll(gaussians, targets)
    with pytest.raises(ValueError, match="bins >= 1 .an integer., got True"):  # bool is an int: crashed in torch
        M.ece(probs, labels, bins=True)


def test_disagreement_is_float64_and_aupr_in_takes_lists_as_the_other_ood_metrics_do():
    logits = torch.randn(8, 3, 4, dtype=torch.bfloat16)
    assert M.disagreement(logits).dtype == torch.float64 and M.disagreement(logits[:, :1]).dtype == torch.float64
    scores, is_ood = _ood(0, n=40)
    assert M.aupr_in(scores.tolist(), is_ood.tolist()) == M.aupr_in(scores, is_ood)
