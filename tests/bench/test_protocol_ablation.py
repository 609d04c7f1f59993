"""benchmarks/protocol_ablation.py: each step is the step above with one change, the last is the current task."""

import json
import sys
import types
from dataclasses import fields
from pathlib import Path

import torch
from conftest import load_script
from test_suite import tiny_task  # noqa: F401, F811 (the fixture)

sys.path.insert(0, str(Path(__file__).parents[1] / "evaluation"))


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


def test_steps_that_search_the_same_circuit_share_it(tiny_task, tmp_path):  # noqa: F811
    """Steps 2 and 3 search one circuit (the same single model, data, search, tie rule and 48 removals on
    DINOv2-S's 12 layers): step 3 takes step 2's instead of searching it again; other pairs differ."""
    ablation = load_script("protocol_ablation")
    current = tiny_task.__class__(**{f.name: getattr(tiny_task, f.name) for f in fields(tiny_task)})
    current.circuit_tie_break, current.circuit_pool, current.prune_per_layer = "score", 48, 2  # DINOv2-S's budgets
    all_steps = ablation.steps(current, tiny_task.far["far"])
    steps, layers = [task for _, task, _ in all_steps], 12
    assert [ablation.suite.circuit_removals(step, layers) for step in steps[:4]] == [48, 48, 48, 48]
    same = [ablation.same_circuit(steps[j], steps[k], layers) for j, k in ((0, 1), (1, 2), (2, 3), (1, 3))]
    assert same == [False, False, True, False]  # OOD data, then the tie rule, differ; budgets do not count
    assert not ablation.same_circuit(steps[2], steps[3], layers=30)  # 3 x 30 > 48: step 2 would remove more

    earlier, later = tmp_path / "step2", tmp_path / "step3"
    earlier.mkdir()
    assert not ablation.reuse_circuit(earlier, later)  # nothing searched yet
    (earlier / "circuit_avg.json").write_text('{"removed": [[0, 1]]}')
    (earlier / "circuit_avg_state.json").write_text('{"removed": [[0, 1]]}')
    assert ablation.reuse_circuit(earlier, later)
    assert (later / "circuit_avg.json").read_text() == '{"removed": [[0, 1]]}' and (
        later / "circuit_avg_state.json"
    ).exists()
    (earlier / "circuit_avg.json").write_text('{"removed": [[1, 0]]}')
    assert not ablation.reuse_circuit(earlier, later)  # a circuit of its own is never overwritten

    cache = tmp_path / "cache"  # in run_steps: step 3 finds step 2's circuit in the cache; step 2 none in step 1's
    for k in (1, 2):
        folder = ablation.runner.seed_dir(cache, steps[k], 0)
        folder.mkdir(parents=True)
        (folder / "circuit_avg.json").write_text(f'{{"step": {k}}}')
    ablation.take_earlier_circuit(all_steps, 2, 0, cache, layers)
    assert (ablation.runner.seed_dir(cache, steps[2], 0) / "circuit_avg.json").read_text() == '{"step": 2}'
    ablation.take_earlier_circuit(all_steps, 3, 0, cache, layers)
    assert (ablation.runner.seed_dir(cache, steps[3], 0) / "circuit_avg.json").read_text() == '{"step": 2}'


def test_each_step_is_compared_with_the_step_above_row_by_row(tmp_path):
    """The same row of two steps, tested on the same sets: the paired bootstrap across their seed directories."""
    from test_bootstrap import LABELS, _run

    from hydra_ensembles.evaluation.bootstrap import paired_bootstrap
    from hydra_ensembles.evaluation.compare import row_file

    ablation = load_script("protocol_ablation")
    before, after = tmp_path / "step2", tmp_path / "step3"
    for folder, run in ((before, 0), (after, 1)):
        (folder / "logits").mkdir(parents=True)
        torch.save(_run(run), row_file(folder / "logits", "Hydra (Circ)"))
    said = ablation.between_steps(before, after, 3, ["Hydra (Circ)", "CircAvg"], LABELS, seed=0)
    expected = paired_bootstrap([_run(1)], [_run(0)], LABELS)  # step 3 minus step 2; CircAvg has no logits
    assert said["pairs"] == [
        {"rows": ["Hydra (Circ), step 3", "step 2"]} | {m: i._asdict() for m, i in expected.items()}
    ]
    assert "Hydra (Circ), step 3 vs step 2" in "\n".join(ablation.difference_lines(said))


