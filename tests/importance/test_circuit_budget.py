"""The circuit search's time budget (method "auto") and its progress bar: what it predicts, what it refuses, how it
falls back when the clock runs out, and a bar that moves within a step. Time is a fake clock that advances by the
work the fast scorer does, so nothing here depends on how fast this machine is."""

import json

import pytest
import torch
from circuit_support import circuit_data, circuit_model

import hydra_ensembles as he
from hydra_ensembles.data.loaders import batch_size as examples_in
from hydra_ensembles.importance.circuit import Choice, scoring
from hydra_ensembles.importance.circuit import budget as budget_module
from hydra_ensembles.importance.circuit import search as search_module

EXAMPLES = 48  # circuit_data: 24 ID + 24 OOD
BUDGET = 8  # of 12 heads: the exact search evaluates 12 + 11 + ... + 5 = 68 candidates


class FakeTime:
    """A clock in seconds that the fast scorer advances: a candidate evaluation over all EXAMPLES costs 1 s in
    fp32, 0.5 s in bf16, `slowdown` times that during the search itself (not in the probes)."""

    def __init__(self):
        self.now, self.slowdown = 0.0, 1.0

    def __call__(self) -> float:
        return self.now

    def spend(self, scorer, candidates: int) -> None:
        examples = sum(map(examples_in, scorer.chunks))
        seconds = candidates * examples / EXAMPLES * (0.5 if scorer.precision == "bf16" else 1.0)
        self.now += seconds * (1.0 if scorer.criterion is None else self.slowdown)  # criterion None: a probe


@pytest.fixture
def fake_time(monkeypatch):
    clock, outputs = FakeTime(), scoring.FastScorer.outputs

    def timed(scorer, removed, candidates, progress):
        result = outputs(scorer, removed, candidates, progress)
        clock.spend(scorer, len(candidates))
        return result

    monkeypatch.setattr(scoring.FastScorer, "outputs", timed)
    return clock


class _Counting(he.CircuitCriterion):
    """S_avg that counts its evaluations."""

    needs_ood = True

    def __init__(self):
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return he.CRITERIA["avg"](*args)


def _extract(clock, **kwargs):
    model, (id_batches, ood_batches) = circuit_model(), circuit_data()
    options = {"progress": False, "clock": clock} | kwargs
    return he.extract_circuit(model, id_batches, ood_batches, options.pop("criterion", "avg"), BUDGET, **options)


def test_a_generous_budget_picks_the_exact_search_and_records_predicted_and_measured_time(fake_time):
    circuit = _extract(fake_time, time_budget=1800)
    # probe: an untimed warm-up candidate (1/3 s) then 12 candidates on the first 16 of 48 examples = 4 s; the
    # search: 68 candidate evaluations of 1 s
    assert circuit.search == "exact" and circuit.timing["chose"] == "exact" and circuit.timing["switched"] == []
    assert circuit.timing["probe_s"] == pytest.approx(4 + 1 / 3) and circuit.timing["predicted_s"] == pytest.approx(
        72 + 1 / 3
    )
    assert circuit.timing["measured_s"] == pytest.approx(72 + 1 / 3)
    assert circuit.timing["per_candidate_s"] == {"fp32": pytest.approx(1.0)}
    exact = _extract(fake_time, method="fast")
    assert circuit.removed == exact.removed and circuit.scores == exact.scores  # "auto" changes nothing it runs


