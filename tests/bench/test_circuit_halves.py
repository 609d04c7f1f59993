"""benchmarks/circuit_halves.py's single model on a tiny task (the search itself: tests/importance)."""

import pytest
from conftest import load_script
from test_suite import tiny_task  # noqa: F401 (the fixture)

from hydra_ensembles.bench import runner
from hydra_ensembles.io import weights_digest, write_json_atomic


def test_a_missing_single_model_is_trained_as_the_suite_trains_it_then_read_back(
    tiny_task,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """The script refused a cache without the seed's single model, naming a command that reads recorded rows back
    and trains nothing: on a machine that kept only the records, the queue stopped there."""
    monkeypatch.setenv("HYDRA_ENSEMBLES_CACHE", str(tmp_path))
    script = load_script("circuit_halves")
    model, seed_cache = script.single_model(tiny_task, "quick", 2, progress=False)
    assert (seed_cache / "models" / "single").exists() and seed_cache.is_relative_to(tmp_path / "bench" / "quick")
    again, _ = script.single_model(tiny_task, "quick", 2, progress=False)  # from the cache: the same weights
    assert weights_digest(again) == weights_digest(model)


def test_the_records_are_read_before_the_single_model_is_built_again(
    tiny_task,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """The script built a missing single model without the records' batch layout and digests: a model cut into
    other batches passed for the recorded one, and a rebuild with other weights went unremarked."""
    monkeypatch.setenv("HYDRA_ENSEMBLES_CACHE", str(tmp_path / "cache"))
    script = load_script("circuit_halves")
    task_records = tmp_path / "records" / runner.task_key(tiny_task)
    write_json_atomic(task_records / "seed0" / "model_digests.json", {"single": "built elsewhere"})
    with pytest.warns(UserWarning, match="differ from the digest recorded"):
        script.single_model(tiny_task, "quick", 0, progress=False, records=tmp_path / "records")

    monkeypatch.setenv("HYDRA_ENSEMBLES_CACHE", str(tmp_path / "fresh"))  # a fresh machine's cache
    write_json_atomic(task_records / "batches.json", {"train": [[0, 3], 99]})  # the recorded models' layout
    with pytest.raises(ValueError, match=r"batches are cut otherwise.*train: \[\[0, 3\], 99\] then"):
        script.single_model(tiny_task, "quick", 0, progress=False, records=tmp_path / "records")
    assert not list((tmp_path / "fresh").rglob("*.safetensors"))
