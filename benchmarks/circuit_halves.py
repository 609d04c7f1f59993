"""Is the circuit a property of the model or of the validation sample (issue 39, item 1)? The task's circuit
data (ID and OOD) is split into two disjoint halves by alternate examples (`split_halves`; OOD sentences by
alternate groups where they share a review, `Task.circuit_ood_groups`, so no review is on both sides); the circuit is
extracted on each half with the task's own search settings, from the seed's single model (cached, or trained
as the suite trains it); the report says
how many of the first k heads removed the two agree on (`removal_agreement`), against chance (k / H for two random
orders of H heads), each extraction's wall time and how many of its removals were ties.

    python benchmarks/circuit_halves.py text-mpnet --seed 0 --first 12 24 48 --criterion avg

Writes benchmarks/results/<task name>[-quick]/circuit-halves[-seedN][-criterion].md and .json. The search removes
max(--first) heads; each half's state is saved under the seed's cache (circuit_halves/), so a killed run resumes;
the seconds spent on each half are kept beside its state (<state>.time.json) and added up across runs, and the
report says how many runs they took. Each half holds half the examples, so each extraction
costs about half of one on the whole data (the search's time grows about linearly with the examples).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from torch import nn
from tqdm.auto import tqdm

from hydra_ensembles.bench import cache_dir, runner, suite
from hydra_ensembles.bench.records import discard_stale_state
from hydra_ensembles.bench.tasks import TASKS
from hydra_ensembles.data.loaders import Batch
from hydra_ensembles.data.loaders import batch_size as examples_in
from hydra_ensembles.evaluation.compare import machine
from hydra_ensembles.importance.circuit import (
    CRITERIA,
    Circuit,
    chance_agreement,
    chance_p_value,
    extract_circuit,
    removal_agreement,
    split_halves,
)
from hydra_ensembles.importance.circuit.budget import auto_choice
from hydra_ensembles.io import write_json_atomic, write_text_atomic
from hydra_ensembles.pruning import kept_heads

RESULTS = Path(__file__).parent / "results"
RECORDS = Path(__file__).parent / "records"  # `hydra-ens bench --records`'s: what the suite built, on any machine
SIZES = ("full", "quick")  # the sizes `hydra-ens bench` trains (quick: --quick)


def single_model(task, size: str, seed: int, progress: bool = True, records: Path = RECORDS) -> tuple[nn.Module, Path]:
    """(the single model the suite trained for `seed`, its seed's cache directory). A cache without it (a
    machine that kept only the benchmark's records, `records`) trains it as `hydra-ens bench` does, checked
    against the recorded digests the same way."""
    # the records' batch layout and digests first, as `hydra-ens bench` reads them
    seed_cache = runner.prepared_seed_dir(cache_dir() / "bench" / size, task, seed, records)
    return suite.Pieces(runner.SeedRun(task, seed, seed_cache, progress=progress)).single(), seed_cache


def search_settings(
    task, model: nn.Module, id_batches: list[Batch], ood_batches: list[Batch], budget: int, precision: str | None = None
) -> dict:
    """The task's circuit search as `extract_circuit` keywords, its candidates scored at `precision` (default: the
    task's). Method "auto" is resolved once, on the first half, so that both halves run the same search (left to
    each, they could choose different approximations)."""
    method, top, precision = task.circuit_method, task.circuit_top, precision or task.circuit_precision
    if method == "auto":
        choice = auto_choice(model, id_batches, ood_batches, budget, 1800.0, top=top, precision=precision)
        method, top, precision = choice.method, choice.top, choice.precision
    return {"method": method, "top": top, "precision": precision, "tie_break": task.circuit_tie_break}


def halves_report(
    model: nn.Module,
    id_batches: list[Batch],
    ood_batches: list[Batch],
    criterion: str,
    first: list[int],
    settings: dict | None = None,
    state_dir: Path | None = None,
    progress: bool = True,
    ood_groups: list[str] | None = None,
    state_tag: str = "",
) -> dict:
    """Extract the `criterion` circuit (removing max(`first`) heads) on each half of the ID and OOD data and
    compare their first k removals for each k in `first`. `settings`: `extract_circuit` keywords (default: its
    own); `state_dir`: where each half's search state is saved, to resume, its name ending in `state_tag` (a search
    of other settings keeps its own); `ood_groups`: the group of each OOD example (`split_halves`)."""
    budget, heads = max(first), sum(map(len, kept_heads(model).values()))
    if min(first) < 1 or budget >= heads:
        raise ValueError(f"--first: each k must be in 1..{heads - 1} (a circuit keeps at least one head), got {first}.")
    circuits, extractions = [], []
    halves = zip(split_halves(id_batches), split_halves(ood_batches, ood_groups))
    for half, (id_half, ood_half) in enumerate(halves, start=1):
        if progress:
            tqdm.write(f"half {half} of 2: {_examples(id_half)} ID + {_examples(ood_half)} OOD examples")
        state = None if state_dir is None else state_dir / f"{criterion}-half{half}-{budget}{state_tag}.state.json"
        circuit, extraction = timed_extraction(model, id_half, ood_half, criterion, budget, settings, state, progress)
        circuits.append(circuit)
        extractions.append({"half": half} | extraction)
    agreement = removal_agreement(circuits[0].removed, circuits[1].removed, first)
    return {
        "criterion": criterion,
        "heads": heads,
        "budget": budget,
        "id_examples": _examples(id_batches),
        "ood_examples": _examples(ood_batches),
        "agreement": [{"k": k, "agreement": a, "chance": chance_agreement(k, heads)} for k, a in agreement.items()],
        "extractions": extractions,
    }


def timed_extraction(
    model: nn.Module,
    id_batches: list[Batch],
    ood_batches: list[Batch],
    criterion: str,
    budget: int,
    settings: dict | None,
    state: Path | None,
    progress: bool,
) -> tuple[Circuit, dict]:
    """(the circuit, what the report says of its extraction: data sizes, wall time across runs, search, ties,
    ranking). The time record beside `state` is rewritten at the start (marking this run open) and at the end
    (closed: "running_since" null, not absent, so that merging an older copy saved mid-run cannot reopen it). A run
    that finds the search done (its state unchanged) is not counted."""
    if state is not None:  # a state (from the records, too) of other weights: the search and its time start over
        discard_stale_state(state, model)
    earlier = time_so_far(state)
    before = state.read_bytes() if state is not None and state.exists() else None
    opened, started = time.time(), time.perf_counter()
    if state is not None:
        write_json_atomic(time_path(state), earlier | {"runs": earlier["runs"] + 1, "running_since": opened})
    circuit = extract_circuit(
        model, id_batches, ood_batches, criterion, budget, **(settings or {}), state_path=state, progress=progress
    )
    this_run = time.perf_counter() - started
    searched = before is None or state.read_bytes() != before
    spent = earlier | ({"seconds": earlier["seconds"] + this_run, "runs": earlier["runs"] + 1} if searched else {})
    if state is not None:
        write_json_atomic(time_path(state), spent | {"running_since": None})
    return circuit, {
        "id_examples": _examples(id_batches),
        "ood_examples": _examples(ood_batches),
        **spent,
        "this_run_seconds": this_run,
        "search": circuit.search,
        "tied": circuit.tied(),
        "tie_note": circuit.tie_note(),
        "removed": [list(head) for head in circuit.removed],
    }


def time_path(state: Path) -> Path:
    """Where the seconds spent on the search saved at `state` are kept: beside it."""
    return state.with_name(state.name.removesuffix(".state.json") + ".time.json")


def time_so_far(state: Path | None) -> dict:
    """{"seconds", "runs", "earlier_unknown"} spent on `state` before this run. A run killed before its end left
    "running_since" (its start, Unix time): it counts up to the state's last save, since the work after that is
    redone. A state without a record (saved before records were kept) has earlier time unknown: flagged."""
    if state is None or not state.exists():  # a fresh search: an old record belongs to a deleted state
        return {"seconds": 0.0, "runs": 0, "earlier_unknown": False}
    if not time_path(state).exists():
        return {"seconds": 0.0, "runs": 0, "earlier_unknown": True}
    record = json.loads(time_path(state).read_text())
    killed_run_start = record.pop("running_since", None)  # null: the last run closed
    if killed_run_start is not None:
        record["seconds"] += max(0.0, state.stat().st_mtime - killed_run_start)
    return record


def _examples(batches: list[Batch]) -> int:
    return sum(map(examples_in, batches))


def render(report: dict) -> str:
    """The report as Markdown: the agreement table, then each extraction's size, time and ties."""
    heads, criterion = report["heads"], report["criterion"]
    search = " / ".join(sorted({e["search"] for e in report["extractions"]}))
    lines = [
        f"# Circuit on two disjoint halves of the validation data: {report['task']}, seed {report['seed']}",
        "",
        f"Criterion {criterion}; search {search}; each half's circuit removes {report['budget']} of {heads} heads. "
        f"Halves: alternate examples of the task's circuit data ({report['id_examples']} ID, "
        f"{report['ood_examples']} OOD examples).",
        "",
        "| first k removed | agreement | chance (k / H) | p (chance agrees as much) |",
        "|---:|---:|---:|---:|",
        *(
            f"| {a['k']} | {a['agreement']:.3f} | {a['chance']:.3f} | "
            f"{_p(chance_p_value(a['k'], heads, a['agreement']))} |"
            for a in report["agreement"]
        ),
        "",
        "Agreement at k: the fraction of the first k heads removed on one half that are among the first k removed "
        f"on the other. Chance: k / H (H = {heads}), what two random removal orders share; p: how often two random "
        "orders share at least as many (hypergeometric, exact). The k are nested, so their p are not independent.",
        "",
        "| half | ID examples | OOD examples | wall time | tied removals |",
        "|---:|---:|---:|---:|---|",
        *(_extraction_row(e) for e in report["extractions"]),
        "",
        "Wall time: summed over the runs each half took (a killed run counts up to its last saved step). "
        "Cost: the search's time grows about linearly with the examples, so each half costs about half of an "
        "extraction on the whole data.",
        "",
        f"Machine: {report['machine']}",
        "",
        f"Command: `{report['command']}`",
        "",
    ]
    return "\n".join(lines)


