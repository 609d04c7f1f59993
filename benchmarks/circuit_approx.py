"""How far the approximate circuit searches agree with the exact one, and what they cost, on a benchmark task's
own fine-tuned model and circuit data (issue 12, deliverable 5).

The exact ranking is the suite's cached `circuit_avg.json` for that seed when the suite's search was exact with
the task's tie rule (else it is computed here, resumable, timed, and saved under `circuit_approx/`). Its time:
measured where this script ran it (or with --time-exact, which reruns it and checks the ranking against the
cached one), else estimated by `estimate_exact_seconds` and printed with '~'. Each approximation runs the same
data, criterion, tie rule and budget; agreement is the overlap of the sets of the first n heads removed (n: half
of what a pruned member loses, all of it, half the budget, the whole budget — those below the budget), i.e. how
many of the heads that a pruned member would lose are the same. Each search is timed when it runs and its time
saved with its circuit, with the date and machine printed beside it: a rerun only prints, so "x faster" may divide
times taken in different runs (the table says when each was).

    python benchmarks/circuit_approx.py image-dinov2 --seed 0 --methods fast:bf16 multi-2 multi-4 multi-4:bf16 multi-8
    python benchmarks/circuit_approx.py sentiment-mpnet --seed 0 --batches 2 --budget 16 --methods multi-4:bf16 multi-4

With --batches K, K of the batches of each circuit set, spread evenly over them (the OOD set is its sources one
after another), are used, exact ranking included (computed once, resumable, saved under the seed's cache): a
cheaper comparison when the exact search on the full data is too slow.

Overlap alone can mislead where S is flat: when many candidates leave exactly the same S, the tie rule decides
(the task's: "score", a continuous secondary score; "order": the first in (layer, head) order), and a search
that reached a slightly different state breaks those ties elsewhere.
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
from hydra_ensembles.evaluation.compare import measured_here
from hydra_ensembles.importance import CRITERIA
from hydra_ensembles.importance.circuit import search_name
from hydra_ensembles.importance.circuit.scoring import ReferenceScorer
from hydra_ensembles.importance.circuit.search import estimate_exact_seconds
from hydra_ensembles.io import weights_digest, write_json_atomic


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
        help="use only K batches (as the task batches them, spread evenly) of the ID and of the OOD circuit data: a "
        "cheaper exact ranking to compare against (a proxy of the full data's agreement; saved and resumable)",
    )
    args = parser.parse_args()
    task = TASKS[args.task]("full")
    seed_cache = runner.seed_dir(cache_dir() / "bench" / "full", task, args.seed)
    model = runner.predictor(task, suite.TABLE, args.seed, seed_cache, row="Single", progress=False)
    compare(task, model, seed_cache, args)


def compare(task, model, seed_cache, args: argparse.Namespace) -> list[list[str]]:
    """Print the comparison of `args.methods` with the exact search on `task`'s circuit data for `model` (the seed's
    single model, whose cache is `seed_cache`); returns the printed rows (the search's name, then its cells)."""
    layers = he.get_adapter(model).num_layers(model)
    budget = args.budget or suite.circuit_removals(task, layers)
    id_data, ood_data, tie_break = task.circuit_id, task.circuit_ood, task.circuit_tie_break
    suffix = f"-{args.batches}-spread-batches" if args.batches else ""  # files of the first K batches: other data
    own_path = seed_cache / "circuit_approx" / f"exact{suffix}-{budget}.json"  # computed here
    if args.batches:
        id_data, ood_data = spread(id_data, args.batches), spread(ood_data, args.batches)
    suite_circuit = seed_cache / "circuit_avg.json"
    candidates = [own_path] if args.batches else [own_path, suite_circuit]  # the suite's: on the full data
    cached = next((c for c in (_exact(path, tie_break, budget) for path in candidates) if c), None)
    if cached is not None and not args.time_exact:
        exact, exact_seconds = cached, None
    else:  # computed here, timed; --time-exact reruns it from scratch and checks it against the cached one
        state_path = None if args.time_exact else own_path.with_suffix(".state.json")
        resumed, started = state_path is not None and state_path.exists(), time.perf_counter()
        exact = he.extract_circuit(
            model, id_data, ood_data, "avg", budget, method="fast", state_path=state_path, tie_break=tie_break
        )
        exact_seconds = None if resumed else time.perf_counter() - started  # resumed: a time saved or estimated below
        if cached is not None:
            same = exact.removed == cached.removed[:budget] and exact.scores == cached.scores[:budget]
            verdict = "the same" if same else "NOT the same"
            print(f"exact search rerun in {exact_seconds:.0f} s: {verdict} ranking and scores as the cached one")
        else:
            exact.save(own_path)
    seconds_path = seed_cache / "circuit_approx" / f"exact-{budget}{suffix}.seconds.json"
    timing = json.loads(seconds_path.read_text()) if seconds_path.exists() else None
    timing = {"seconds": timing, "estimated": False} if isinstance(timing, float) else timing  # older files: measured
    if exact_seconds is not None:
        timing = {"seconds": exact_seconds, "estimated": False} | measured_here()
    elif args.exact_seconds:
        timing = {"seconds": args.exact_seconds, "estimated": False, "machine": "given by --exact-seconds"}
    elif timing is None:
        seconds = estimate_exact_seconds(model, list(id_data), list(ood_data), budget)
        timing = {"seconds": seconds, "estimated": True} | measured_here()
    write_json_atomic(seconds_path, timing)
    exact_seconds, approx = timing["seconds"], "~" if timing["estimated"] else ""
    half, pruned = task.prune_per_layer * layers // 2, task.prune_per_layer * layers
    scorer = ReferenceScorer(model, id_data, ood_data, CRITERIA["avg"])  # any set of removed heads, in any order
    digest = weights_digest(model)  # what a cached approximate search was run on

    points = sorted({n for n in (half, pruned, budget // 2) if 0 < n < budget} | {budget})  # prefixes compared

    def quality(circuit: he.Circuit) -> list[float]:  # S with the first n heads removed, scored exactly
        return [scorer.baseline(circuit.removed[:n]) for n in points]

    print(
        f"{task.name} seed {args.seed}: budget {budget}; members prune {pruned}; "
        f"exact search {approx}{exact_seconds:.0f} s ({_when(timing)}); {flat_steps(exact, budget)} of its {budget} "
        f"steps left S exactly unchanged (plateaus: ties decided by the tie rule, {tie_break!r})"
    )
    columns = ("search", "seconds", "x faster", *(f"overlap@{n}" for n in points), *(f"S@{n}" for n in points))
    print(f"{columns[0]:<16}" + "".join(f"{c:>13}" for c in columns[1:]))
    exact_cells = [f"{approx}{exact_seconds:.0f}", "1.0", *["1.000"] * len(points)]
    exact_cells += [f"{q:.4f}" for q in quality(exact)]
    print(f"{'exact':<16}" + "".join(f"{c:>13}" for c in exact_cells), flush=True)
    printed = [["exact", *exact_cells]]
    for spec in args.methods:
        name, _, precision = spec.partition(":")
        method, _, top = name.partition("-")
        search = search_name(method, int(top or 8), precision or "fp32")
        path = seed_cache / "circuit_approx" / f"{search}-{budget}{suffix}.json"
        circuit = he.Circuit.load(path) if path.exists() else None
        if circuit is not None:
            timed = json.loads(path.with_suffix(".seconds.json").read_text())
            timed = timed if isinstance(timed, dict) else {"seconds": timed}  # older files: seconds alone
            # searched for another tie rule, or on other weights (a records machine that rebuilt the model): again
            if circuit.tie_break != tie_break or timed.get("model", digest) != digest:
                circuit = None
        if circuit is None:
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
                tie_break=tie_break,
            )
            timed = {"seconds": time.perf_counter() - started, "model": digest} | measured_here()
            circuit.save(path)
            write_json_atomic(path.with_suffix(".seconds.json"), timed)
        seconds = timed["seconds"]
        agreement = [overlap(circuit.removed, exact.removed, n) for n in points]
        cells = [f"{seconds:.0f}", f"{exact_seconds / seconds:.1f}", *(f"{a:.3f}" for a in agreement)]
        cells += [f"{q:.4f}" for q in quality(circuit)]
        print(f"{circuit.search:<16}" + "".join(f"{c:>13}" for c in cells) + f"   ({_when(timed)})", flush=True)
        printed.append([circuit.search, *cells])
    return printed


def spread(batches: list, count: int) -> list:
    """`count` of `batches`, evenly spaced from the first: every part of a set made of its sources one after
    another (all of them when there are no more)."""
    if count >= len(batches):
        return list(batches)
    return [batches[i * len(batches) // count] for i in range(count)]


def _exact(path, tie_break: str, budget: int) -> "he.Circuit | None":
    """The circuit saved at `path` when it is an exact search under `tie_break` with at least `budget` removals."""
    if not path.exists():
        return None
    circuit = he.Circuit.load(path)
    return (
        circuit
        if circuit.search == "exact" and circuit.tie_break == tie_break and len(circuit.removed) >= budget
        else None
    )


def _when(timed: dict) -> str:
    """When and where a search was timed (or its time estimated), as its seconds file says ("time not dated" for
    older files)."""
    if "date" not in timed:
        return "time not dated"
    return f"{'estimated' if timed.get('estimated') else 'timed'} {timed['date']} on {timed['machine']}"


def flat_steps(exact: he.Circuit, budget: int) -> int:
    """Steps among the exact ranking's first `budget` after which S was exactly what it was before: plateaus, where
    candidates that leave S unchanged tie and the tie rule decides."""
    scores = exact.scores[:budget]
    return sum(1 for before, after in zip([exact.baseline, *scores], scores) if before == after)


if __name__ == "__main__":
    main()
