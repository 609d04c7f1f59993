"""Calibration maps: each fixes a miscalibrated ensemble, the logit maps reduce to the identity where they should,
the probability maps match hand-computed cases and scikit-learn's IsotonicRegression, and every map saves and
loads back inside the one `calibrated` predictor kind."""

import warnings

import pytest
import torch
from conftest import MODELS, make_inputs
from sklearn.isotonic import IsotonicRegression
from tolerances import U64

from hydra_ensembles import metrics
from hydra_ensembles import predictors as P
from hydra_ensembles.predictors.calibration import PROBABILITY_FLOOR
from hydra_ensembles.uncertainty import ensemble_probs, mutual_information

F64 = torch.float64


def _miscalibrated(n: int = 3000, members: int = 3, spread: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Member logits (N, M, 4), `spread` around a centre, and labels (N,) of an ensemble that is overconfident
    (labels drawn at T = 2.5 from the centre) and biased against class 0 (its true logit is 1 higher): every map
    has something to fix."""
    g = torch.Generator().manual_seed(0)
    centre = torch.randn(n, 4, generator=g, dtype=F64) * 3
    truth = (centre / 2.5 + torch.tensor([1.0, 0, 0, 0], dtype=F64)).softmax(-1)
    labels = torch.multinomial(truth, 1, generator=g)[:, 0]
    return centre[:, None] + spread * torch.randn(n, members, 4, generator=g, dtype=F64), labels


def _nll(member_logits: torch.Tensor, labels: torch.Tensor) -> float:
    return metrics.nll(ensemble_probs(member_logits.double()), labels)


@pytest.mark.parametrize("method", sorted(P.CALIBRATION_MAPS))
def test_each_map_lowers_the_nll_of_a_miscalibrated_ensemble(method):
    logits, labels = _miscalibrated()
    fit, held_out = slice(0, 2000), slice(2000, None)
    calibration_map = P.fit_calibration(method, logits[fit], labels[fit])
    for part in (fit, held_out):  # on the validation data it was fitted on, and on data it has not seen
        calibrated = calibration_map.apply(logits[part])
        assert _nll(calibrated, labels[part]) < _nll(logits[part], labels[part]) - 0.1, part  # by 0.3-0.4 here
    members = 3 if calibration_map.on_members else 1  # a probability map returns the ensemble as one member
    assert calibrated.shape == (1000, members, 4) and calibrated.dtype == logits.dtype


def test_temperature_scaling_never_raises_the_nll_it_reports_on_its_own_data():
    """The fit minimised the exact NLL while every table reports it floored at 2.2e-16 (36 nats an example): three
    confidently wrong examples (400 nats each, exactly) pulled T to ~140, and the reported NLL rose."""
    logits = torch.tensor([12.0, 0.0], dtype=F64).repeat(200, 1)
    logits[:3] = torch.tensor([-400.0, 0.0], dtype=F64)
    logits[3:23] = torch.tensor([0.0, 2.0], dtype=F64)  # wrong by a little: the NLL has a minimum in T
    logits, labels = logits[:, None], torch.zeros(200, dtype=torch.long)  # (N, 1, 2): one member
    temperature = P.fit_temperature(logits, labels)
    with pytest.warns(UserWarning, match=r"3 held-out example\(s\) are wrong beyond the NLL's floor"):
        P.fit_temperature(logits[[*range(3), *range(23, 200)]], labels[:180])  # no mildly wrong ones: no minimum
    assert _nll(logits / temperature, labels) <= _nll(logits, labels) + 1e-9
    assert temperature < 5  # 2.76: the others decide it; the floored three pull on nothing (old fit: 235)


def test_vector_scaling_recovers_a_known_scale_and_bias():
    logits, labels = _miscalibrated(n=6000, members=1, spread=0)  # the truth: a vector scaling of the logits
    fitted = P.VectorScaling.fit(logits, labels)
    assert fitted.scale.tolist() == pytest.approx([1 / 2.5] * 4, rel=0.15)
    relative_bias = fitted.bias - fitted.bias[1:].mean()  # softmax ignores a common shift of the biases
    assert relative_bias[0].item() == pytest.approx(1.0, abs=0.2)
    with pytest.warns(UserWarning, match="no minimum"):  # all right: the scales grow without limit
        P.VectorScaling.fit(logits[:100], logits[:100, 0].argmax(-1))
    with pytest.warns(UserWarning, match=r"class\(es\) \[3\] never appear in the held-out labels"):
        P.VectorScaling.fit(logits[:200], labels[:200].clamp(max=2))


def test_a_temperature_that_still_sharpens_the_nll_is_warned_of():
    """Every example has a member confidently right (each member wrong on its own 2 %): the NLL falls towards
    its limit as T -> 0, so the fitted T is only where L-BFGS stopped."""
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (300,), generator=g)
    logits = torch.full((300, 3, 4), 0.0, dtype=F64)
    logits[torch.arange(300), :, labels] = 8.0
    for m in range(3):  # member m wrong (confidently) on examples m, m + 3, ... of the first 18
        wrong = torch.arange(m, 18, 3)
        logits[wrong, m] = 0.0
        logits[wrong, m, (labels[wrong] + 1) % 4] = 8.0
    with pytest.warns(UserWarning, match="still falls as the temperature sharpens"):
        P.fit_temperature(logits, labels)
    fitted = slice(0, 2000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a temperature with a minimum: no warning
        P.fit_temperature(*(t[fitted] for t in _miscalibrated()))


def test_vector_scaling_with_unit_scales_and_zero_biases_is_the_identity():
    logits = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(1)) * 5  # float32, as models return
    identity = P.VectorScaling(torch.ones(4, dtype=F64), torch.zeros(4, dtype=F64))
    assert torch.equal(identity.apply(logits), logits)


def test_dirichlet_with_the_identity_matrix_and_zero_bias_equals_vector_scalings_identity():
    logits = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(2), dtype=F64) * 5
    dirichlet = P.DirichletScaling(torch.eye(4, dtype=F64), torch.zeros(4, dtype=F64))
    vector = P.VectorScaling(torch.ones(4, dtype=F64), torch.zeros(4, dtype=F64))
    # log softmax(z) = z - logsumexp(z): the same softmax up to the rounding of a subtraction of numbers <= max|z|
    tolerance = 10 * logits.abs().max().item() * U64
    for summary in (ensemble_probs, mutual_information):  # each member kept, not only their mean
        assert torch.allclose(summary(dirichlet.apply(logits)), summary(vector.apply(logits)), rtol=0, atol=tolerance)


def test_odir_pulls_the_off_diagonal_weights_to_zero():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3000, 1, 4, generator=g, dtype=F64) * 3
    mixing = torch.eye(4, dtype=F64) + 0.8 * torch.tensor([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0.0]])
    labels = torch.multinomial((logits[:, 0].log_softmax(-1) @ mixing.T).softmax(-1), 1, generator=g)[:, 0]
    free = P.DirichletScaling.fit(logits, labels, off_diagonal=0.0, intercept=0.0)
    pulled = P.DirichletScaling.fit(logits, labels, off_diagonal=1e3, intercept=1e3)
    assert free.summary()["off_diagonal_rms"] > 0.2  # the truth mixes classes 0 and 1: the free fit finds it
    assert pulled.summary()["off_diagonal_rms"] < free.summary()["off_diagonal_rms"] / 10
    assert pulled.summary()["bias_abs_max"] < free.summary()["bias_abs_max"] / 10


def _as_logits(probs: list[list[float]]) -> torch.Tensor:
    """One member whose softmax is `probs`: its log-probabilities, (N, 1, C) float64."""
    return torch.tensor(probs, dtype=F64).log()[:, None]


# float64 softmax(log p) = p up to a few roundings: a piecewise-constant map of it is exact to that
EXACT = 16 * U64


def test_histogram_binning_matches_a_hand_computed_case():
    val = _as_logits([[0.6, 0.3, 0.1], [0.7, 0.2, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7]])
    binned = P.HistogramBinning.fit(val, torch.tensor([0, 1, 1, 2]), bins=4)
    # per class c and bin b of p_c ([0, .25), [.25, .5), [.5, .75), [.75, 1]): the fraction of class c among the
    # validation inputs whose p_c is in b; an empty bin keeps its midpoint (.375, .875)
    by_hand = [[0, 0.375, 0.5, 0.875], [0.5, 0, 1, 0.875], [0, 0.375, 1, 0.875]]
    assert torch.allclose(binned.bin_values, torch.tensor(by_hand, dtype=F64), rtol=0, atol=EXACT)
    probs = binned.apply(_as_logits([[0.4, 0.05, 0.55], [0.6, 0.3, 0.1]]))[:, 0].exp()
    # row 1: bins 1, 0, 2 -> (.375, .5, 1) / 1.875; row 2: bins 2, 1, 0 -> (.5, 0, 0), zeros floored, renormalised
    floor = PROBABILITY_FLOOR
    expected = [[0.2, 4 / 15, 8 / 15], [0.5 / (0.5 + 2 * floor), floor / (0.5 + 2 * floor), floor / (0.5 + 2 * floor)]]
    assert torch.allclose(probs, torch.tensor(expected, dtype=F64), rtol=0, atol=EXACT)


def test_isotonic_regression_matches_a_hand_computed_case():
    val = _as_logits([[0.9, 0.1], [0.7, 0.3], [0.5, 0.5], [0.3, 0.7]])
    isotonic = P.IsotonicCalibration.fit(val, torch.tensor([0, 1, 0, 1]))
    # class 1 (and class 0 mirrored): p = .1 .3 .5 .7 with [y = 1] = 0 1 0 1; pooling the violating pair gives
    # 0 .5 .5 1, linear between the points and constant beyond them
    probs = isotonic.apply(_as_logits([[0.8, 0.2], [0.6, 0.4], [0.95, 0.05]]))[:, 0].exp()
    # p_1 = .2 -> class 1: .25, class 0 (p_0 = .8): .75; p_1 = .4 -> .5, .5; p_1 = .05 -> 0 (floored), 1
    expected = [[0.75, 0.25], [0.5, 0.5], [1 / (1 + PROBABILITY_FLOOR), PROBABILITY_FLOOR / (1 + PROBABILITY_FLOOR)]]
    # the knots are softmax outputs, off by a few roundings, and the slopes (2.5) carry that into the values
    assert torch.allclose(probs, torch.tensor(expected, dtype=F64), rtol=0, atol=10 * EXACT)


def test_isotonic_regression_is_scikit_learns_one_vs_rest_then_renormalised():
    g = torch.Generator().manual_seed(4)
    val_logits, test_logits = (torch.randn(n, 2, 3, generator=g, dtype=F64) * 3 for n in (200, 50))
    beyond = torch.tensor([[40.0, 0, 0], [0, 0, 40]], dtype=F64)[:, None].expand(2, 2, 3)  # p_c beyond the val range
    test_logits = torch.cat([test_logits, beyond])
    labels = torch.randint(0, 3, (200,), generator=g)
    isotonic = P.IsotonicCalibration.fit(val_logits, labels)
    val_probs, test_probs = ensemble_probs(val_logits).numpy(), ensemble_probs(test_logits)
    reference = torch.stack(
        [
            torch.from_numpy(
                IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip")
                .fit(val_probs[:, c], (labels == c).double().numpy())
                .predict(test_probs[:, c].numpy())
            )
            for c in range(3)
        ],
        dim=1,
    )  # (52, 3), test inputs beyond the validation range included (clipped)
    # the same interpolation formula on the same knots: equal up to the last bit of numbers <= 1
    assert torch.allclose(isotonic.one_vs_rest(test_probs), reference, rtol=0, atol=4 * U64)
    floored = reference.clamp_min(PROBABILITY_FLOOR)
    renormalised = floored / floored.sum(-1, keepdim=True)
    assert torch.allclose(isotonic.apply(test_logits)[:, 0].exp(), renormalised, rtol=0, atol=4 * U64)


@pytest.mark.parametrize("method", sorted(P.CALIBRATION_MAPS))
def test_a_calibrated_predictor_saves_and_loads_back_equal(tmp_path, method):
    model = P.DeepEnsemble([MODELS["bert"](seed=0), MODELS["bert"](seed=1)])
    g = torch.Generator().manual_seed(5)
    fit = torch.randn(40, 2, 3, generator=g) * 3
    calibrated = P.calibrate(model, fit, torch.randint(0, 3, (40,)), method)
    calibration_map = calibrated.calibration_map
    path = P.save_predictor(calibrated, tmp_path / method)
    loaded = P.load_predictor(path)
    assert type(loaded) is P.Calibrated and type(loaded.calibration_map) is type(calibration_map)
    assert P.saved_kind(path) == "calibrated"
    assert P.describe_saved(path) == f"a deep ensemble of 2 models, {calibration_map.described}"
    assert P.num_members(loaded) == (2 if calibration_map.on_members else 1)
    inputs = make_inputs("bert")
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).member_logits, calibrated(**inputs).member_logits)
    # the whole map, not only where the tiny model's outputs fall (2 of a histogram's 15 bins)
    assert torch.equal(loaded.calibration_map.apply(fit), calibration_map.apply(fit))


def test_an_unknown_method_names_the_known_ones(tmp_path):
    logits, labels = _miscalibrated(n=20)
    with pytest.raises(ValueError, match=r"unknown calibration method 'platt'.*'dirichlet'.*'vector'"):
        P.fit_calibration("platt", logits, labels)
    with pytest.raises(ValueError, match=r"member logits \(N, M, C\) and labels \(N,\)"):
        P.fit_calibration("vector", logits[:, 0], labels)


@pytest.mark.parametrize("method", ["temperature", "vector", "dirichlet", "histogram", "isotonic"])
def test_labels_out_of_range_are_refused_by_every_map(method):
    """Histogram and isotonic fits read a label >= C (or -100, the ignore index) as no class and shrank every
    class's probability; the logit maps failed inside gather with an index error."""
    logits = torch.randn(12, 2, 3, generator=torch.Generator().manual_seed(0))
    for bad in (3, -100):
        labels = torch.tensor([0, 1, 2] * 3 + [0, 1, bad])
        with pytest.raises(ValueError, match=r"integer class ids in \[0, 3\)"):
            P.fit_calibration(method, logits, labels)
    with pytest.raises(ValueError, match=r"labels \(N,\); got \(12, 2, 3\) and \(12, 1\)"):  # broadcast to (N, N, M)
        P.fit_calibration(method, logits, torch.tensor([0, 1, 2] * 4)[:, None])
