"""benchmarks/circuit_halves.py's single model on a tiny task (the search itself: tests/importance)."""

from conftest import load_script
from test_suite import tiny_task  # noqa: F401 (the fixture)

from hydra_ensembles.io import weights_digest


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
