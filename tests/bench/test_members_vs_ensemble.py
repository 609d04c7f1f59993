"""benchmarks/members_vs_ensemble.py: each ensemble against its own members alone, from recorded logits."""

import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

sys.path.insert(0, str(Path(__file__).parents[1] / "evaluation"))
from test_bootstrap import LABELS, _run, _table_metrics  # noqa: E402

from hydra_ensembles.evaluation.bootstrap import paired_bootstrap  # noqa: E402


def test_a_member_alone_is_its_slice_of_every_set():
    script, run = load_script("members_vs_ensemble"), _run(0)
    alone = script.member(run, 1)
    assert torch.equal(alone["test"], run["test"][:, 1:2])
    for part in ("near", "far", "ood"):
        assert alone[part].keys() == run[part].keys()
        assert all(torch.equal(alone[part][k], run[part][k][:, 1:2]) for k in run[part])


def test_the_ensembles_auroc_is_the_tables_and_a_lone_members_scores_agree():
    """'ensemble MSP' is the tables' all-OOD AUROC; with one member its mean MSP is its MSP and it has no
    disagreement (the mutual information is 0 everywhere: AUROC one half)."""
    script, run = load_script("members_vs_ensemble"), _run(0)
    assert script.auroc_all(run, "ensemble MSP", LABELS) == pytest.approx(
        100 * _table_metrics(run, LABELS)["auroc_all"]
    )
    alone = script.member(run, 2)
    assert script.auroc_all(alone, "members' mean MSP", LABELS) == pytest.approx(
        script.auroc_all(alone, "ensemble MSP", LABELS)
    )
    assert script.auroc_all(alone, "mutual information", LABELS) == pytest.approx(50.0)
    averaged, confident = (
        script.ood_score(run["test"], "ensemble MSP"),
        script.ood_score(run["test"], "members' mean MSP"),
    )
    assert (averaged >= confident - 1e-12).all()  # the mean's top probability is at most the members' mean top one


def test_every_member_is_compared_none_chosen():
    script = load_script("members_vs_ensemble")
    runs = {seed: _run(seed) for seed in (0, 1)}
    said = script.compare_row(runs, LABELS)
    assert said["seeds"] == [0, 1] and said["members"] == 3 and list(said["against"]) == [0, 1, 2]
    expected = paired_bootstrap([runs[0], runs[1]], [script.member(runs[s], 2) for s in (0, 1)], LABELS)
    assert said["against"][2] == expected
    assert set(said["per_seed"][1]) == {*script.SCORES, "member 0", "member 1", "member 2"}
    text = script.markdown("task", "cmd", {"Hydra (Circ)": said})
    assert text.count("- Hydra (Circ) vs its member ") == 3 and "| 1 | " in text
