"""benchmarks/members_vs_ensemble.py: each ensemble against its own members alone, from recorded logits."""

import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

sys.path.insert(0, str(Path(__file__).parents[1] / "evaluation"))
from test_bootstrap import LABELS, _run, _table_metrics  # noqa: E402

from hydra_ensembles.bench.suite import all_ood_auroc, members_of  # noqa: E402
from hydra_ensembles.evaluation.bootstrap import paired_bootstrap  # noqa: E402
from hydra_ensembles.evaluation.ood import OOD_SCORES  # noqa: E402


def test_a_members_logits_are_its_slice_of_every_set():
    run = _run(0)
    alone = members_of(run, slice(1, 2))
    assert torch.equal(alone["test"], run["test"][:, 1:2])
    for group in ("near", "far", "ood"):
        assert alone[group].keys() == run[group].keys()
        assert all(torch.equal(alone[group][k], run[group][k][:, 1:2]) for k in run[group])


def test_the_scores_agree_with_the_tables_and_with_one_another():
    """'ensemble MSP' is the tables' all-OOD AUROC; the expected entropy and the mutual information are the two
    parts of the predictive entropy; one member has no disagreement (mutual information 0 everywhere: AUROC one
    half) and its expected entropy is its entropy."""
    script, run = load_script("members_vs_ensemble"), _run(0)
    scores = script.SCORES
    table = 100 * _table_metrics(run, LABELS)["auroc_all"]
    assert 100 * all_ood_auroc(run, LABELS, score=scores["ensemble MSP"]) == pytest.approx(table)
    data, model = (OOD_SCORES[scores[name]](run["test"]) for name in ("expected entropy", "mutual information"))
    assert torch.allclose(data + model, OOD_SCORES["entropy"](run["test"]))
    assert (model > 0).all() and not torch.allclose(data, OOD_SCORES["entropy"](run["test"]))
    alone = members_of(run, slice(2, 3))
    assert torch.allclose(OOD_SCORES["expected_entropy"](alone["test"]), OOD_SCORES["entropy"](alone["test"]))
    assert all_ood_auroc(run, LABELS, slice(2, 3), score=scores["mutual information"]) == pytest.approx(0.5)


def test_every_member_is_compared_none_chosen():
    script = load_script("members_vs_ensemble")
    runs = {seed: _run(seed) for seed in (0, 1)}
    said = script.compare_row(runs, LABELS)
    assert said["seeds"] == [0, 1] and said["members"] == 3 and list(said["against"]) == [0, 1, 2]
    expected = paired_bootstrap([runs[0], runs[1]], [members_of(runs[s], slice(2, 3)) for s in (0, 1)], LABELS)
    assert said["against"][2] == {metric: interval._asdict() for metric, interval in expected.items()}
    assert said["per_seed"][1]["member 1"] == pytest.approx(100 * all_ood_auroc(runs[1], LABELS, slice(1, 2)))
    assert set(said["per_seed"][1]) == {*script.SCORES, "member 0", "member 1", "member 2"}
    text = script.markdown("task", "cmd", {"Hydra (Circ)": said})
    assert text.count("- Hydra (Circ) vs its member ") == 3 and "| 1 | " in text
