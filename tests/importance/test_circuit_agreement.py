"""Circuits on two disjoint halves of the data (issue 39): removal agreement, the split, and the halves script."""

import json
import random
import time
from types import SimpleNamespace

import pytest
import torch
from circuit_support import circuit_data, circuit_model
from conftest import HEADS, LAYERS, load_script, make_inputs

import hydra_ensembles as he
from hydra_ensembles.bench.records import copy_records
from hydra_ensembles.importance.circuit import chance_agreement, chance_p_value, removal_agreement, split_halves

A, B, C, D, E, F = [(0, h) for h in range(4)] + [(1, 0), (1, 1)]


# ---- agreement ----


def test_agreement_of_identical_orders_is_one_and_of_disjoint_orders_zero():
    assert removal_agreement([A, B, C], [A, B, C], [1, 2, 3]) == {1: 1.0, 2: 1.0, 3: 1.0}
    assert removal_agreement([A, B, C], [D, E, F], [1, 2, 3]) == {1: 0.0, 2: 0.0, 3: 0.0}


def test_agreement_counts_shared_heads_of_each_prefix_in_any_order():
    # prefixes {A} / {B}: 0 shared; {A,B} / {B,E}: 1; {A,B,C} / {B,E,A}: 2; {A,B,C,D} / {B,E,A,F}: 2
    assert removal_agreement([A, B, C, D], [B, E, A, F], [1, 2, 3, 4]) == {1: 0.0, 2: 0.5, 3: 2 / 3, 4: 0.5}


@pytest.mark.parametrize("k", [0, 4])
def test_agreement_rejects_counts_beyond_either_order(k):
    with pytest.raises(ValueError, match=r"1\.\.3"):
        removal_agreement([A, B, C], [A, B, C, D], [k])


def test_chance_level_is_what_random_orders_share_on_average():
    heads, k, draws = 8, 3, 4000
    rng, order = random.Random(0), list(range(heads))
    shared = sum(removal_agreement(rng.sample(order, heads), rng.sample(order, heads), [k])[k] for _ in range(draws))
    assert shared / draws == pytest.approx(chance_agreement(k, heads), abs=0.02)  # k / H = 0.375
    assert chance_agreement(12, 144) == 1 / 12


def test_chance_p_value_is_how_often_random_orders_share_as_much():
    heads, k, draws = 8, 3, 4000
    rng, order = random.Random(1), list(range(heads))
    said = [removal_agreement(rng.sample(order, heads), rng.sample(order, heads), [k])[k] for _ in range(draws)]
    for agreement in (0, 1 / 3, 2 / 3, 1):
        seen = sum(a >= agreement - 1e-9 for a in said) / draws
        assert chance_p_value(k, heads, agreement) == pytest.approx(seen, abs=0.02)
    hypergeom = pytest.importorskip("scipy.stats").hypergeom
    assert chance_p_value(12, 72, 5 / 12) == pytest.approx(hypergeom.sf(4, 72, 12, 12), rel=1e-9)  # P(X >= 5)
    assert chance_p_value(12, 72, 0) == pytest.approx(1.0)


# ---- the split ----


def _numbered_batches() -> list[dict]:
    """7 examples in batches of 3, 3, 1 (the second cut to 7 tokens, so the halves need padding); label = the
    example's index."""
    sizes, batches, start = (3, 3, 1), [], 0
    for seed, size in enumerate(sizes, start=1):
        batch = make_inputs("bert", batch=size, seed=seed)
        if seed == 2:
            batch = {k: v[:, :7] for k, v in batch.items()}
        batches.append(batch | {"labels": torch.arange(start, start + size)})
        start += size
    return batches


def _tokens_by_label(batches: list[dict]) -> dict[int, list[int]]:
    """{label: the example's unpadded input ids}."""
    return {
        int(label): ids[mask.bool()].tolist()
        for batch in batches
        for ids, mask, label in zip(batch["input_ids"], batch["attention_mask"], batch["labels"])
    }


def test_split_keeps_every_example_once_with_its_label_alternating_in_batches_of_the_same_size():
    batches = _numbered_batches()
    first, second = split_halves(batches)
    assert torch.cat([b["labels"] for b in first]).tolist() == [0, 2, 4, 6]
    assert torch.cat([b["labels"] for b in second]).tolist() == [1, 3, 5]
    assert [len(b["labels"]) for b in first] == [3, 1] and [len(b["labels"]) for b in second] == [3]
    assert all(len(b["input_ids"]) == len(b["labels"]) for b in first + second)
    original = _tokens_by_label(batches)
    assert _tokens_by_label(first) | _tokens_by_label(second) == original  # each input still beside its label


