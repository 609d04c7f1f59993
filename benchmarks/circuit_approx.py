"""How far the approximate circuit searches agree with the exact one, and what they cost, on a benchmark task's
own fine-tuned model and circuit data (issue 12, deliverable 5) — measured in one run.

The exact ranking is the suite's cached `circuit_avg.json` for that seed when it exists (else it is computed
here, timed). Its time: measured where this script ran it (or with --time-exact, which reruns it and checks the
ranking against the cached one), else estimated by `estimate_exact_seconds` and printed with '~'. Each
approximation runs the same data, criterion and budget; agreement is the overlap of the sets of the first n heads
removed (n: half of what a pruned member loses, all of it, half the budget, the whole budget — those below the
budget), i.e. how many of the heads that a pruned member would lose are the same.

    python benchmarks/circuit_approx.py image-dinov2 --seed 0 --methods fast:bf16 multi-2 multi-4 multi-4:bf16 multi-8
    python benchmarks/circuit_approx.py sentiment-mpnet --seed 0 --batches 2 --budget 16 --methods multi-4:bf16 multi-4

With --batches K, only the first K batches of each circuit set are used, exact ranking included (computed once,
resumable, saved under the seed's cache): a cheaper comparison when the exact search on the full data is too slow.

Overlap alone can mislead where S is flat: when many candidates leave exactly the same S, Algorithm 1 removes the
first in (layer, head) order, and a search that reached a slightly different state breaks those ties elsewhere.
So each search also gets the quality of what it removed: S of the model with its first n heads removed, scored
exactly (columns S@n), next to the exact search's own; and how many of the exact ranking's steps left S exactly
unchanged (plateaus, where ties decide). Every circuit is saved under the seed's cache (`circuit_approx/`), so a
rerun only prints.
"""

import argparse
import json
import time

import hydra_ensembles as he
from hydra_ensembles.bench import cache_dir, runner, suite
from hydra_ensembles.bench.tasks import TASKS
from hydra_ensembles.importance import CRITERIA
from hydra_ensembles.importance.circuit import search_name
from hydra_ensembles.importance.circuit.scoring import ReferenceScorer
from hydra_ensembles.importance.circuit.search import estimate_exact_seconds
from hydra_ensembles.io import write_json_atomic