def test_when_nothing_fits_it_refuses_before_any_step_and_names_what_fits(fake_time, tmp_path):
    counting, state = _Counting(), tmp_path / "state.json"
    he.register_criterion("avg_counted", counting)
    with pytest.raises(ValueError) as refused:
        _extract(fake_time, criterion="avg_counted", time_budget=10, state_path=state)
    # probes 4 1/3 s (fp32) + 2 1/6 s (bf16), warm-ups included; the fastest, multi-8-bf16, is one step of 12 at
    # 0.5 s: 6.5 + 6 = 12.5 s > 10 s
    message = str(refused.value)
    assert "the fastest, multi-8-bf16, is predicted at 0.2 min" in message
    # the exact search fits on 1 ID + 1 OOD example (68 s x 2/48 within 90 % of the 3.5 s left): too few for S to
    # decide anything, not offered; the fastest on 12 + 12 (6 s x 24/48 <= 3.15 s), with `auto` kept
    assert "`--max-examples 1`" not in message
    assert "`--max-examples 12` (max_examples=12: multi-8-bf16 on at most 12 ID and 12 OOD examples" in message
    assert "`--time-budget 1m`" in message and "--method" not in message
    assert counting.calls == 0 and not state.exists()  # no step began
    # but the probe is kept for the rerun, and the message says where
    probe = tmp_path / "state.json.probe.json"
    assert f"The probe's timing is kept in {str(probe)!r}" in message and probe.exists()
    # what it offered does fit, auto choosing again from the kept probe: no time spent probing
    fitted = _extract(fake_time, time_budget=10, max_examples=12, state_path=state)
    assert fitted.timing["measured_s"] <= 10 and fitted.timing["probe_s"] == 0
    assert fitted.timing["per_candidate_s"] == pytest.approx({"fp32": 0.5, "bf16": 0.25})  # 24 of 48 examples
    assert f"the probe of the run refused for time, {probe}" in fitted.note
    # without it, the same costs after 6.5 s of probes, which the budget counts: the coarsest search fits the time
    # left, where the kept probe left room for a finer one
    probed = _extract(fake_time, time_budget=10, max_examples=12)
    assert probed.timing["per_candidate_s"] == pytest.approx(fitted.timing["per_candidate_s"])
    assert probed.timing["probe_s"] == pytest.approx(6.5)
    assert (probed.search, fitted.search) == ("multi-8-bf16", "multi-2-bf16")
    # a probe kept for other weights is not read
    kept = json.loads(probe.read_text())
    (tmp_path / "other.json.probe.json").write_text(json.dumps(kept | {"model": "another model"}))
    other = _extract(fake_time, time_budget=10, max_examples=12, state_path=tmp_path / "other.json")
    assert other.timing["probe_s"] == pytest.approx(6.5) and other.search == "multi-8-bf16"


def test_a_search_that_falls_behind_runs_its_remaining_removals_coarser_and_says_so(fake_time, tmp_path):
    exact = _extract(fake_time, method="fast")
    fake_time.now, fake_time.slowdown = 0.0, 3.0  # predicted 72 s within 100 s; the search runs 3x slower
    state = tmp_path / "state.json"
    with pytest.warns(RuntimeWarning, match=r"36 s measured against 12 s predicted \(3.00x\)"):
        circuit = _extract(fake_time, time_budget=100, state_path=state)
    # after removal 1 (36 s + 4 1/3 s probe), exact would end at ~208 s; probing bf16 (2 1/6 s), fast-bf16 would
    # need ~127 s and multi-2-bf16 (11 + 9 + 7 + 5 candidates at 1.5 s) 42.5 + 48 = 90.5 s: it runs that
    assert circuit.search == "exact, then multi-2-bf16 from removal 2"
    assert circuit.timing["switched"] == [[1, "multi-2-bf16"]] and "multi-2-bf16" in circuit.note
    assert circuit.timing["measured_s"] == pytest.approx(90.5) and circuit.timing["predicted_s"] == pytest.approx(
        72 + 1 / 3
    )
    assert circuit.removed[0] == exact.removed[0] and len(set(circuit.removed)) == BUDGET
    saved = json.loads(state.read_text())
    assert saved["segments"] == [[0, "fast", 8, "fp32"], [1, "multi", 2, "bf16"]]
    fake_time.now = 0.0
    again = _extract(fake_time, time_budget=100, state_path=state)  # resumes the saved plan: no probe, no step
    assert fake_time.now == 0.0 and again.removed == circuit.removed and again.search == circuit.search
    # killed after removal 3, then resumed asking for the exact search: its state would go on with multi-2-bf16
    saved |= {key: saved[key][:3] for key in ("removed", "scores", "ties")}
    state.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="continues a multi-2-bf16 search .*from removal 2.*method='auto'"):
        _extract(fake_time, method="fast", state_path=state)


