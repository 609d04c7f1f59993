"""The distillation experiments' plumbing, on the spiral with short training (the numbers are the CLI's job)."""

from hydra_ensembles.bench.distillation import MLP_CONFIG, spiral_seed


def test_spiral_seed_distils_the_ensemble_into_a_kd_and_a_hydra_student():
    rows, models = spiral_seed(0, members=4, config=MLP_CONFIG.with_(epochs=3), temperatures=(1.0, 2.0))
    assert list(rows) == ["Ensemble (4 MLPs)", "KD", "Hydra"]
    assert [m.num_members for m in models.values()] == [4, 1, 4]
    assert set(rows["Hydra"]) >= {"acc", "nll", "mu_gap_id", "mu_gap_ood", "auroc_ood", "auroc_ood_mi", "params"}
    assert rows["Hydra"]["params"] > rows["KD"]["params"]  # 4 heads on the body vs 1
    assert rows["KD"]["temperature"] in (1.0, 2.0) and rows["Ensemble (4 MLPs)"]["temperature"] is None
