"""Penultimate features of every classifier predictor, and feature-space OOD detectors fit on them, saved with the
predictor, loaded back and used through `collect_scores` (what `predict --score` and `evaluate --score` call)."""

from __future__ import annotations

import pytest
import torch
from conftest import MODELS, at_trained_scale, make_inputs, perturb, random_head_maps
from tolerances import CONTRACT

import hydra_ensembles as he
from hydra_ensembles.evaluation.scores import collect_scores
from hydra_ensembles.outputs import PredictorOutput, member_logits_of
from hydra_ensembles.predictors import DeepEnsemble, load_predictor, save_predictor
from hydra_ensembles.predictors.feature_ood import FEATURE_SCORES
from hydra_ensembles.predictors.feature_scored import FEATURE_SCORE_NAMES, FeatureScored, fit_feature_scores
from hydra_ensembles.predictors.features import classifiers, collect_features
from hydra_ensembles.predictors.load import Wrapper

CLASSIFIERS = ["bert", "roberta", "mpnet", "distilbert", "vit", "dinov2", "clip_classifier"]
SETTINGS = {"k": 3, "vim_dim": 8}  # tiny models: D = 32, a few dozen training inputs


def _batches(name: str, count: int = 4, seed: int = 0, classes: int = 3) -> list[dict]:
    """`count` labelled batches of 8 inputs for the tiny model `name`."""
    g = torch.Generator().manual_seed(seed)
    return [
        make_inputs(name, batch=8, seed=seed * 100 + i) | {"labels": torch.randint(0, classes, (8,), generator=g)}
        for i in range(count)
    ]


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_features_are_what_the_classifier_reads(name):
    """One pass gives features and logits: the logits are the model's own, and W f + b of the features."""
    model, inputs = at_trained_scale(name), make_inputs(name)
    features, found = collect_features(model, [inputs])
    expected = member_logits_of(model(**inputs)).detach()
    torch.testing.assert_close(features.logits, expected, rtol=0, atol=0)
    recomputed = features.features[:, 0] @ found.weight[0].T + found.bias[0]
    torch.testing.assert_close(recomputed, expected[:, 0], rtol=0, atol=CONTRACT)
    assert features.features.shape[:2] == (len(expected), 1)


def test_bert_features_are_its_pooler_output():
    model, inputs = at_trained_scale("bert"), make_inputs("bert")
    features, _ = collect_features(model, [inputs])
    with torch.no_grad():
        pooled = model.bert(**inputs).pooler_output
    torch.testing.assert_close(features.features[:, 0], pooled, rtol=0, atol=0)


def test_two_classifiers_have_no_one_feature_vector():
    with pytest.raises(ValueError, match="one final linear classifier"):
        collect_features(MODELS["deit_teacher"](), [make_inputs("deit_teacher")])


@pytest.mark.parametrize("name", ["bert", "vit", "roberta"])
def test_a_fused_ensemble_gives_each_members_own_features(name):
    """Contract 3 for features: mlp="stack" members fused give the features and classifier weights of each
    member run alone (inside torch.vmap, where the hook returns [f, z])."""
    members = [
        perturb(m, seed=i) for i, m in enumerate(he.build_members(at_trained_scale(name), random_head_maps(3, seed=3)))
    ]
    fused = he.HydraEnsemble.fuse(members, mlp="stack")
    inputs = make_inputs(name)
    got, found = collect_features(fused, [inputs])
    alone, alone_found = collect_features(DeepEnsemble(members), [inputs])
    assert got.features.shape == alone.features.shape == (4, 3, 32)
    assert (got.features - alone.features).abs().max().item() <= CONTRACT
    assert (got.logits - alone.logits).abs().max().item() <= CONTRACT
    torch.testing.assert_close(found.weight, alone_found.weight, rtol=0, atol=0)
    torch.testing.assert_close(found.bias, alone_found.bias, rtol=0, atol=0)