def test_a_search_no_coarser_search_can_finish_stops_with_its_state_saved_and_resumes(fake_time, tmp_path):
    """The budget is a promise: when even the coarsest search would overrun at the measured pace, the search stops
    after the step (not overruns), says what finishes it, and a larger budget resumes it from the saved state."""
    exact = _extract(fake_time, method="fast")
    fake_time.now, fake_time.slowdown = 0.0, 20.0  # predicted ~72 s within 100 s; the search runs 20x slower
    state = tmp_path / "state.json"
    with pytest.raises(search_module.TimeBudgetExceeded, match="stopped by its time budget.* run it again with") as e:
        _extract(fake_time, time_budget=100, state_path=state)
    assert "removals run" not in str(e.value)  # it stopped: no search runs them
    stopped_at = fake_time.now
    saved = json.loads(state.read_text())
    assert len(saved["removed"]) == 1 and saved["removed"][0] == list(exact.removed[0])  # the step made is kept
    assert stopped_at < 300  # one slow step (240 s), not the whole search at that pace (~1,400 s)
    fake_time.slowdown = 1.0
    finished = _extract(fake_time, time_budget=3600, state_path=state)  # a larger budget: resumes, no new probe
    assert finished.removed[0] == exact.removed[0] and len(set(finished.removed)) == BUDGET
    fake_time.now, fake_time.slowdown = 0.0, 20.0
    with pytest.raises(search_module.TimeBudgetExceeded, match="Nothing was saved \\(no state_path\\): run it again"):
        _extract(fake_time, time_budget=100)  # no state kept: the message does not promise a resume


def test_the_bar_moves_within_a_step_one_candidate_at_a_time(monkeypatch, tmp_path):
    updates, postfixes = [], []

    class Recording(search_module.tqdm):
        def update(self, n=1):
            updates.append(n)
            return super().update(n)

        def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
            postfixes.append(dict(ordered_dict or {}) | kwargs)
            return super().set_postfix(ordered_dict, refresh, **kwargs)

    monkeypatch.setattr(search_module, "tqdm", Recording)
    model, (id_batches, ood_batches) = circuit_model(), circuit_data()
    state = tmp_path / "state.json"
    he.extract_circuit(model, id_batches, ood_batches, "avg", 1, method="fast", batch_size=4, state_path=state)
    # 12 chunks of 4 examples x 2 layers of 6 candidates: a tick each time a whole candidate's work is done
    assert updates == [1] * 12 and postfixes[0]["removal"] == "1/1"
    updates.clear()
    he.extract_circuit(model, id_batches, ood_batches, "avg", 3, method="fast", batch_size=4, state_path=state)
    assert sum(updates) == 11 + 10 and len(updates) == 21  # resumed after removal 1: its 12 were counted before
    assert [p["removal"] for p in postfixes[-2:]] == ["2/3", "3/3"]


def test_the_fast_scorer_reports_whole_candidates_as_their_work_completes():
    ticks = []
    counter = scoring.Ticks(ticks.append, examples=10)
    for work in (4, 4, 4, 30, 8):  # candidate-examples: 0.4, 0.8, 1.2, 4.2, 5.0 candidates
        counter.add(work)
    assert ticks == [1, 3, 1]


def test_a_subsample_is_deterministic_in_order_and_keeps_labels():
    id_batches, _ = circuit_data()
    labels = torch.cat([b["labels"] for b in id_batches])
    first = budget_module.subsample(id_batches, 15, seed=3)
    again = budget_module.subsample(id_batches, 15, seed=3)
    other = budget_module.subsample(id_batches, 15, seed=4)
    assert [examples_in(b) for b in first] == [12, 3]  # in batches of the first batch's size
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, again))
    assert not torch.equal(first[0]["input_ids"], other[0]["input_ids"])
    chosen = torch.randperm(24, generator=torch.Generator().manual_seed(3))[:15].sort().values
    assert torch.equal(torch.cat([b["labels"] for b in first]), labels[chosen])
    assert budget_module.subsample(id_batches, 100) == id_batches


