"""image-dinov2's input resolution (issue 39, item 4): `dinov2_pixels` at any side of whole 14 px patches, and
benchmarks/resolution.py's choice on validation, on hand-made records and a tiny task (no real data or model)."""

import math
import warnings

import pytest
import torch
from conftest import load_script
from test_suite import tiny_task  # noqa: F401 (the fixture)

from hydra_ensembles.bench import suite, tasks
from hydra_ensembles.io import write_json_atomic


@pytest.fixture(scope="module")
def resolution():
    return load_script("resolution")


@pytest.mark.parametrize("pixels", [56, 84])
def test_dinov2_pixels_upsamples_to_the_side_asked_for(pixels):
    images = torch.rand(5, 28, 28)
    inputs = tasks.dinov2_pixels(images, pixels)
    assert inputs.shape == (5, 3, pixels, pixels)
    assert torch.isfinite(inputs).all()
    grey = inputs * torch.tensor(tasks.IMAGENET_STD)[:, None, None] + torch.tensor(tasks.IMAGENET_MEAN)[:, None, None]
    assert torch.allclose(grey[:, 0], grey[:, 2], atol=1e-6)  # the same grey image in every channel
    upsampled = torch.nn.functional.interpolate(images[:, None], size=pixels, mode="bicubic").clamp(0, 1)[:, 0]
    assert torch.allclose(grey[:, 0], upsampled, atol=1e-6)  # bicubic, clipped to [0, 1]: no other change
    assert torch.allclose(grey.mean((1, 2, 3)), images.mean((1, 2)), atol=0.02)  # brightness kept


def test_dinov2_pixels_default_is_the_task_default():
    images = torch.rand(2, 28, 28)
    assert torch.equal(tasks.dinov2_pixels(images), tasks.dinov2_pixels(images, tasks.DINOV2_PIXELS))
    assert tasks.dinov2_pixels(images).shape[-1] == 84


@pytest.mark.parametrize(("pixels", "named"), [(60, "use 56 or 70"), (7, "use 14\\."), (0, "use 14\\.")])
def test_a_side_of_part_patches_is_refused_naming_the_nearest(pixels, named, monkeypatch):
    monkeypatch.setattr(tasks, "image_splits", lambda *args: pytest.fail("data loaded before the side was checked"))
    with pytest.raises(ValueError, match=f"pixels={pixels} is not a multiple of DINOv2's 14 px patch; {named}"):
        tasks.dinov2_pixels(torch.rand(1, 28, 28), pixels)
    with pytest.raises(ValueError, match=named):
        tasks.dinov2_task("full", pixels=pixels)


def test_the_script_refuses_a_bad_side_before_training(resolution, capsys):
    with pytest.raises(SystemExit):
        resolution.main(["--pixels", "56", "60"])
    assert "use 56 or 70" in capsys.readouterr().err


def _size(pixels: int, val_nll: float, se: float = 0.0, best: float = 0.14) -> dict:
    return {"pixels": pixels, "val_nll": val_nll, "nll_gap": val_nll - best, "gap_se": se}


def test_choose_takes_the_lowest_validation_nll_when_its_gain_is_beyond_one_standard_error(resolution):
    assert resolution.choose([_size(56, 0.159, 0.005), _size(84, 0.14), _size(112, 0.150, 0.004)]) == 84
    assert resolution.choose([_size(56, 0.14)]) == 56


def test_choose_takes_the_fewest_pixels_within_one_standard_error(resolution):
    assert resolution.choose([_size(112, 0.14), _size(84, 0.145, 0.006), _size(56, 0.16, 0.01)]) == 84
    assert resolution.choose([_size(112, 0.14), _size(56, 0.14), _size(84, 0.15, 0.001)]) == 56


def test_choose_skips_sizes_without_a_finite_nll(resolution):
    assert resolution.choose([_size(56, math.nan), _size(84, 0.3, best=0.3), _size(112, math.inf)]) == 84
    with pytest.raises(ValueError, match="no size has a finite validation NLL"):
        resolution.choose([_size(56, math.nan)])