def test_a_batch_ensemble_gives_each_members_own_features():
    """Member m of a BatchEnsemble (its fast weights random) has the features and classifier of `member(m)`, the
    plain HF model holding its weights; the detectors fit and score through the one pass."""
    ensemble = he.predictors.batch_ensemble(at_trained_scale("bert"), members=2, seed=0)
    inputs = make_inputs("bert")
    got, found = collect_features(ensemble, [inputs])
    alone, alone_found = collect_features(DeepEnsemble([ensemble.member(m) for m in range(2)]), [inputs])
    assert got.features.shape == alone.features.shape == (4, 2, 32)
    assert (got.features[:, 1] - got.features[:, 0]).abs().max() > 1e-2  # the members differ
    assert (got.features - alone.features).abs().max().item() <= CONTRACT
    assert (got.logits - alone.logits).abs().max().item() <= CONTRACT
    torch.testing.assert_close(found.weight, alone_found.weight, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(found.bias, alone_found.bias, rtol=0, atol=0)
    scored = fit_feature_scores(ensemble, _batches("bert"), **SETTINGS)
    logits, scores = collect_scores(scored, [inputs], "mds")
    assert logits.shape == (4, 2, 3) and scores.shape == (4,) and torch.isfinite(scores).all()
    direct = scored.ood_scores(inputs, "mds")  # called from Python: scores, not the forward pass's graph
    assert not any(t.requires_grad for t in direct) and torch.allclose(direct[1], scores)


def test_an_ensembles_score_is_the_mean_of_its_members_scores():
    """Fit on a deep ensemble, each score equals the mean of the scores of detectors fit on each member alone."""
    members = [perturb(at_trained_scale("bert"), seed=i) for i in range(3)]
    train, test = _batches("bert"), _batches("bert", count=1, seed=7)
    ensemble = fit_feature_scores(DeepEnsemble(members), train, **SETTINGS)
    alone = [fit_feature_scores(m, train, **SETTINGS) for m in members]
    for name in FEATURE_SCORES:
        expected = torch.stack([collect_scores(m, test, name)[1] for m in alone]).mean(0)
        torch.testing.assert_close(collect_scores(ensemble, test, name)[1], expected, rtol=0, atol=1e-12)


def test_detectors_save_and_load_with_the_predictor(tmp_path):
    """A fused ensemble with its detectors: loaded back, it predicts and scores exactly as saved."""
    members = he.build_members(at_trained_scale("bert"), random_head_maps(2, seed=1, min_heads=1))
    scored = fit_feature_scores(he.HydraEnsemble.fuse(members), _batches("bert"), **SETTINGS)
    save_predictor(scored, tmp_path / "scored")
    loaded = load_predictor(tmp_path / "scored")
    assert isinstance(loaded, FeatureScored) and loaded.examples == 32
    assert he.predictors.describe_saved(tmp_path / "scored").endswith("(mds, rmds, knn, vim) fit on 32 inputs")
    test = _batches("bert", count=2, seed=5)
    for name in FEATURE_SCORE_NAMES:
        logits, scores = collect_scores(scored, test, name)
        loaded_logits, loaded_scores = collect_scores(loaded, test, name)
        assert scores.dtype == torch.float64 and scores.shape == (16,)
        torch.testing.assert_close(loaded_scores, scores, rtol=0, atol=0)
        torch.testing.assert_close(loaded_logits, logits, rtol=0, atol=0)


class Doubled(Wrapper):
    """A wrapper that changes the logits (as a calibration map does): twice the model's."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    @property
    def base(self):
        return self.model

    def forward(self, **inputs):
        return PredictorOutput(member_logits=2 * member_logits_of(self.model(**inputs)))


def test_scores_read_the_features_under_a_wrapper_and_the_logits_over_it():
    model, train, test = at_trained_scale("bert"), _batches("bert"), _batches("bert", count=1, seed=3)
    plain = fit_feature_scores(model, train, scores=["mds"], **SETTINGS)
    inside = fit_feature_scores(Doubled(model), train, scores=["mds"], **SETTINGS)  # features: the model's
    outside = Doubled(plain)  # the wrapper over the detectors: its logits, the detectors' features
    expected_logits, expected = collect_scores(plain, test, "mds")
    for wrapped in (inside, outside):
        logits, scores = collect_scores(wrapped, test, "mds")
        torch.testing.assert_close(scores, expected, rtol=0, atol=0)
        torch.testing.assert_close(logits, 2 * expected_logits, rtol=0, atol=0)


def test_classifiers_refuses_an_encoder():
    with pytest.raises(ValueError, match="no classifier"):
        classifiers(he.HydraEnsemble.fuse([MODELS["bert_encoder"]()]))


def test_mimo_is_refused_with_the_reason_not_a_count_of_classifiers():
    """MIMO was looked through to its network, whose one classifier has M x C outputs: the error counted 0 final
    classifiers of C outputs."""
    with pytest.raises(ValueError, match="MIMO network's members share one feature vector.*logit score"):
        fit_feature_scores(he.predictors.mimo(MODELS["vit"]()), _batches("vit"), **SETTINGS)


def test_detectors_are_fit_in_one_pass_that_keeps_no_inputs():
    """The training loader was read into a list (every batch's inputs kept, tens of GB on a large set) so that
    its labels could be read in a second pass. One pass now: a shuffling loader's labels line up too."""
    model, batches = at_trained_scale("bert"), _batches("bert")
    examples = [{k: v[i] for k, v in batch.items()} for batch in batches for i in range(len(batch["labels"]))]
    shuffled = torch.utils.data.DataLoader(examples, batch_size=8, shuffle=True)
    in_order, reshuffled = (fit_feature_scores(model, loader, **SETTINGS) for loader in (batches, shuffled))
    test = _batches("bert", count=1, seed=7)
    for name in FEATURE_SCORES:
        torch.testing.assert_close(collect_scores(reshuffled, test, name)[1], collect_scores(in_order, test, name)[1])
    unlabelled = [{k: v for k, v in batch.items() if k != "labels"} for batch in batches]
    with pytest.raises(ValueError, match="a batch of the training loader has no 'labels'"):
        fit_feature_scores(model, iter(unlabelled), **SETTINGS)
