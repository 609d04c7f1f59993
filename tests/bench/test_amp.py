"""Paper 002's experiments and the ensemble-for-free table end to end on a tiny BERT: every table, the cost rule
that picks the AMP base, equal-count baselines, Hydra rows on the pruned base, and resuming from the cache."""

import dataclasses
import json

import pytest
from test_suite import tiny_task  # noqa: F401 (a fixture)

import hydra_ensembles as he
from hydra_ensembles.bench import amp, records, suite
from hydra_ensembles.evaluation.tables import aggregate, latency_over_seeds, table_lines
from hydra_ensembles.training import AMP_RECOVERY

DELTAS = (0.002, 0.02, 1.0)


def _run(task, tmp_path, **kwargs):
    return amp.experiment(
        task,
        [0],
        tmp_path / "out",
        tmp_path / "cache",
        command="pytest",
        deltas=DELTAS,
        recovery=AMP_RECOVERY.with_(epochs=1, lr=1e-3),
        pruning_examples=8,
        latency_repeats=2,
        progress=False,
        **kwargs,
    )


def test_amp_tables_pick_the_base_by_cost_and_compare_at_equal_size(tiny_task, tmp_path, monkeypatch):  # noqa: F811
    first = _run(tiny_task, tmp_path, flops_target=1.5, tables=["free"])  # the ensemble-for-free table alone
    assert set(first["tables"]) == {"free"} and set(first["per_seed"][0]) >= {"free", "free_delta", "sizes"}
    assert (
        "sweep" not in first["per_seed"][0]
        and "Not built in this run: sweep, curve, criteria, baselines" in (tmp_path / "out" / "amp.md").read_text()
    )
    summary = _run(tiny_task, tmp_path, flops_target=1.5)  # the other tables, on the cached free table
    seed = summary["per_seed"][0]
    assert seed["free"] == json.loads(json.dumps(first["per_seed"][0]["free"]))
    ratios = {float(d): r for d, r in seed["hydra_flops"].items()}
    within = sorted(d for d, r in ratios.items() if r <= 1.5)
    assert seed["free_delta"] == within[0]  # the cost rule, from FLOPs alone: the smallest delta-E tried within
    below = [d for d in ratios if d < within[0]]
    assert all(ratios[d] > 1.5 for d in below)
    refined = sorted(set(ratios) - set(DELTAS))  # bisection points, between the grid's last over and first within
    grid_over = max([d for d in DELTAS if ratios[d] > 1.5], default=None)
    grid_within = min(d for d in DELTAS if ratios[d] <= 1.5)
    assert all(grid_over < d < grid_within for d in refined) and (refined or grid_over is None)
    assert ratios[max(DELTAS)] <= ratios[min(DELTAS)]  # a smaller MLP, a cheaper ensemble
    sizes = seed["sizes"]
    base = f"AMP dE={seed['free_delta']:g}"
    total = sum(sizes[base])
    for name in ("Uniform (random)", "Uniform (l2)", "Uniform (taylor)"):
        assert sum(sizes[name]) == total and max(sizes[name]) - min(sizes[name]) <= 1  # equal count, uniform
    free = seed["free"]
    assert list(free) == ["Single", "Hydra (Taylor)", "Hydra (Circ)", *amp.FREE_NAMES.values()]
    assert free["AMP single"]["params"] < free["Single"]["params"]
    assert free["Hydra (Taylor) on AMP"]["flops_per_example"] / free["Single"]["flops_per_example"] == pytest.approx(
        ratios[seed["free_delta"]], rel=0.02
    )  # the measured ensemble costs what the rule predicted from untrained members
    for table in ("sweep", "criteria", "baselines"):
        rows = seed[table]
        assert all(f"{name}, recovered" in rows for name in rows if name != "Single" and "recovered" not in name)
        assert all(row["_seconds"] >= 0 for row in rows.values())  # each row records what it cost (0.1 s steps)
    curve = seed["curve"]  # every base of the sweep and the free one, each with its Hydra (Taylor)
    points = sorted({*DELTAS, seed["free_delta"]})
    assert list(curve) == ["Single", "Hydra (Taylor)"] + [
        f"{kind}, dE={d:g}" for d in points for kind in ("AMP single", "Hydra (Taylor) on AMP")
    ]
    assert curve[f"Hydra (Taylor) on AMP, dE={seed['free_delta']:g}"] == free["Hydra (Taylor) on AMP"]  # one model
    assert curve["Hydra (Taylor)"] == free["Hydra (Taylor)"] and curve["Single"] == free["Single"]
    for d in points:  # AMP single on a base is the sweep's recovered model, measured again
        recovered = seed["sweep"].get(f"AMP dE={d:g}, recovered")
        assert recovered is None or recovered["metrics"] == curve[f"AMP single, dE={d:g}"]["metrics"]
    criteria = [name for name in seed["criteria"] if name != "Single" and "recovered" not in name]
    assert [name.split(" (")[1].split(",")[0] for name in criteria] == list(amp.CRITERIA)
    recovered = [path.name for path in (tmp_path / "cache").rglob("*-recovered")]
    entropy = f"AMP (entropy, dE={seed['free_delta']:g}), recovered"  # the free base's model: recovered once
    assert (
        seed["criteria"][entropy]["metrics"]
        == seed["baselines"][f"AMP dE={seed['free_delta']:g}, recovered"]["metrics"]
    )
    assert recovered and not [name for name in recovered if name.startswith("AMP-entropy")], recovered
    text = (tmp_path / "out" / "amp.md").read_text()
    assert all(f"## {title}" in text for _, title in amp.TABLES) and "| AMP single |" in text
    assert "Not built" not in text
    assert set(summary["latency"]) == set(free) and json.loads((tmp_path / "out" / "amp.json").read_text())["seeds"]

    def refuse(*args, **kwargs):
        raise AssertionError("a cached model was retrained")

    monkeypatch.setattr(amp, "recover", refuse)
    monkeypatch.setattr(amp, "adaptive_mlp_pruning", refuse)
    again = _run(tiny_task, tmp_path, flops_target=1.5)
    assert again["per_seed"][0]["free"] == json.loads(json.dumps(free))  # everything from the cache

    # a fresh machine with the records alone (`bench.records`: no weights) renders every table, building nothing
    key = f"{tiny_task.name}-{tiny_task.fingerprint()}"
    records.copy_records(tmp_path / "cache" / key, tmp_path / "fresh" / "cache" / key, overwrite=False)
    monkeypatch.setattr(amp.AmpSeed, "single", property(lambda self: pytest.fail("built the single model")))
    monkeypatch.setattr(suite.Pieces, "single", lambda self: pytest.fail("built a row's model"))
    fresh = _run(tiny_task, tmp_path / "fresh", flops_target=1.5)
    assert fresh["per_seed"][0] == json.loads(json.dumps(again["per_seed"][0]))
    assert fresh["latency"] == again["latency"] and fresh["latency_timed"] == again["latency_timed"]
    assert fresh["compute_s"] == again["compute_s"] > 0 and fresh["rows_without_time"] == 0  # the time travels too
    assert "compute recorded with these tables' rows" in (tmp_path / "fresh" / "out" / "amp.md").read_text()
    assert fresh["notes"] == []
    # a member on an AMP base built again differently (e.g. on another machine): the table names it
    amp_cache = tmp_path / "fresh" / "cache" / key / "seed0" / amp.AMP_CACHE
    base_digests = min(amp_cache.glob(f"*/{records.DIGESTS}"))  # the first base's members
    member = sorted(json.loads(base_digests.read_text()))[0]
    base_digests.write_text(json.dumps(json.loads(base_digests.read_text()) | {f"{member}, rebuilt": "0" * 16}))
    noted = _run(tiny_task, tmp_path / "fresh", flops_target=1.5)
    assert len(noted["notes"]) == 1 and f"Seed 0: {member} trained again" in noted["notes"][0]
    assert noted["notes"][0] in (tmp_path / "fresh" / "out" / "amp.md").read_text()
    monkeypatch.undo()  # without its latency record, the fresh machine builds the models to time them
    for latency in (tmp_path / "fresh" / "cache" / key).rglob("latency-*.json"):
        latency.unlink()
    timed = _run(tiny_task, tmp_path / "fresh", flops_target=1.5)
    assert set(timed["latency"]) == set(free) and timed["per_seed"][0] == fresh["per_seed"][0]
    with pytest.raises(ValueError, match="tables must be some of"):
        _run(tiny_task, tmp_path, tables=["table7"])
    with pytest.raises(ValueError, match="latency_seeds must be some of the seeds"):
        _run(tiny_task, tmp_path, latency_seeds=[1])  # refused before any work: seed 1 is not run