def _p(value: float) -> str:
    return f"{value:.3f}" if value >= 0.001 else f"{value:.1e}"


def _extraction_row(extraction: dict) -> str:
    runs = extraction.get("runs", 1)  # reports written before runs were counted: one run
    over = f" over {runs} runs" if runs > 1 else ""
    earlier = extraction.get("earlier_unknown", False)
    unknown = " + earlier runs' time, unknown (their state has no time record)" if earlier else ""
    ties = extraction["tie_note"] or "unknown"
    return (
        f"| {extraction['half']} | {extraction['id_examples']} | {extraction['ood_examples']} | "
        f"{_duration(extraction['seconds'])}{over}{unknown} | {ties} |"
    )


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.1f} s"


def write_report(report: dict, path: Path) -> None:
    """`path`.md and `path`.json, each written atomically."""
    write_json_atomic(path.with_suffix(".json"), report)
    write_text_atomic(path.with_suffix(".md"), render(report))


def report_name(seed: int, criterion: str, tag: str = "") -> str:
    """circuit-halves, with the seed and criterion when they are not the defaults (0, avg), and `tag` (another
    precision than the task's)."""
    return "circuit-halves" + (f"-seed{seed}" if seed else "") + ("" if criterion == "avg" else f"-{criterion}") + tag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--size", choices=SIZES, default="full")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, nargs="+", default=[12, 24, 48], metavar="K")
    parser.add_argument("--criterion", choices=sorted(CRITERIA), default="avg")
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        help="the candidates' precision (default: the task's; sentiment-mpnet's bf16 is emulated, several times "
        "slower than fp32, on a CPU without bf16 instructions); the report and search states are named for it",
    )
    args = parser.parse_args()
    task = TASKS[args.task](args.size)
    model, seed_cache = single_model(task, args.size, args.seed)
    budget = max(args.first)
    groups = task.circuit_ood_groups
    id_first, ood_first = split_halves(task.circuit_id)[0], split_halves(task.circuit_ood, groups)[0]
    settings = search_settings(task, model, id_first, ood_first, budget, args.precision)
    tag = f"-{args.precision}" if args.precision not in (None, task.circuit_precision) else ""
    report = halves_report(
        model,
        task.circuit_id,
        task.circuit_ood,
        args.criterion,
        sorted(set(args.first)),
        settings,
        seed_cache / "circuit_halves",
        ood_groups=groups,
        state_tag=tag,
    )
    report |= {
        "task": task.name,
        "size": args.size,
        "settings": settings,
        "seed": args.seed,
        "machine": machine(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
    }
    folder = RESULTS / (task.name + ("-quick" if args.size == "quick" else ""))
    write_report(report, folder / report_name(args.seed, args.criterion, tag))
    print(render(report))


if __name__ == "__main__":
    main()