def test_paired_gaps_measure_each_size_against_the_lowest_on_the_same_examples(resolution):
    low = torch.tensor([0.1, 0.2, 0.3, 0.2])
    gaps = resolution.paired_gaps({56: low + torch.tensor([0.1, 0.0, 0.1, 0.0]), 84: low, 112: low * math.nan})
    assert gaps[84] == {"nll_gap": 0.0, "gap_se": 0.0}
    assert gaps[56]["nll_gap"] == pytest.approx(0.05)
    assert gaps[56]["gap_se"] == pytest.approx(torch.tensor([0.1, 0.0, 0.1, 0.0]).std().item() / 2)
    assert gaps[112]["nll_gap"] == math.inf


def test_kept_epoch_is_the_one_kept_not_the_last(resolution):
    curve = [(1, 0.5, 0.8), (2, 0.3, 0.9), (3, 0.4, 0.95)]  # accuracy still rising; NLL best at epoch 2
    epochs = [{"epoch": e, "loss": 1.0, "val_nll": nll, "val_acc": acc} for e, nll, acc in curve]
    training = {"epochs": epochs, "kept_epoch": 2}
    assert resolution.kept_epoch(training) == {"kept_epoch": 2, "epochs_run": 3, "val_nll": 0.3, "val_acc": 0.9}


