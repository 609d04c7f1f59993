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


def test_cached_students_are_reused_only_for_the_teacher_they_were_distilled_from(tmp_path):
    """A teacher rebuilt under the same cache with other weights must not be served the old teacher's students."""
    from hydra_ensembles.bench.datasets.toy import spiral_splits
    from hydra_ensembles.bench.distillation import _batches, distil_both
    from hydra_ensembles.distill import MultiHeadMLP

    splits, config = spiral_splits(0), MLP_CONFIG.with_(epochs=1, seed=0)
    train_batches, val_batches = _batches(*splits.train), _batches(*splits.val)
    teacher = MultiHeadMLP(2, 3, body=(), head=(8,), heads=2, seed=0)

    def student() -> MultiHeadMLP:
        return MultiHeadMLP(2, 3, body=(8,), head=(8,), heads=1, seed=1)

    def run(model):
        return distil_both(model, student, train_batches, val_batches, config, temperatures=(1.0,), cache=tmp_path)

    first = run(teacher)
    again = run(teacher)  # served from the cache: the same students
    for kind in ("KD", "Hydra"):
        assert torch.equal(_state(first[kind][0]), _state(again[kind][0]))
    with torch.no_grad():
        next(teacher.parameters()).add_(0.1)
    with pytest.raises(RuntimeError, match="distilled from a teacher with weights digest"):
        run(teacher)


def _state(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.state_dict().values()])


def test_the_transformer_students_are_costed_against_single_on_their_own_engine(tmp_path):
    """A tiny BERT task: Single, Single on the fused engine (its predictions, the students' engine), the teachers,
    and each teacher's KD and Hydra students; the note gives the students' FLOPs x the engine-matched Single."""
    from test_suite import tiny_task as task_fixture

    from hydra_ensembles.bench import distillation as bench

    task = task_fixture.__wrapped__()
    rows = bench.benchmark_seed(task, 0, tmp_path, temperatures=(1.0,), progress=False)
    assert list(rows)[:2] == ["Single", bench.ENGINE]
    single, engine = rows["Single"], rows[bench.ENGINE]
    assert engine["nll"] == pytest.approx(single["nll"], abs=1e-5) and engine["flops_x"] < 1.0  # [CLS] only, last layer
    summary = {"rows": {row: {k: {"mean": v} for k, v in said.items() if v is not None} for row, said in rows.items()}}
    note = bench.engine_note(summary["rows"])[0]
    kd = rows["KD ← Deep Ensembles"]["flops_x"] / engine["flops_x"]
    assert note.startswith(f"{bench.ENGINE}: Single's weights on the students' engine, {engine['flops_x']:.2f}x")
    assert f"KD ← Deep Ensembles {kd:.2f}x" in note and kd == pytest.approx(1.0)  # Single's architecture
