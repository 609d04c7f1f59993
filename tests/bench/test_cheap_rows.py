"""The rows trained from scratch (Packed-Ensembles, MIMO): built, measured and costed on a task whose Single is
trained from scratch, refused with the reason on one fine-tuned from a pretrained model."""

import json

import pytest
import torch
from conftest import MODELS, make_inputs

from hydra_ensembles.bench import runner, suite
from hydra_ensembles.bench.tasks import Task
from hydra_ensembles.cost import count_parameters
from hydra_ensembles.predictors.baselines.packed import packed_config
from hydra_ensembles.training import IMAGE_RECIPE


def _batches(kind, seeds, labelled=True):
    labels = {"labels": torch.tensor([0, 1, 2, 1])}
    return [make_inputs(kind, seed=s) | (labels if labelled else {}) for s in seeds]


def _task(kind: str, from_scratch: bool) -> Task:
    recipe = IMAGE_RECIPE.with_(epochs=1, lr=1e-3, optimizer="adamw", patience=None)
    return Task(
        name=f"tiny-{kind}",
        new_model=lambda seed: MODELS[kind](seed=seed),
        train=_batches(kind, (1, 2)),
        val=_batches(kind, (3,)),
        test=_batches(kind, (4, 5)),
        near={"near": _batches(kind, (6,), False)},
        far={"far": _batches(kind, (7,), False)},
        circuit_id=_batches(kind, (3,)),
        circuit_ood=_batches(kind, (9,), False),
        recipe=recipe,
        member_recipe=recipe,
        lora_recipe=recipe,
        lora_from_single=False,
        prune_per_layer=1,
        taylor_pool=2,
        circuit_pool=4,
        notes=["a tiny test task"],
        from_scratch=from_scratch,
    )


def test_packed_and_mimo_rows_are_built_measured_and_costed(tmp_path):
    rows = ["Single", *suite.FROM_SCRATCH_ROWS]
    summary = runner.run(
        _task("vit", True),
        suite.TABLE,
        [0],
        tmp_path / "out",
        tmp_path / "cache",
        progress=False,
        rows=rows,
        latency_repeats=1,
    )
    assert list(summary["rows"]) == rows
    saved = json.loads((tmp_path / "out" / "table.json").read_text())["per_seed"]["0"]
    single, packed, mimo = (saved[row] for row in rows)
    assert packed["heads"] == "3x3 (alpha 2)"  # round(2 x 4 / 3) = 3 heads per member
    narrow = MODELS["vit"]().__class__(packed_config(MODELS["vit"]().config, 3, 2.0))
    assert packed["params"] == 3 * count_parameters(narrow)  # hidden 24 (3 heads of 8), MLP 25: 1.7x Single here
    assert 1.0 < mimo["params"] / single["params"] < 1.2  # MIMO: 2 more input convolutions and heads
    assert all(row["flops_per_example"] > 0 for row in (packed, mimo))
    assert not list((tmp_path / "cache").rglob("checkpoints/packed"))  # deleted once the model is saved


def test_a_pretrained_task_refuses_them_with_the_reason(tmp_path):
    task = _task("vit", False)
    for row in suite.FROM_SCRATCH_ROWS:
        with pytest.raises(ValueError, match="trains from scratch.*Run it on image-fmnist"):
            runner.run(
                task, suite.TABLE, [0], tmp_path / "out", tmp_path / "cache", progress=False, rows=["Single", row]
            )
