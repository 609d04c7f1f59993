"""The distillation experiments' plumbing, on the spiral with short training (the numbers are the CLI's job)."""

import pytest
import torch

from hydra_ensembles.bench.distillation import MLP_CONFIG, spiral_seed


def test_spiral_seed_distils_the_ensemble_into_a_kd_and_a_hydra_student():
    rows, models = spiral_seed(0, members=4, config=MLP_CONFIG.with_(epochs=3), temperatures=(1.0, 2.0))
    assert list(rows) == ["Ensemble (4 MLPs)", "KD", "Hydra"]
    assert [m.num_members for m in models.values()] == [4, 1, 4]
    assert set(rows["Hydra"]) >= {"acc", "nll", "mu_gap_id", "mu_gap_ood", "auroc_ood", "auroc_ood_mi", "params"}
    assert rows["Hydra"]["params"] > rows["KD"]["params"]  # 4 heads on the body vs 1
    assert rows["KD"]["temperature"] in (1.0, 2.0) and rows["Ensemble (4 MLPs)"]["temperature"] is None


def test_a_row_averages_its_ood_sets_as_the_suite_does_not_pools_them():
    """Near / far AUROC and |ΔMU| are means over the group's sets (pooling would weigh a set by its size)."""
    from hydra_ensembles.bench import distillation as bench
    from hydra_ensembles.evaluation import ood_metrics

    g = torch.Generator().manual_seed(0)
    logits = {
        "test": 3 * torch.randn(40, 3, 4, generator=g),
        "near": {"small": torch.randn(10, 3, 4, generator=g), "large": 2 * torch.randn(200, 3, 4, generator=g)},
        "far": {"one": torch.randn(30, 3, 4, generator=g)},
    }
    teacher = {k: (v / 2 if k == "test" else {n: x / 2 for n, x in v.items()}) for k, v in logits.items()}
    row = bench._benchmark_row(logits, teacher, torch.randint(0, 4, (40,), generator=g))
    per_set = [ood_metrics(logits["test"], logits["near"][n])["auroc"] for n in ("small", "large")]
    pooled = ood_metrics(logits["test"], torch.cat(list(logits["near"].values())))["auroc"]
    assert row["auroc_near"] == pytest.approx(sum(per_set) / 2) and row["auroc_near"] != pytest.approx(pooled)
    gaps = [bench._mu_gap(logits["near"][n], teacher["near"][n]) for n in ("small", "large")]
    assert row["mu_gap_near"] == pytest.approx(sum(gaps) / 2)