def overlap(a, b, n):
    return len(set(a[:n]) & set(b[:n])) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=int, help="default: the task's circuit budget (what the suite extracts)")
    parser.add_argument("--methods", nargs="+", default=["fast:bf16", "multi-2", "multi-4", "multi-4:bf16", "multi-8"])
    parser.add_argument(
        "--time-exact",
        action="store_true",
        help="run the exact search in full, timed, even when its circuit is cached (checked against it); without "
        "this, an exact time not measured before is estimated (estimate_exact_seconds) and marked '~'",
    )
    parser.add_argument(
        "--exact-seconds",
        type=float,
        help="the exact search's measured time, in seconds, when it is known from elsewhere (saved for later runs)",
    )
    parser.add_argument(
        "--batches",
        type=int,
        help="use only the first K batches (16 examples) of the ID and of the OOD circuit data: a cheaper exact "
        "ranking to compare against (a proxy of the full data's agreement; saved and resumable)",
    )
    args = parser.parse_args()
    task = TASKS[args.task]("full")
    seed_cache = runner.seed_dir(cache_dir() / "bench" / "full", task, args.seed)
    model = runner.predictor(task, suite.TABLE, args.seed, seed_cache, row="Single", progress=False)
    layers = he.get_adapter(model).num_layers(model)
    budget = args.budget or suite.circuit_removals(task, layers)
    id_data, ood_data = task.circuit_id, task.circuit_ood
    exact_path, state_path = seed_cache / "circuit_avg.json", None
    if args.batches:
        id_data, ood_data = id_data[: args.batches], ood_data[: args.batches]
        exact_path = seed_cache / "circuit_approx" / f"exact-{args.batches}-batches-{budget}.json"
        state_path = exact_path.with_suffix(".state.json")
    cached = he.Circuit.load(exact_path) if exact_path.exists() else None
    if cached is not None and len(cached.removed) >= budget and not args.time_exact:
        exact, exact_seconds = cached, None
    else:  # computed here, timed; --time-exact reruns it from scratch and checks it against the cached one
        state_path = None if args.time_exact else state_path
        resumed, started = state_path is not None and state_path.exists(), time.perf_counter()
        exact = he.extract_circuit(model, id_data, ood_data, "avg", budget, method="fast", state_path=state_path)
        exact_seconds = None if resumed else time.perf_counter() - started  # resumed: a time saved or estimated below
        if cached is not None and args.time_exact:
            same = exact.removed == cached.removed[:budget] and exact.scores == cached.scores[:budget]
            verdict = "the same" if same else "NOT the same"
            print(f"exact search rerun in {exact_seconds:.0f} s: {verdict} ranking and scores as the cached one")
        elif args.batches:
            exact.save(exact_path)
    suffix = f"-{args.batches}-batches" if args.batches else ""
    seconds_path = seed_cache / "circuit_approx" / f"exact-{budget}{suffix}.seconds.json"
    timing = json.loads(seconds_path.read_text()) if seconds_path.exists() else None
    timing = {"seconds": timing, "estimated": False} if isinstance(timing, float) else timing  # older files: measured
    if exact_seconds is not None:
        timing = {"seconds": exact_seconds, "estimated": False}
    elif args.exact_seconds:
        timing = {"seconds": args.exact_seconds, "estimated": False}
    elif timing is None:
        seconds = estimate_exact_seconds(model, list(id_data), list(ood_data), budget)
        timing = {"seconds": seconds, "estimated": True}
    write_json_atomic(seconds_path, timing)
    exact_seconds, approx = timing["seconds"], "~" if timing["estimated"] else ""
    half, pruned = task.prune_per_layer * layers // 2, task.prune_per_layer * layers
    scorer = ReferenceScorer(model, id_data, ood_data, CRITERIA["avg"])  # any set of removed heads, in any order

    points = sorted({n for n in (half, pruned, budget // 2) if 0 < n < budget} | {budget})  # prefixes compared

    def quality(circuit: he.Circuit) -> list[float]:  # S with the first n heads removed, scored exactly
        return [scorer.baseline(circuit.removed[:n]) for n in points]

    print(
        f"{task.name} seed {args.seed}: budget {budget}; members prune {pruned}; "
        f"exact search {approx}{exact_seconds:.0f} s; "
        f"{flat_steps(exact)} of its {budget} steps left S exactly unchanged (plateaus: ties go to (layer, head) order)"
    )
    columns = ("search", "seconds", "x faster", *(f"overlap@{n}" for n in points), *(f"S@{n}" for n in points))
    print(f"{columns[0]:<16}" + "".join(f"{c:>13}" for c in columns[1:]))
    exact_cells = [f"{approx}{exact_seconds:.0f}", "1.0", *["1.000"] * len(points)]
    exact_cells += [f"{q:.4f}" for q in quality(exact)]
    print(f"{'exact':<16}" + "".join(f"{c:>13}" for c in exact_cells), flush=True)
    for spec in args.methods:
        name, _, precision = spec.partition(":")
        method, _, top = name.partition("-")
        search = search_name(method, int(top or 8), precision or "fp32")
        path = seed_cache / "circuit_approx" / f"{search}-{budget}{suffix}.json"
        if path.exists():
            circuit = he.Circuit.load(path)
            seconds = json.loads(path.with_suffix(".seconds.json").read_text())
        else:
            started = time.perf_counter()
            circuit = he.extract_circuit(
                model,
                id_data,
                ood_data,
                "avg",
                budget,
                method=method,
                top=int(top or 8),
                precision=precision or "fp32",
                progress=False,
            )
            seconds = time.perf_counter() - started
            circuit.save(path)
            write_json_atomic(path.with_suffix(".seconds.json"), seconds)
        agreement = [overlap(circuit.removed, exact.removed, n) for n in points]
        cells = [f"{seconds:.0f}", f"{exact_seconds / seconds:.1f}", *(f"{a:.3f}" for a in agreement)]
        cells += [f"{q:.4f}" for q in quality(circuit)]
        print(f"{circuit.search:<16}" + "".join(f"{c:>13}" for c in cells), flush=True)


def flat_steps(exact: he.Circuit) -> int:
    """Steps of the exact ranking after which S was exactly what it was before: plateaus, where candidates that
    leave S unchanged tie and Algorithm 1 removes the first of them in (layer, head) order."""
    return sum(1 for before, after in zip([exact.baseline, *exact.scores], exact.scores) if before == after)


if __name__ == "__main__":
    main()
