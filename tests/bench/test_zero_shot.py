"""The zero-shot benchmark end to end on a tiny random CLIPModel: every row built, evaluated, tabled and cached;
the seeds change only the rows that sample members."""

import json

import torch
from conftest import build_clip_tokenizer, tiny_clip

from hydra_ensembles.bench import runner, zero_shot
from hydra_ensembles.evaluation import compare
from hydra_ensembles.predictors import TwoTowerModel

CLASSES = ["cat", "dog", "small red car", "tree"]
TEMPLATES = ["a photo of a {}.", "a drawing of the {}"]


def _images(seed, count=8, labelled=True):
    g = torch.Generator().manual_seed(seed)
    batch = {"pixel_values": torch.randn(count, 3, 16, 16, generator=g)}
    return [batch | ({"labels": torch.randint(0, len(CLASSES), (count,), generator=g)} if labelled else {})]


def tiny_task() -> zero_shot.ZeroShotTask:
    return zero_shot.ZeroShotTask(
        name="tiny-zero-shot",
        two_tower=lambda path, progress: TwoTowerModel.from_clip(tiny_clip(seed=3, dropout=0.3)),
        tokenizer=lambda path: build_clip_tokenizer(),
        classes=CLASSES,
        templates=TEMPLATES,
        test=_images(1),
        near={"near": _images(2, labelled=False)},
        far={"far": _images(3, labelled=False)},
        val=_images(4),
        circuit_id=_images(5),
        circuit_ood=_images(6, labelled=False),
        budget=3,
        pool=6,
        taylor_per_layer=1,
        taylor_pool=2,
        notes=["a tiny test task"],
    )


def test_every_zero_shot_row_is_built_evaluated_and_cached(tmp_path, monkeypatch):
    task = tiny_task()
    out, cache = tmp_path / "out", tmp_path / "cache"
    summary = runner.run(task, zero_shot.TABLE, [0, 1], out, cache, command="pytest", latency_repeats=2, progress=False)
    assert list(summary["rows"]) == list(zero_shot.ROWS)
    table = (tmp_path / "out" / "table.md").read_text()
    assert all(f"| {row} |" in table for row in zero_shot.ROWS) and "a tiny test task" in table
    per_seed = summary["per_seed"]
    for row in ("Single", "Temp. scaling", "Taylor", "CircAvg"):  # no member sampling: the seed changes nothing
        assert per_seed[0][row]["metrics"] == per_seed[1][row]["metrics"]
    assert per_seed[0]["Hydra (Circ)"]["heads"].endswith("x3") and per_seed[0]["Single"]["heads"] == "12+12"
    assert per_seed[0]["Taylor"]["heads"] == "9+12" and per_seed[0]["CircAvg"]["heads"] in {
        "9+12",
        "10+11",
        "11+10",
        "12+9",
    }
    assert per_seed[0]["Hydra (Circ), image tower only"]["heads"].startswith("9+12")
    assert set(summary["latency"]) == set(zero_shot.ROWS)
    assert all(result["_measured"]["machine"] for result in per_seed[1].values())  # where, as the suite's rows
    assert json.loads((tmp_path / "out" / "table.json").read_text())["seeds"] == [0, 1]
    monkeypatch.setattr(zero_shot, "extract_joint_circuit", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    monkeypatch.setattr(compare, "measure", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    again = runner.run(task, zero_shot.TABLE, [0, 1], out, cache, latency_repeats=0, progress=False)
    assert again["per_seed"][1] == json.loads(json.dumps(per_seed[1]))  # everything from the cache
