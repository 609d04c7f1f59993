"""Reports in the paper's table shape, and OOD scores."""

import pytest
import torch
from conftest import MODELS, make_inputs, random_head_maps

import hydra_ensembles as he
from hydra_ensembles import metrics as M
from hydra_ensembles.evaluation import OOD_SCORES, evaluate
from hydra_ensembles.outputs import collect_member_logits


def _logits(n, seed, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 4, generator=g) * 2 + shift


def test_evaluate_reports_id_per_set_and_group_averages():
    id_logits, labels = _logits(50, 0, 1.0), torch.arange(50) % 4
    near, far = {"a": _logits(30, 1)}, {"b": _logits(20, 2), "c": _logits(25, 3)}
    report = evaluate(id_logits, labels, near, far)
    probs = he.ensemble_probs(id_logits.double())  # evaluation computes in float64 (docs/evaluation.md)
    assert report["id"]["acc"] == M.accuracy(probs, labels) and report["id"]["nll"] == M.nll(probs, labels)
    scores = torch.cat([OOD_SCORES["msp"](id_logits), OOD_SCORES["msp"](far["b"])])
    is_ood = torch.cat([torch.zeros(50), torch.ones(20)]).bool()
    assert report["ood"]["b"]["auroc"] == M.auroc(scores, is_ood)
    assert report["far"]["auroc"] == pytest.approx((report["ood"]["b"]["auroc"] + report["ood"]["c"]["auroc"]) / 2)
    assert report["all"]["fpr95"] == pytest.approx(sum(report["ood"][s]["fpr95"] for s in "abc") / 3)
    assert report["near"]["aupr_in"] == report["ood"]["a"]["aupr_in"]


def test_ood_scores_are_higher_for_less_confident_inputs():
    confident = torch.tensor([[[9.0, 0, 0]]] * 2)
    unsure = torch.tensor([[[1.0, 0.9, 0.8], [0.8, 1.0, 0.9]]])
    for name, score in OOD_SCORES.items():
        if name == "disagreement":
            assert score(unsure).item() == 1.0 and score(confident[:1]).item() == 0.0
        elif name != "mutual_information":
            assert score(unsure.mean(1, keepdim=True)).item() > score(confident[:1]).item(), name
    assert OOD_SCORES["mutual_information"](unsure).item() > 0


def test_collect_member_logits_from_any_predictor():
    model = MODELS["vit"]()
    batches = [make_inputs("vit", seed=s) | {"labels": torch.zeros(4, dtype=torch.long)} for s in (1, 2)]
    single = collect_member_logits(model, batches)
    assert single.shape == (8, 1, 5)
    ensemble = he.HydraEnsemble.fuse(he.build_members(model, random_head_maps(3, seed=0)))
    assert collect_member_logits(ensemble, batches).shape == (8, 3, 5)
    with pytest.raises(ValueError, match="empty"):
        collect_member_logits(model, [])


def test_id_positive_convention_on_request():
    from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

    from hydra_ensembles.evaluation import ood_metrics

    generator = torch.Generator().manual_seed(3)
    id_logits, ood_logits = 3 * torch.randn(200, 2, 4, generator=generator), torch.randn(150, 2, 4, generator=generator)
    ood_pos, id_pos = ood_metrics(id_logits, ood_logits), ood_metrics(id_logits, ood_logits, positive="id")
    # ID positive, scored by MSP itself: FPR95 = share of OOD accepted when 95% of ID is kept (sklearn's ROC);
    # AUROC and AUPR-In are the same whichever class is called positive (computed here from the ID side)
    msp = torch.cat([1 - OOD_SCORES["msp"](id_logits), 1 - OOD_SCORES["msp"](ood_logits)]).numpy()
    is_id = [1] * 200 + [0] * 150
    assert id_pos["auroc"] == pytest.approx(roc_auc_score(is_id, msp), abs=1e-12)
    assert id_pos["aupr_in"] == pytest.approx(average_precision_score(is_id, msp), abs=1e-12)
    fpr, tpr, _ = roc_curve(is_id, msp, drop_intermediate=False)
    assert id_pos["fpr95"] == pytest.approx(fpr[tpr >= 0.95][0])
    assert id_pos["fpr95"] != ood_pos["fpr95"]
    with pytest.raises(ValueError, match="positive must be"):
        ood_metrics(id_logits, ood_logits, positive="in")
    with pytest.raises(ValueError, match="unknown OOD score"):
        ood_metrics(id_logits, ood_logits, score="odin")


def test_ood_logits_of_another_predictor_or_of_the_wrong_kind_are_refused():
    """OOD logits with other classes or members than the ID ones gave an AUROC without a word (0.0 here)."""
    logits, labels = torch.randn(4, 3, 3), torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match=r"\(4, 3, 2\) do not match the ID ones \(4, 3, 3\)"):
        evaluate(logits, labels, near={"n": logits[..., :2]})
    with pytest.raises(ValueError, match=r"do not match the ID ones"):
        evaluate(logits, labels, far={"f": logits[:, :2]})  # two members of three
    with pytest.raises(ValueError, match=r"must be a tensor \(N, M, C\), got list: collect"):
        evaluate(logits, labels, near={"n": [{"input_ids": torch.ones(1, 2)}]})  # a loader, not logits
    with pytest.raises(TypeError, match=r"OOD sets go by name: pass \{name: data\}, got list"):
        evaluate(logits, labels, near=[logits])
    assert evaluate(logits, labels, near={"n": torch.randn(5, 3, 3)})["near"]["auroc"] >= 0  # the right kind runs
    from hydra_ensembles.outputs import labels_of

    with pytest.raises(ValueError, match="the loader is empty"):  # was "the loader has no 'labels'"
        labels_of([])


def test_expected_entropy_and_mutual_information_split_the_entropy():
    """Data plus model uncertainty is the total: the members' mean entropy plus their mutual information is the
    entropy of their mean; a single model's expected entropy is its entropy."""
    logits = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(0)) * 3
    data, model = OOD_SCORES["expected_entropy"](logits), OOD_SCORES["mutual_information"](logits)
    assert torch.allclose(data + model, OOD_SCORES["entropy"](logits)) and (model > 1e-3).all()
    assert torch.allclose(OOD_SCORES["expected_entropy"](logits[:, :1]), OOD_SCORES["entropy"](logits[:, :1]))