def test_latency_on_several_seeds_is_the_mean_of_each_seeds_median():
    timed = {
        0: {"Single": {"median": 1.0, "min": 1.0, "max": 1.0}, "Hydra": {"median": 0.94, "min": 0.9, "max": 1.0}},
        1: {"Single": {"median": 1.0, "min": 1.0, "max": 1.0}, "Hydra": {"median": 0.80, "min": 0.7, "max": 0.9}},
    }
    assert latency_over_seeds({1: timed[1]}) == timed[1]  # one seed: its rounds' median and range
    both = latency_over_seeds(timed)
    assert both["Hydra"]["mean"] == pytest.approx(0.87) and both["Hydra"]["std"] == pytest.approx(0.07)
    rows = aggregate({0: {name: _run_result() for name in ("Single", "Hydra")}})
    assert table_lines(rows, both)[-1].endswith("| 0.87 ± 0.07 |")
    assert table_lines(rows, timed[0])[-1].endswith("| 0.94 (0.90-1.00) |")
    plain = aggregate({0: {"Single": {k: v for k, v in _run_result().items() if k != "heads"}}})  # Built.extra {}
    assert plain["Single"]["heads"] == "-" and "| Single | - |" in table_lines(plain, {})[-1]
    when = {"date": "2026-11-23", "machine": "cpu"}
    summary = {"latency_per_seed": timed, "latency_timed": dict.fromkeys(timed, when), "latency_batch": 32}
    note = amp.latency_note(summary)
    assert "mean ± std over seeds [0, 1]" in note and "seed 1: Hydra 0.80 (0.70-0.90)" in note
    assert "Single" not in note and "2026-11-23 on cpu" in note
    one = amp.latency_note({"latency_per_seed": {1: timed[1]}, "latency_timed": when, "latency_batch": 32})
    assert one.startswith("Latency: seed 1's models on one batch of 32") and "2026-11-23 on cpu" in one


