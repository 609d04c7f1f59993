"""benchmarks/protocol_ablation.py: each step is the step above with one change, the last is the current task."""

from dataclasses import fields

from conftest import load_script
from test_suite import tiny_task  # noqa: F401, F811 (the fixture)


def _changed(a, b) -> set[str]:
    return {f.name for f in fields(a) if f.name != "notes" and getattr(a, f.name) is not getattr(b, f.name)}


def test_each_step_changes_one_thing_and_the_last_is_the_current_task(tiny_task):  # noqa: F811
    ablation = load_script("protocol_ablation")
    current = tiny_task.__class__(**{f.name: getattr(tiny_task, f.name) for f in fields(tiny_task)})
    current.circuit_tie_break, current.dropout_model = "score", lambda seed: tiny_task.new_model(seed)
    crops = tiny_task.far["far"]
    steps = [task for _, task, _ in ablation.steps(current, crops)]
    assert steps[-1] is current
    assert steps[0].circuit_ood is crops and steps[0].circuit_tie_break == "order" and steps[0].prune_per_layer == 3
    assert steps[0].recipe.label_smoothing == 0.1 and steps[0].recipe.augment is None and steps[0].recipe.epochs == 4
    assert _changed(steps[1], steps[0]) == {"circuit_ood"}
    assert _changed(steps[2], steps[1]) == {"circuit_tie_break"}
    assert _changed(steps[3], steps[2]) == {"prune_per_layer", "taylor_pool", "circuit_pool"}
    assert {"recipe", "member_recipe", "new_model"} <= _changed(steps[4], steps[3])
    for split in ("train", "val", "test", "near", "far", "circuit_id"):  # every step is tested on the same data
        assert all(getattr(step, split) is getattr(current, split) for step in steps)
    assert len({step.fingerprint() for step in steps}) == len(steps)  # each its own cache


def test_protocol_1s_photo_crops_are_fixed_grey_images():
    ablation = load_script("protocol_ablation")
    crops = ablation.photo_crops(6)
    assert crops.shape == (6, 28, 28) and 0 <= crops.min() and crops.max() <= 1
    assert (crops - ablation.photo_crops(6, seed=1)).abs().amax(dim=(1, 2)).min() > 0.01