def test_single_on_validation_trains_once_then_reads_the_cache_never_the_test_set(
    resolution,
    tiny_task,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    monkeypatch.setattr(suite, "measure", lambda *args, **kwargs: pytest.fail("measured on the test set"))
    cache, records = tmp_path / "cache", tmp_path / "records"
    # the benchmark's records of a Single row built elsewhere: a rebuild is checked by digest, never measured anew
    recorded = records / f"tiny-{tiny_task.fingerprint()}" / "seed0"
    write_json_atomic(recorded / "results.json", {"Single": {"metrics": {"id": {"acc": 0.5}}}})
    write_json_atomic(recorded / "model_digests.json", {"single": "built elsewhere"})
    with pytest.warns(UserWarning, match="differ from the digest recorded"):
        first, first_nll = resolution.single_on_validation(tiny_task, 0, cache, records=records, progress=False)
    with warnings.catch_warnings(record=True) as said:  # the cached one: checked again, a rebuild already noted
        warnings.simplefilter("always")
        again, again_nll = resolution.single_on_validation(tiny_task, 0, cache, records=records, progress=False)
    assert not [w for w in said if "differ from the digest recorded" in str(w.message)]
    assert first["training"] == "trained" and first["train_seconds"] > 0 and first["seconds_per_epoch"] > 0
    assert again["training"] == "cached" and again["train_seconds"] is None and again["seconds_per_epoch"] is None
    same = ("kept_epoch", "epochs_run", "val_nll", "val_acc", "flops_per_example", "fingerprint")
    assert {k: first[k] for k in same} == {k: again[k] for k in same}
    assert first["flops_per_example"] > 0 and first["max_epochs"] == tiny_task.recipe.epochs == first["epochs_run"]
    assert (cache / f"tiny-{tiny_task.fingerprint()}" / "seed0" / "models" / "single").exists()  # the bench's place
    assert torch.equal(first_nll, again_nll) and first_nll.shape == (sum(len(b["labels"]) for b in tiny_task.val),)
    assert first_nll.mean().item() == pytest.approx(first["val_nll"], rel=1e-4)  # the kept epoch's own NLL


def test_a_rebuilt_single_is_described_by_its_own_training_not_the_first_builds(
    resolution,
    tiny_task,  # noqa: F811
    tmp_path,
):
    """The kept epoch was read from the first build's training record while the NLL came from this machine's
    rebuild (image-dinov2 seed 1: kept epoch 4 recorded, 8 rebuilt)."""
    cache, records = tmp_path / "cache", tmp_path / "records"
    recorded = records / f"tiny-{tiny_task.fingerprint()}" / "seed0"
    first_build = {"epochs": [{"epoch": 1, "loss": 9.0, "val_nll": 9.0, "val_acc": 0.1}], "kept_epoch": 1}
    write_json_atomic(recorded / "training.json", {"single": first_build})
    write_json_atomic(recorded / "model_digests.json", {"single": "built elsewhere"})
    with pytest.warns(UserWarning, match="differ from the digest recorded"):
        trained, _ = resolution.single_on_validation(tiny_task, 0, cache, records=records, progress=False)
    cached, _ = resolution.single_on_validation(tiny_task, 0, cache, records=records, progress=False)
    for said in (trained, cached):
        assert said["val_nll"] != 9.0 and said["epochs_run"] == tiny_task.recipe.epochs


def test_records_of_batches_cut_otherwise_are_refused_before_training(
    resolution,
    tiny_task,  # noqa: F811
    tmp_path,
):
    """The records' batch layout (the task's batches.json) was not copied: a Single trained on batches cut
    otherwise was checked against the recorded digests as if it were the recorded model."""
    cache, records = tmp_path / "cache", tmp_path / "records"
    write_json_atomic(records / f"tiny-{tiny_task.fingerprint()}" / "batches.json", {"train": [[0, 3], 99]})
    with pytest.raises(ValueError, match=r"batches are cut otherwise.*train: \[\[0, 3\], 99\] then"):
        resolution.single_on_validation(tiny_task, 0, cache, records=records, progress=False)
    assert not list(cache.rglob("*.safetensors"))


def test_markdown_marks_the_choice_and_the_cost_relative_to_56_px(resolution):
    def size(pixels, nll, flops, seconds):
        return _size(pixels, nll, se=0.001, best=0.141) | {
            "patches": (pixels // 14) ** 2,
            "val_acc": 0.9,
            "kept_epoch": 10,
            "epochs_run": 10,
            "max_epochs": 10,
            "training": "cached" if seconds is None else "trained",
            "train_seconds": seconds,
            "seconds_per_epoch": None if seconds is None else seconds / 10,
            "flops_per_example": flops,
        }

    sizes = [size(56, 0.159, 1e9, None), size(84, 0.141, 2.5e9, 2400.0)]
    record = {"seed": 0, "command": "c", "machine": "m", "sizes": sizes, "chosen": resolution.choose(sizes)}
    text = resolution.markdown(record)
    assert "| 84 (chosen) | 36 |" in text and "| 56 | 16 |" in text
    assert "| cached | - | 1.00 | 1.00x |" in text and "| trained, 40.0 min | 240 | 2.50 | 2.50x |" in text
    assert "**84 px**" in text and "| 0.1590 | +0.0180 (0.0010) |" in text


def test_a_rerun_keeps_the_training_time_an_earlier_report_measured(resolution, tmp_path):
    earlier = {
        "pixels": 84,
        "fingerprint": "f",
        "training": "trained",
        "train_seconds": 1800.0,
        "seconds_per_epoch": 180.0,
    }
    write_json_atomic(tmp_path / "resolution.json", {"sizes": [earlier, earlier | {"pixels": 56, "fingerprint": "g"}]})
    cached = {"training": "cached", "train_seconds": None, "seconds_per_epoch": None}
    sizes = [{"pixels": 84, "fingerprint": "f"} | cached, {"pixels": 56, "fingerprint": "other"} | cached]
    kept = resolution.with_earlier_times(sizes, tmp_path / "resolution.json")
    assert kept[0] | {} == {"pixels": 84, "fingerprint": "f", "training": "trained earlier", "train_seconds": 1800.0,
                            "seconds_per_epoch": 180.0}  # fmt: skip
    assert kept[1] == sizes[1]  # another task's model: its time is not this one's
    assert resolution.with_earlier_times(sizes, tmp_path / "none.json") == sizes