def _run_result() -> dict:
    return {"heads": "12", "params": 1.0, "flops_per_example": 1.0, "metrics": {"id": {"acc": 0.9}}}


def test_recovered_models_reload_as_pruned_hf_models(tiny_task, tmp_path):  # noqa: F811
    cache = tmp_path / "seed0"
    seed = amp.AmpSeed(tiny_task, 0, cache, AMP_RECOVERY.with_(epochs=1), pruning_examples=8, progress=False)
    pruned, search = seed.adaptive(1.0), seed.search(1.0)
    assert search["sizes"] == [len(k) for k in he.kept_neurons(pruned).values()]
    recovered = seed.recovered("x", lambda: pruned)
    assert he.kept_neurons(recovered) == he.kept_neurons(pruned)
    assert he.kept_neurons(he.load_model(cache / amp.AMP_CACHE / "models" / "x-recovered")) == he.kept_neurons(pruned)
    assert not (cache / amp.AMP_CACHE / "checkpoints" / "x").exists()  # saved: the training checkpoint is deleted
    # the cached models and rows were made with one recovery: a run asking another is refused, not mixed in
    with pytest.raises(ValueError, match=r"other settings \(recovery.epochs 1 recorded, 2 asked\)"):
        amp.AmpSeed(tiny_task, 0, cache, AMP_RECOVERY.with_(epochs=2), pruning_examples=8, progress=False)
    amp.AmpSeed(tiny_task, 0, cache, AMP_RECOVERY.with_(epochs=1), pruning_examples=8, progress=False)  # the same


def test_the_cost_rule_counts_distinct_members_when_half_the_heads_go(tiny_task, tmp_path):  # noqa: F811
    """The paper's budget (half the heads of every layer): the rule's stand-in members must still differ."""
    heads = he.get_adapter(tiny_task.new_model(0)).num_heads(tiny_task.new_model(0))
    task = dataclasses.replace(tiny_task, prune_per_layer=heads // 2)
    seed = amp.AmpSeed(task, 0, tmp_path / "seed0", AMP_RECOVERY.with_(epochs=1), pruning_examples=8, progress=False)
    full, pruned = seed.hydra_flops(seed.single), seed.hydra_flops(seed.adaptive(1.0))
    assert 1.0 < full <= task.members and pruned < full


def test_the_cost_rule_refines_the_grid_by_bisection(tiny_task, tmp_path, monkeypatch):  # noqa: F811
    """On a cost that falls as delta-E grows (here 0.05 / delta-E), the rule's answer is within the target, below
    the grid's first delta-E within it, and closer to the true boundary (0.05) than the grid was."""
    seed = amp.AmpSeed(tiny_task, 0, tmp_path / "s0", AMP_RECOVERY.with_(epochs=1), pruning_examples=8, progress=False)
    monkeypatch.setattr(seed, "adaptive", lambda delta, criterion="entropy": delta)
    monkeypatch.setattr(seed, "hydra_flops", lambda delta: 0.05 / delta)
    delta, ratios = seed.free_delta((0.01, 0.1, 1.0), target=1.0)
    assert ratios[delta] <= 1.0 and 0.05 <= delta < 0.1 and len(ratios) == 3 + amp.REFINE_STEPS
    assert delta == min(d for d, r in ratios.items() if r <= 1.0)
    assert seed.free_delta((0.1, 1.0), target=1.0)[0] == 0.1  # the grid's first point within: nothing below to refine
    assert seed.free_delta((0.01, 0.02), target=1.0)[0] == 0.02  # none within: the largest


def test_uniform_rows_recorded_at_another_neuron_count_are_refused():
    """Their names do not carry the count: rows recorded under another free delta-E would sit beside the new base."""
    measured = {f"Uniform ({c})": {"mlp_sizes": [10, 10]} for c in amp.BASELINES}
    amp._check_uniform_sizes(measured, 20)
    with pytest.raises(ValueError, match=r"'Uniform \(random\)' keeps 20 MLP neurons, and this run's AMP base 24"):
        amp._check_uniform_sizes(measured, 24)
    measured["Uniform (l2), recovered"] = {"mlp_sizes": [12, 12]}  # the pair's other half, recorded at another count
    with pytest.raises(ValueError, match=r"'Uniform \(l2\), recovered' keeps 24 MLP neurons, and this run's AMP"):
        amp._check_uniform_sizes(measured, 20)
