"""benchmarks/circuit_approx.py on a tiny BERT task: the exact ranking it compares against (the suite's circuit only
when that was an exact search under the task's tie rule), each approximation's agreement, and reruns that print."""

from argparse import Namespace
from dataclasses import replace

import pytest
from conftest import MODELS, load_script
from test_suite import tiny_task  # noqa: F401 (the fixture)

import hydra_ensembles as he

approx = load_script("circuit_approx")


def _args(**changed) -> Namespace:
    settings = {"seed": 0, "budget": 4, "methods": ["multi-2", "fast:bf16"], "time_exact": False, "exact_seconds": None}
    return Namespace(**(settings | {"batches": None} | changed))


def test_the_exact_ranking_is_the_suites_only_when_it_was_exact_under_the_tasks_tie_rule(
    tiny_task,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    task, model = replace(tiny_task, circuit_tie_break="score"), MODELS["bert"](seed=0).eval()
    rows = approx.compare(task, model, tmp_path, _args())  # no suite circuit: the exact one computed and saved
    exact = he.Circuit.load(tmp_path / "circuit_approx" / "exact-4.json")
    assert exact.search == "exact" and exact.tie_break == "score" and len(exact.removed) == 4
    assert rows[0][0] == "exact" and [row[0] for row in rows[1:]] == ["multi-2", "fast-bf16"]
    for row in rows[1:]:
        overlaps = [float(cell) for cell in row[3 : 3 + (len(row) - 3) // 2]]
        assert all(0 <= overlap <= 1 for overlap in overlaps) and overlaps[-1] == pytest.approx(
            len(set(he.Circuit.load(tmp_path / "circuit_approx" / f"{row[0]}-4.json").removed) & set(exact.removed)) / 4
        )

    # a suite circuit that was an approximation is not the exact ranking; one exact under the tie rule is
    suite_circuit = replace(exact, search="multi-4-bf16", removed=list(reversed(exact.removed)))
    suite_circuit.save(tmp_path / "circuit_avg.json")
    (tmp_path / "circuit_approx" / "exact-4.json").unlink()
    calls = []
    extract = he.extract_circuit
    monkeypatch.setattr(he, "extract_circuit", lambda *a, **k: calls.append(k.get("method")) or extract(*a, **k))
    approx.compare(task, model, tmp_path, _args())
    assert calls == ["fast"]  # the exact search again (the approximations: read back)
    replace(exact, removed=list(reversed(exact.removed))).save(tmp_path / "circuit_avg.json")  # exact, "score"
    (tmp_path / "circuit_approx" / "exact-4.json").unlink()
    calls.clear()
    rows = approx.compare(task, model, tmp_path, _args())
    points = (len(rows[0]) - 3) // 2
    assert calls == [] and rows[0][2] == "1.0" and set(rows[0][3 : 3 + points]) == {"1.000"}  # read back, no search
    rebuilt = MODELS["bert"](seed=1).eval()  # the approximations were searched on seed 0's weights: again
    approx.compare(task, rebuilt, tmp_path, _args(methods=["multi-2"]))
    assert calls == ["multi"]


def test_batches_are_spread_over_the_sets_and_named_so(tiny_task, tmp_path):  # noqa: F811
    assert approx.spread(list(range(10)), 3) == [0, 3, 6] and approx.spread([1, 2], 5) == [1, 2]
    task, model = replace(tiny_task, circuit_tie_break="score"), MODELS["bert"](seed=0).eval()
    approx.compare(task, model, tmp_path, _args(batches=1, methods=["multi-2"]))
    assert (tmp_path / "circuit_approx" / "exact-1-spread-batches-4.json").exists()
    assert (tmp_path / "circuit_approx" / "multi-2-4-1-spread-batches.json").exists()