def test_split_by_group_keeps_each_group_on_one_side():
    """Sentences of one review on both sides would make the halves agree for the review's sake."""
    batches = _numbered_batches()  # 7 examples, labelled 0..6
    groups = ["amazon:a", "amazon:a", "amazon:b", "bbc:0", "amazon:a", "bbc:1", "bbc:2"]
    first, second = split_halves(batches, groups)
    assert torch.cat([b["labels"] for b in first]).tolist() == [0, 1, 3, 4, 6]  # groups a, bbc:0, bbc:2
    assert torch.cat([b["labels"] for b in second]).tolist() == [2, 5]  # groups b, bbc:1
    assert _tokens_by_label(first) | _tokens_by_label(second) == _tokens_by_label(batches)
    with pytest.raises(ValueError, match="groups names 2 examples, the batches hold 7"):
        split_halves(batches, groups[:2])
    with pytest.raises(ValueError, match="one group: two halves need at least two groups"):
        split_halves(batches, ["x"] * 7)


def test_split_needs_two_examples():
    with pytest.raises(ValueError, match="at least 2 examples, got 1"):
        split_halves([make_inputs("bert", batch=1) | {"labels": torch.tensor([0])}])


def test_split_refuses_labels_on_some_batches_only():
    batches = [make_inputs("bert", batch=2, seed=1) | {"labels": torch.tensor([0, 1])}, make_inputs("bert", seed=2)]
    with pytest.raises(ValueError, match="'labels'"):
        split_halves(batches)


# ---- the script ----


def test_circuit_extracted_twice_on_the_same_data_agrees_at_every_k():
    id_batches, ood_batches = circuit_data()
    model = circuit_model()
    first, second = (he.extract_circuit(model, id_batches, ood_batches, "avg", 6, progress=False) for _ in range(2))
    assert removal_agreement(first.removed, second.removed, range(1, 7)) == dict.fromkeys(range(1, 7), 1.0)
    in_order = [(layer, head) for layer in range(LAYERS) for head in range(HEADS)][:6]
    assert [tuple(h) for h in first.removed] != in_order  # chosen by the data, not a search that ignores it


def _doubled(batches: list[dict]) -> list[dict]:
    """Every example twice in a row: both halves of the split are then the same data."""
    return [{k: v.repeat_interleave(2, dim=0) for k, v in batch.items()} for batch in batches]


def test_halves_of_doubled_data_agree_at_every_k_and_the_report_says_so(tmp_path):
    script, (id_batches, ood_batches) = load_script("circuit_halves"), circuit_data()
    report = script.halves_report(
        circuit_model(), _doubled(id_batches), _doubled(ood_batches), "avg", [1, 2, 4], progress=False
    )
    heads = LAYERS * HEADS
    assert report["agreement"] == [{"k": k, "agreement": 1.0, "chance": k / heads} for k in (1, 2, 4)]
    first, second = report["extractions"]
    assert first["removed"] == second["removed"] and len(first["removed"]) == 4
    assert (first["id_examples"], first["ood_examples"], report["id_examples"]) == (24, 24, 48)
    report |= {"task": "tiny", "seed": 0, "machine": "here", "command": "python benchmarks/circuit_halves.py tiny"}
    script.write_report(report, tmp_path / "circuit-halves")
    assert json.loads((tmp_path / "circuit-halves.json").read_text())["agreement"] == report["agreement"]
    markdown = (tmp_path / "circuit-halves.md").read_text()
    assert f"| 4 | 1.000 | {4 / heads:.3f} |" in markdown and "removals tied" in markdown


def test_halves_at_another_precision_than_the_tasks_keep_their_own_states_and_report(tmp_path):
    """sentiment-mpnet scores candidates in bf16, which a CPU without bf16 instructions emulates several times
    slower than fp32: --precision fp32 runs the same search in fp32, its states and report named apart."""
    script, (id_batches, ood_batches), model = load_script("circuit_halves"), circuit_data(), circuit_model()
    task = SimpleNamespace(circuit_method="multi", circuit_top=2, circuit_precision="bf16", circuit_tie_break="score")
    assert script.search_settings(task, model, id_batches, ood_batches, 4)["precision"] == "bf16"
    settings = script.search_settings(task, model, id_batches, ood_batches, 4, "fp32")
    assert settings == {"method": "multi", "top": 2, "precision": "fp32", "tie_break": "score"}
    script.halves_report(model, id_batches, ood_batches, "avg", [2], settings, tmp_path, False, state_tag="-fp32")
    states = sorted(path.name for path in tmp_path.glob("*.state.json"))
    assert states == [f"avg-half{half}-2-fp32.state.json" for half in (1, 2)]
    assert script.report_name(0, "avg", "-fp32") == "circuit-halves-fp32"
    assert script.report_name(0, "avg") == "circuit-halves"