def test_the_table_says_which_steps_rows_were_built_on_models_built_again():
    """A step's table.json carries the task's notes, then a note per seed whose models were built again with
    other weights (`records.rebuilt_notes`): the ablation table repeats those, under their step."""
    ablation = load_script("protocol_ablation")
    task = types.SimpleNamespace(notes=["the task's note"])
    summary = {"rows": {"Single": {}}, "notes": ["the task's note"]}
    assert ablation.rebuilt_notes_of(summary, task) == []
    rebuilt = "Seed 0: hydra-circ0 trained again with different weights."
    assert ablation.rebuilt_notes_of(summary | {"notes": ["the task's note", rebuilt]}, task) == [rebuilt]
    record = {"seed": 0, "machine": "m", "command": "c", "steps": {"4. now": summary}, "between": {}, "rebuilt": {}}
    assert "Models built again" not in ablation.markdown(record)
    record["rebuilt"] = {"4. now": [rebuilt]}
    text = ablation.markdown(record)
    assert "## Models built again" in text and "**4. now**: Seed 0: hydra-circ0 trained again" in text


def test_a_step_whose_circuit_comes_out_as_the_step_aboves_takes_its_rows(tiny_task, tmp_path):  # noqa: F811
    """Step 2 changes the tie rule alone: where its circuit removes the same heads in the same order as step 1's
    (no tie for the rule to decide), its models would be step 1's, so its table is step 1's rows with its own notes
    and says so; a different ranking, or a step that changes more than the circuit search (step 3), trains."""
    ablation = load_script("protocol_ablation")
    current = tiny_task.__class__(**{f.name: getattr(tiny_task, f.name) for f in fields(tiny_task)})
    current.circuit_tie_break, current.dropout_model = "score", lambda seed: tiny_task.new_model(seed)
    all_steps = ablation.steps(current, tiny_task.far["far"])
    steps = [task for _, task, _ in all_steps]
    changes = [ablation.changes_circuit_only(steps[k - 1], steps[k]) for k in range(1, 5)]
    assert changes == [True, True, False, False]  # OOD validation data, tie rule; pools; training

    dirs = [tmp_path / f"dir{k}" for k in range(5)]
    for folder in dirs:
        folder.mkdir()
    circuit = {"removed": [[0, 1], [1, 0]], "ties": [0, 0]}
    for k in (1, 2, 3):
        (dirs[k] / "circuit_avg.json").write_text(json.dumps(circuit))
    assert [ablation.same_models(all_steps, dirs, k) for k in (1, 2, 3)] == [False, True, False]
    (dirs[2] / "circuit_avg.json").write_text(json.dumps(circuit | {"removed": [[1, 0], [0, 1]]}))
    assert not ablation.same_models(all_steps, dirs, 2)  # the order moved: other members
    (dirs[2] / "circuit_avg.json").unlink()
    assert not ablation.same_models(all_steps, dirs, 2)  # not searched yet
    (dirs[2] / "circuit_avg.json").write_text(json.dumps(circuit))

    out = tmp_path / "out"
    assert not ablation.as_above(out, 2, all_steps, dirs)  # step 1 has no table yet
    rebuilt = "Seed 0: hydra-circ0 trained again with different weights."
    step1 = {"rows": {"Single": {"test.acc": 0.9}}, "notes": [*steps[1].notes, rebuilt], "differences": {}}
    (out / "step1").mkdir(parents=True)
    (out / "step1" / "table.json").write_text(json.dumps(step1))
    assert ablation.as_above(out, 2, all_steps, dirs)
    step2 = json.loads((out / "step2" / "table.json").read_text())
    assert step2["rows"] == step1["rows"] and step2["notes"] == [*steps[2].notes, rebuilt]
    said = step2["same_as"]
    assert said["step"] == 1 and "same 2 heads in the same order as step 1's (0 of whose" in said["note"]
    assert "step 1's table](../step1/table.md)" in (out / "step2" / "table.md").read_text()
    record = {"seed": 0, "machine": "m", "command": "c", "between": {}, "rebuilt": {}}
    record |= {"steps": {all_steps[1][0]: step1, all_steps[2][0]: step2}}
    record["same_as"] = {all_steps[2][0]: ablation.same_as_note(dirs, 2)}
    text = ablation.markdown(record)
    assert f"**{all_steps[2][0]}**\n\nNothing: its circuit removes the same 2 heads" in text
