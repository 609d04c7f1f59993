"""Metrics against scikit-learn, on random inputs and edge cases."""

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, roc_auc_score

import hydra_ensembles as he
from hydra_ensembles.evaluation.metrics import accuracy, auroc


@pytest.mark.parametrize("seed", range(5))
def test_auroc_matches_sklearn_on_random_scores(seed):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=300)
    labels = rng.random(300) < 0.3
    scores[labels] += 0.7
    assert auroc(torch.tensor(scores), torch.tensor(labels)) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_auroc_with_heavy_ties_matches_sklearn():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, size=200).astype(float)  # four distinct values only
    labels = rng.random(200) < 0.5
    assert auroc(torch.tensor(scores), torch.tensor(labels)) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_auroc_edge_cases():
    assert auroc(torch.tensor([0.1, 0.2, 0.8, 0.9]), torch.tensor([0, 0, 1, 1])) == 1.0  # perfect separation
    assert auroc(torch.tensor([0.9, 0.8, 0.2, 0.1]), torch.tensor([0, 0, 1, 1])) == 0.0
    assert auroc(torch.tensor([0.5, 0.5, 0.5]), torch.tensor([0, 1, 1])) == 0.5  # all tied
    with pytest.raises(ValueError, match="only one class"):
        auroc(torch.tensor([0.1, 0.2]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="must both be"):
        auroc(torch.tensor([0.1, 0.2]), torch.tensor([1, 0, 1]))


def test_accuracy_matches_sklearn():
    logits = torch.randn(50, 4, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 4, (50,), generator=torch.Generator().manual_seed(1))
    assert accuracy(logits, labels) == pytest.approx(accuracy_score(labels, logits.argmax(-1)))
    with pytest.raises(ValueError, match="N > 0"):
        accuracy(torch.zeros(0, 3), torch.zeros(0))


def test_ensemble_probs_average_member_softmax():
    member_logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])  # (B=1, M=2, C=2), members disagree
    p = torch.tensor([2.0, 0.0]).softmax(-1)
    assert torch.allclose(he.ensemble_probs(member_logits), torch.tensor([[0.5, 0.5]]))
    expected_mi = np.log(2) + (p * p.log()).sum().item()  # H(mean) - mean H
    assert he.mutual_information(member_logits).item() == pytest.approx(expected_mi, abs=1e-6)


def test_mutual_information_is_zero_when_members_agree_and_bounded_by_log_m():
    agree = torch.randn(5, 1, 3).expand(5, 4, 3)
    assert torch.allclose(he.mutual_information(agree), torch.zeros(5), atol=1e-6)
    confident_disagreement = torch.eye(3)[None] * 50.0  # 3 members, each sure of a different class
    assert he.mutual_information(confident_disagreement).item() == pytest.approx(np.log(3), abs=1e-5)