def test_halves_report_rejects_counts_the_circuit_cannot_remove():
    id_batches, ood_batches = circuit_data()
    script = load_script("circuit_halves")
    with pytest.raises(ValueError, match=rf"--first: each k must be in 1\.\.{LAYERS * HEADS - 1}"):
        script.halves_report(circuit_model(), id_batches, ood_batches, "avg", [4, LAYERS * HEADS], progress=False)


# ---- wall time across resumed runs ----


def _extract(script, state, budget: int) -> dict:
    id_batches, ood_batches = circuit_data()
    return script.timed_extraction(circuit_model(), id_batches, ood_batches, "avg", budget, None, state, False)[1]


def test_resumed_extraction_reports_the_seconds_of_every_run_added_up(tmp_path):
    script, state = load_script("circuit_halves"), tmp_path / "avg-half1-4.state.json"
    runs = [_extract(script, state, budget) for budget in (2, 4, 4)]  # fresh, resumed half-way, run when done
    assert [run["runs"] for run in runs] == [1, 2, 2]  # the last found the search done: not a run of it
    assert runs[-1]["seconds"] == pytest.approx(sum(run["this_run_seconds"] for run in runs[:2]))
    assert json.loads(script.time_path(state).read_text())["seconds"] == runs[-1]["seconds"]
    report = {"half": 1, "tie_note": None} | runs[-1]
    assert f"{runs[-1]['seconds']:.1f} s over 2 runs |" in script._extraction_row(report)


def test_a_finished_search_stays_closed_when_a_copy_saved_mid_run_is_merged_in(tmp_path):
    """A record saved while the search ran (its run open) and pulled back into the cache after the search finished:
    merged key by key, it reopened the finished run, and the next run counted the time since as a killed run's."""
    script, state = load_script("circuit_halves"), tmp_path / "cache" / "avg-half1-4.state.json"
    state.parent.mkdir()
    _extract(script, state, 2)
    time_record = json.loads(script.time_path(state).read_text())
    saved_mid_run = tmp_path / "records" / script.time_path(state).name
    saved_mid_run.parent.mkdir()
    saved_mid_run.write_text(json.dumps(time_record | {"runs": 2, "running_since": time.time()}))
    done = _extract(script, state, 4)
    copy_records(saved_mid_run.parent, state.parent, overwrite=False)  # the cache's own files win
    assert json.loads(script.time_path(state).read_text())["running_since"] is None
    again = _extract(script, state, 4)
    assert again["runs"] == done["runs"] == 2 and again["seconds"] == done["seconds"]


def test_a_killed_run_counts_up_to_its_last_saved_step(tmp_path, monkeypatch):
    script, state = load_script("circuit_halves"), tmp_path / "avg-half1-4.state.json"
    extract = script.extract_circuit

    def killed_after_two_removals(model, id_batches, ood_batches, criterion, budget, **kwargs):
        time.sleep(0.3)  # so that the killed run's part is well above the clock's resolution
        extract(model, id_batches, ood_batches, criterion, 2, **kwargs)
        raise KeyboardInterrupt  # as if killed after saving 2 of the 4 removals

    monkeypatch.setattr(script, "extract_circuit", killed_after_two_removals)
    with pytest.raises(KeyboardInterrupt):
        _extract(script, state, 4)
    killed_part = state.stat().st_mtime - json.loads(script.time_path(state).read_text())["running_since"]
    monkeypatch.setattr(script, "extract_circuit", extract)
    resumed = _extract(script, state, 4)
    assert resumed["runs"] == 2 and len(resumed["removed"]) == 4
    assert resumed["seconds"] == pytest.approx(killed_part + resumed["this_run_seconds"])


def test_a_state_saved_without_a_time_record_says_its_earlier_time_is_unknown(tmp_path):
    script, state = load_script("circuit_halves"), tmp_path / "avg-half1-2.state.json"
    _extract(script, state, 2)
    script.time_path(state).unlink()
    resumed = _extract(script, state, 4)  # goes on: a run
    assert resumed["earlier_unknown"] and resumed["runs"] == 1
    assert "earlier runs' time, unknown" in script._extraction_row({"half": 1, "tie_note": None} | resumed)


def test_a_state_of_other_weights_starts_the_search_and_its_time_over(tmp_path):
    """A state copied in from the records was searched on another build of the model: the search refused to
    resume it ("delete it"), and the next run copied it back from the records."""
    script, state = load_script("circuit_halves"), tmp_path / "avg-half1-2.state.json"
    first = _extract(script, state, 2)
    state.write_text(json.dumps(json.loads(state.read_text()) | {"model": "another build"}))
    with pytest.warns(UserWarning, match="written for other model weights"):
        again = _extract(script, state, 2)
    assert again["runs"] == 1 and again["seconds"] == pytest.approx(again["this_run_seconds"])
    assert again["removed"] == first["removed"]  # searched afresh, on these weights
