"""OOD scores by name (`evaluation.scores.collect_scores`) and GEN, the logit score of Liu et al. (2023)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import at_trained_scale, make_inputs

from hydra_ensembles.evaluation.ood import OOD_SCORES, gen
from hydra_ensembles.evaluation.scores import collect_scores
from hydra_ensembles.predictors import fit_feature_scores


def _batches(count: int = 2, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [
        make_inputs("bert", batch=8, seed=seed * 100 + i) | {"labels": torch.randint(0, 3, (8,), generator=g)}
        for i in range(count)
    ]


def test_gen_by_hand():
    """Two classes at 1/2 each: 2 (1/2)^0.1 (1/2)^0.1 = 2^0.8. Logits (100, 0): p = (1 - e^-100, e^-100) to float64
    precision, each term (e^-100)^0.1 = e^-10 (the top class's too: 1 - p_1 is summed from the other class, not
    rounded to 0). Two members each certain of another class average to (1/2, 1/2). top=1: the largest term only."""
    assert OOD_SCORES["gen"] is gen
    confident = torch.tensor([[[0.0, 0.0]], [[100.0, 0.0]]])  # (B=2, M=1, C=2)
    expected = torch.tensor([2**0.8, 2 * math.exp(-10)], dtype=torch.float64)
    torch.testing.assert_close(gen(confident), expected, rtol=1e-12, atol=0)
    disagreeing = torch.tensor([[[100.0, 0.0], [0.0, 100.0]]])  # (1, 2, 2)
    torch.testing.assert_close(gen(disagreeing), torch.tensor([2**0.8], dtype=torch.float64), rtol=0, atol=1e-12)
    three = torch.log(torch.tensor([[[0.5, 0.3, 0.2]]], dtype=torch.float64))
    expected = (0.5 * 0.5) ** 0.1
    assert float(gen(three, top=1)) == pytest.approx(expected, abs=1e-12)
    assert float(gen(three)) == pytest.approx(expected + (0.3 * 0.7) ** 0.1 + (0.2 * 0.8) ** 0.1, abs=1e-12)


def test_collect_scores_takes_logit_scores_of_any_model_and_asks_for_fitted_detectors():
    model, test = at_trained_scale("bert"), _batches(1)
    logits, scores = collect_scores(model, test, "gen")
    assert logits.shape == (8, 1, 3) and scores.dtype == torch.float64
    torch.testing.assert_close(scores, OOD_SCORES["gen"](logits.double()), rtol=0, atol=0)
    with pytest.raises(ValueError, match="hydra-ens ood --model"):
        collect_scores(model, test, "vim")
    only_knn = fit_feature_scores(model, _batches(4), scores=["knn"], k=3)
    with pytest.raises(ValueError, match="was not fit for this model"):
        collect_scores(only_knn, test, "vim_concat")
    with pytest.raises(ValueError, match="unknown OOD score 'mahalanobis'"):
        collect_scores(only_knn, test, "mahalanobis")


def test_member_disagreement_scores_are_refused_for_one_member_where_a_threshold_is_set():
    """Mutual information and disagreement are 0 for every input of one member: predict --score flagged nothing
    (threshold 0, no score above it), silently. evaluate measures them (AUROC 50, chance)."""
    from hydra_ensembles.evaluation.scores import check_flags_something

    model, test = at_trained_scale("bert"), _batches(1)
    for score in ("mutual_information", "disagreement"):
        logits, scores = collect_scores(model, test, score)
        assert scores.abs().max() == 0
        with pytest.raises(ValueError, match=f"OOD score '{score}' measures how the members disagree"):
            check_flags_something(score, logits)
    check_flags_something("mutual_information", torch.zeros(4, 2, 3))  # two members: scored


def test_energy_is_refused_on_log_probabilities_and_kept_on_logits():
    """A probability map's logits are log-probabilities: logsumexp is 0 up to rounding, so energy ranks noise."""
    from hydra_ensembles.outputs import collect_member_logits, labels_of
    from hydra_ensembles.predictors.calibration import Calibrated, HistogramBinning, TemperatureScaling

    model, val = at_trained_scale("bert"), _batches(4)
    logits, labels = collect_member_logits(model, val), labels_of(val)
    histogram = Calibrated(model, HistogramBinning.fit(logits, labels))
    assert collect_member_logits(histogram, val).double().logsumexp(-1).abs().max() < 1e-5  # why: energy ~ 0
    with pytest.raises(ValueError, match="'energy' reads the logits' scale.*histogram or isotonic"):
        collect_scores(histogram, val, "energy")
    assert collect_scores(histogram, val, "msp")[1].shape == (32,)
    from hydra_ensembles.inference import prepare

    with pytest.raises(ValueError, match="'energy' reads the logits' scale"):  # under a precision wrapper too
        collect_scores(prepare(histogram, "bf16"), val, "energy")
    temperature = Calibrated(model, TemperatureScaling(2.0))  # a logit map: energy keeps its meaning
    said = collect_scores(temperature, val, "energy")[1]
    torch.testing.assert_close(said, OOD_SCORES["energy"](logits.double() / 2), rtol=0, atol=1e-6)