def test_an_old_state_without_timing_resumes(tmp_path):
    """A state saved before the time budget was recorded (no segments, elapsed or plan) resumes as before."""
    model, (id_batches, ood_batches) = circuit_model(), circuit_data()
    state = tmp_path / "state.json"
    fresh = he.extract_circuit(model, id_batches, ood_batches, "avg", 3, method="fast", progress=False)
    he.extract_circuit(model, id_batches, ood_batches, "avg", 1, method="fast", state_path=state, progress=False)
    old = {k: v for k, v in json.loads(state.read_text()).items() if k not in ("segments", "elapsed_s", "plan")}
    state.write_text(json.dumps(old))
    resumed = he.extract_circuit(
        model, id_batches, ood_batches, "avg", 3, method="fast", state_path=state, progress=False
    )
    assert resumed.removed == fresh.removed and resumed.search == "exact"


def test_the_probe_counts_before_the_plan_keeps_or_leaves_the_exact_search(fake_time):
    """Exact: 68 s of search after a 4 1/3-s probe, 72 1/3 s in all: over a 72-s budget only once the probe is
    counted. Counted after (as it was), the exact search alone was tried and refused, fast-bf16 never looked at."""
    circuit = _extract(fake_time, time_budget=72)
    assert circuit.search == "fast-bf16" and circuit.timing["measured_s"] <= 72


def test_a_resumed_auto_search_finds_its_coarser_searches_whatever_the_exact_searchs_top():
    """The exact search ignores `top`: a plan made with top 8, resumed with top 4, still has rungs below it."""
    rungs = [Choice("fast", 8), Choice("multi", 2, "bf16")]
    plan = budget_module.Plan(rungs[0], None, rungs, time_budget=100, predicted_s=1, probe_s=1)
    assert plan.coarser_than(Choice("fast", 4)) == rungs[1:]


def test_s_values_equal_in_exact_arithmetic_tie():
    """(acc + AUROC) / 2 of two (acc, AUROC) pairs with one sum: 24 ID and 24 OOD examples, one more correct
    prediction traded for 24 ranked pairs. In floats they differ in the last bit, and the bit, not the secondary
    score, decided; the tie went uncounted."""
    from hydra_ensembles.importance.circuit.criteria import TIE_BREAKS

    class Given(he.CircuitCriterion):
        def __init__(self, value):
            self.value = value

        def __call__(self, *args):
            return self.value

    a, b = (15 / 24 + 300 / 576) / 2, (16 / 24 + 276 / 576) / 2
    assert a != b  # the rounding the rule must not see
    rule = TIE_BREAKS["order"]
    assert rule.value(Given(a), None, None, None) == rule.value(Given(b), None, None, None)
    assert rule.value(Given(torch.tensor(a, dtype=torch.float64)), None, None, None) == (round(a, 12),)  # 0-d


def test_the_bar_ends_each_step_at_its_size_under_several_processes(monkeypatch):
    """Rank 0 scores 6 of 11 candidates on 2 processes and ticks for both (x 2): capped at 11, and topped up."""
    seen = []

    class Bar:
        def update(self, n):
            seen.append(n)

    monkeypatch.setattr(search_module, "world_size", lambda: 2)
    ticks = search_module._StepTicks(Bar(), 11)
    for _ in range(6):
        ticks(1)
    ticks.finish()
    assert sum(seen) == 11
    ticks = search_module._StepTicks(Bar(), 11)
    seen.clear()
    for _ in range(5):
        ticks(1)
    ticks.finish()  # rank 0 held 5 of 11 (the uneven share): the step still ends at 11
    assert sum(seen) == 11
