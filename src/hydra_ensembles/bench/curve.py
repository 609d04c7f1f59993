"""Cost against quality on one base (issue 44): Single, Deep Ensembles, Hydra (Circ) and the cheaper ensembles of the
same fine-tuned model, each at its FLOPs and at its latency timed interleaved with the others in one run.

The cheaper variants (rows of `bench.suite`): one pruned model (CircAvg), also with a temperature fit on validation
(next to Single's, "Temp. scaling", and Hydra (Circ)'s: one temperature is what closed Hydra's calibration gap on
DINOv2-S); the single model pruned of as many weights by OBA and fine-tuned like the members ("OBA": one model's
cost, level with Hydra (Circ) on the small ViT); members identical in their first half or three quarters of the
layers, which the fused ensemble runs once ("Hydra (Circ), shared trunk 1/2", "3/4"); Hydra (Circ)'s members fused,
then fine-tuned as one module. "Single, fused engine" is Single on the fused rows' engine: their cost without the
engine's own saving. Each row also records the numbers a user chooses by, measured on validation data no circuit saw
(`validation_metrics`): NLL and accuracy on the ID validation examples past the circuits' ones, and the all-OOD
AUROC (maximum softmax probability) of those against a third part of each OOD source with examples to spare (the
table names any without), disjoint from its validation part (the circuits' OOD data, which would flatter the circuit
rows) and from its test part. At each cost limit (`LIMITS`, FLOPs x Single; `LATENCY_LIMITS`, latency x Single) the
row of best validation AUROC within it is chosen (ties: lower validation NLL); the test columns are read after,
never used to choose. Each row is compared with Single by the paired bootstrap (`evaluation.bootstrap`), and the
table says which rows, if any, beat Single on NLL, ECE and all-OOD AUROC at most `ONE_MODEL` x its latency. Writes
cost_curve.md, cost_curve.json and cost_curve.png beside the task's table, with records of its own
(`cost_curve.json`, `curve-logits/` in each seed's cache) so that it renders from records like the table."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

import torch

from ..evaluation import plots
from ..evaluation.bootstrap import Interval, difference_lines, row_differences, verdict
from ..evaluation.compare import Built, row_file
from ..evaluation.report import evaluate
from ..evaluation.tables import CONVENTIONS, latency_ratio, render
from ..io import read_json_record, write_json_atomic
from ..outputs import collect_member_logits, labels_of
from . import runner, suite
from .runner import Table

ENGINE = suite.ENGINE  # Single's predictions at the fused engine's cost: the reference the Hydra rows share
CURVE_ROWS = (
    "Single",
    ENGINE,
    "Temp. scaling",
    "CircAvg",
    "CircAvg, temp. scaling",
    "OBA",
    "Hydra (Circ), shared trunk 3/4",
    "Hydra (Circ), shared trunk 1/2",
    "Hydra (Circ), fused then fine-tuned",
    "Hydra (Circ)",
    "Hydra (Circ), temp. scaling",
    "Deep Ensembles",
)
LIMITS = (1.0, 1.5, 2.0, 3.0)  # FLOPs x Single within which a row is chosen on validation
LATENCY_LIMITS = (1.1, 1.5, 2.0, 3.0)  # latency x Single, likewise (1.1: one model's price, `ONE_MODEL`)
TABLE_LOGITS = "curve-logits"  # each seed's folder of the rows' logits, for the intervals
CHEAPER_ROWS = tuple(row for row in CURVE_ROWS if row not in ("Single", ENGINE, "Hydra (Circ)", "Deep Ensembles"))
CALIBRATED = "Temp. scaling"  # the single model with its temperature
ONE_MODEL = 1.1  # latency x Single that counts as one model's cost (issue 44's question)


SELECTION = "selection-1"  # the data the validation numbers read (`Task.selection_id` / `selection_ood`)


def validation_metrics(predictor: torch.nn.Module, task) -> dict[str, float | str]:
    """{"nll", "acc"} of the ensemble on the ID validation examples no circuit saw (`task.selection_id`) and
    "auroc", the mean over the OOD sources of its maximum softmax probability separating those examples
    (negative) from the source's selection part (`task.selection_ood`, positive: in neither the circuits' OOD
    validation data nor the OOD test sets), as the test column "AUROC all" averages the OOD test sets; "data":
    `SELECTION`."""
    if not task.selection_id or not task.selection_ood:
        raise ValueError(
            f"task {task.name!r} has no selection data (Task.selection_id / selection_ood): the cost curve chooses "
            "its rows on validation data no circuit saw; give the task both."
        )
    val_logits = collect_member_logits(predictor, task.selection_id)  # (N, M, C)
    ood_logits = {name: collect_member_logits(predictor, batches) for name, batches in task.selection_ood.items()}
    said = evaluate(val_logits, labels_of(task.selection_id), ood=ood_logits)
    return {"nll": said["id"]["nll"], "acc": said["id"]["acc"], "auroc": said["all"]["auroc"], "data": SELECTION}


def _validated(build: Callable[[suite.Pieces], Built], p: suite.Pieces) -> Built:
    built = build(p)
    return Built(built.predictor, built.extra | {"validation": validation_metrics(built.predictor, p.task)})


ROWS = {row: partial(_validated, suite.BUILDS[row]) for row in CURVE_ROWS}


def validation_means(per_seed: Mapping) -> dict[str, dict[str, float]]:
    """{row: {"nll", "acc", "auroc"}}: each validation number's mean over the seeds that ran the row."""
    runs: dict[str, list[dict]] = {}
    for results in per_seed.values():
        for row, result in results.items():
            runs.setdefault(row, []).append(result["validation"])
    numbers = ("nll", "acc", "auroc")
    return {row: {k: statistics.fmean(r[k] for r in said) for k in numbers} for row, said in runs.items()}


def choose(summary: Mapping, limits: Sequence[float] = LIMITS) -> dict[str, str | None]:
    """{limit: the row of best validation AUROC among those costing at most `limit` x Single's FLOPs (ties: lower
    validation NLL), or None}. Reads validation numbers and FLOPs only."""
    rows = summary["rows"]
    single = rows["Single"]["flops_per_example"]["mean"]
    cost = {row: stats["flops_per_example"]["mean"] / single for row, stats in rows.items()}
    return _best_within(summary["validation"], cost, limits)


def choose_by_latency(summary: Mapping, limits: Sequence[float] = LATENCY_LIMITS) -> dict[str, str | None]:
    """`choose` at limits of latency x Single (the rows' timed ratios, `latency_ratio`): what a user who pays in
    time picks; {} when the rows were not timed."""
    latency = summary.get("latency") or {}
    if not all(row in latency for row in summary["rows"]):
        return {}
    cost = {row: latency_ratio(latency[row]) for row in summary["rows"]}
    return _best_within(summary["validation"], cost, limits)


def _best_within(validation: Mapping, cost: Mapping[str, float], limits: Sequence[float]) -> dict[str, str | None]:
    """{limit: the row of best validation AUROC (ties: lower validation NLL) whose `cost` is at most `limit`}."""
    chosen = {}
    for limit in limits:
        within = [row for row, spent in cost.items() if spent <= limit * (1 + 1e-9)]
        best = max(within, key=lambda r: (validation[r]["auroc"], -validation[r]["nll"]), default=None)
        chosen[f"{limit:g}"] = best
    return chosen


def _summarize(task, summary: dict, seed_dirs: Mapping[int, Path]) -> dict:
    said = {"validation": validation_means(summary["per_seed"])}
    # OOD sources with nothing left for a selection part: the validation AUROC averages the others
    said["selection_without"] = sorted((set(task.near) | set(task.far)) - set(task.selection_ood or {}))
    rows = list(summary["rows"])
    pairs = [(row, "Single") for row in rows[1:] if row != ENGINE]  # every row against the model it would replace
    # a calibrated row also against the single model calibrated the same way
    pairs += [(row, CALIBRATED) for row in rows if row.endswith(", temp. scaling") and CALIBRATED in rows]
    differences = row_differences(seed_dirs, labels_of(task.test), pairs, logits=TABLE_LOGITS)
    compared = {tuple(pair["rows"]) for pair in differences.get("pairs", [])} if differences else set()
    not_compared = [f"{a} vs {b}" for a, b in pairs if (a, b) not in compared]  # a seed without its logits
    return said | {"chosen": choose(summary | said), "differences": differences, "not_compared": not_compared}


def one_model_answer(summary: Mapping) -> list[str]:
    """Issue 44's question, answered from validation: the row chosen on validation within `ONE_MODEL` x Single's
    latency, and whether its paired intervals against Single are better on NLL, ECE and all-OOD AUROC alike;
    then, read off the test intervals (exploratory: not chosen on them), any other row that is. Rows not timed
    give no answer, and the lines say so rather than "none"."""
    latency = summary.get("latency") or {}
    untimed = [row for row in summary["rows"] if row not in latency]
    if untimed:
        return [f"At most {ONE_MODEL}x Single's latency: no answer, not timed ({', '.join(untimed)})."]
    chosen = choose_by_latency(summary, (ONE_MODEL,))[f"{ONE_MODEL:g}"]
    if chosen in (None, "Single", ENGINE):
        lines = [f"Chosen on validation within {ONE_MODEL}x Single's latency: {chosen or 'no row'}, Single itself."]
    else:
        verdicts = _verdicts(summary, chosen)
        said = "; ".join(f"{k} {v}" for k, v in verdicts.items()) or "not compared"
        answer = (
            "better on NLL, ECE and all-OOD AUROC alike." if _better_on_all(verdicts) else "not better on all three."
        )
        lines = [
            f"Chosen on validation within {ONE_MODEL}x Single's latency: {chosen}; against Single ({said}): {answer}"
        ]
    others = [row for row in beats_single(summary) if row != chosen]
    if others:
        lines.append(
            f"Also better than Single on all three within {ONE_MODEL}x its latency, read off the test intervals of "
            f"every row (exploratory, not chosen: about 1 interval in 20 reads better by chance): {', '.join(others)}."
        )
    return lines


def _verdicts(summary: Mapping, row: str) -> dict[str, str]:
    """{"NLL", "ECE", "AUROC all": better | worse | not separated} of `row` against Single; {} when not compared."""
    pairs = (summary.get("differences") or {}).get("pairs", [])
    pair = next((p for p in pairs if p["rows"] == [row, "Single"]), None)
    names = {"nll": "NLL", "ece": "ECE", "auroc_all": "AUROC all"}
    return {} if pair is None else {name: verdict(k, Interval(**pair[k])) for k, name in names.items() if k in pair}


def _better_on_all(verdicts: Mapping[str, str]) -> bool:
    return len(verdicts) == 3 and set(verdicts.values()) == {"better"}


def beats_single(summary: Mapping, latency_limit: float = ONE_MODEL) -> list[str]:
    """The rows timed at most `latency_limit` x Single's latency (`latency_ratio`) whose paired bootstrap interval
    against Single is "better" on NLL, ECE and all-OOD AUROC alike (`_verdicts`)."""
    latency, pairs = summary.get("latency") or {}, (summary.get("differences") or {}).get("pairs", [])
    compared = [pair["rows"][0] for pair in pairs if pair["rows"][1] == "Single"]
    timed = [row for row in compared if row in latency and latency_ratio(latency[row]) <= latency_limit]
    return [row for row in timed if _better_on_all(_verdicts(summary, row))]


def conclude(summary: Mapping) -> dict:
    """What reads the latency column, kept in cost_curve.json as the table prints it: {"chosen_by_latency":
    `choose_by_latency`, "answer": `one_model_answer`'s lines}."""
    return {"chosen_by_latency": choose_by_latency(summary), "answer": one_model_answer(summary)}


def markdown(summary: dict) -> str:
    rows, validation, latency = summary["rows"], summary["validation"], summary.get("latency") or {}
    single = rows["Single"]["flops_per_example"]["mean"]
    header = ["Row", "FLOPs x", "Latency x", "val NLL", "val AUROC", "Acc", "NLL", "ECE", "AUROC all"]
    body = []
    for row, stats in rows.items():
        timed = latency.get(row)
        body.append(
            [
                row,
                f"{stats['flops_per_example']['mean'] / single:.2f}",
                f"{latency_ratio(timed):.2f}" if timed else "–",
                f"{validation[row]['nll']:.3f}",
                f"{100 * validation[row]['auroc']:.1f}",
                f"{100 * stats['id.acc']['mean']:.1f}",
                f"{stats['id.nll']['mean']:.3f}",
                f"{100 * stats['id.ece']['mean']:.1f}",
                f"{100 * stats['all.auroc']['mean']:.1f}" if "all.auroc" in stats else "–",
            ]
        )
    chosen = [f"- at most {limit}x Single's FLOPs: {row or 'no row'}" for limit, row in summary["chosen"].items()]
    concluded = conclude(summary)
    chosen += [
        f"- at most {limit}x Single's latency: {row or 'no row'}"
        for limit, row in concluded["chosen_by_latency"].items()
    ]
    chosen += [] if concluded["chosen_by_latency"] else ["- by latency: not timed"]
    not_compared = summary.get("not_compared") or []
    answer = [
        *concluded["answer"],
        *([f"Not compared (a seed without the row's logits): {', '.join(not_compared)}."] if not_compared else []),
    ]
    differences = summary.get("differences")
    without = summary.get("selection_without")
    left_out = f" ({', '.join(without)}: no examples to spare, left out)" if without else ""
    lines = [
        f"# {summary['task']}: cost and quality of cheaper ensembles on one base",
        "",
        f"Command: `{summary['command']}`  ",
        f"Machine (this run): {summary['machine']}  ",
        f"Seeds: {summary['seeds']} (means over seeds)  ",
        f"Wall time: {summary['wall_time_s'] / 60:.1f} min for this run",
        *suite.measured_on_lines(summary),
        *suite.latency_lines(summary),
        "",
        *render(header, body, "markdown"),
        *engine_lines(summary),
        "",
        "Validation columns, on data no circuit saw: NLL on the ID validation examples past the circuits' ones, and "
        "the all-OOD AUROC (%, maximum softmax probability, the mean over the OOD sources) of those against a part "
        f"of each OOD source held out from both its circuit (validation) part and its test part{left_out} (a temp. "
        "scaling row's temperature was fit on the ID validation split, so its validation NLL is optimistic). Test "
        "columns as in the task's table. " + CONVENTIONS,
        "",
        "Chosen on validation (best validation AUROC within the cost limit; ties: lower validation NLL):",
        "",
        *chosen,
        "",
        *([*difference_lines(differences), ""] if differences else []),
        *answer,
        "",
        "Not on this curve: ensembles on an AMP base (`amp-*` tasks, their free table) and members pruning fewer "
        "heads (`--prune-per-layer`, a table of its own): each builds on another Single.",
        "",
        *(f"- {note}" for note in summary["notes"]),
    ]
    return "\n".join(lines) + "\n"


def engine_lines(summary: Mapping) -> list[str]:
    """The fused rows' cost x `ENGINE` (Single on the fused engine), when the table has it: Single as an HF model
    computes every token in its last layer, the engine only those the classifier reads, so x Single understates
    what fusing the members costs."""
    rows, latency = summary["rows"], summary.get("latency") or {}
    if ENGINE not in rows:
        return []
    flops = {row: stats["flops_per_example"]["mean"] for row, stats in rows.items()}
    fused = [row for row in rows if row.startswith("Hydra")]

    def ratio(row: str) -> str:
        timed = (
            f", latency {latency_ratio(latency[row]) / latency_ratio(latency[ENGINE]):.2f}x"
            if row in latency and ENGINE in latency
            else ""
        )
        return f"{row} {flops[row] / flops[ENGINE]:.2f}x FLOPs{timed}"

    said = f"{ENGINE}: Single's predictions at {flops[ENGINE] / flops['Single']:.2f}x its FLOPs. " + (
        f"The fused rows x this engine-matched Single: {'; '.join(ratio(row) for row in fused)}." if fused else ""
    )
    return ["", said]


def _figure(task, summary: dict, seed_cache: Path, out_dir: Path) -> None:
    plots.cost_curve(summary, out_dir / "cost_curve.png", title=f"{task.name}: cost and quality")


TABLE = Table(
    rows=runner.fixed(ROWS),
    pieces=suite.Pieces,
    markdown=markdown,
    output="cost_curve",
    record="cost_curve.json",
    logits=TABLE_LOGITS,
    summarize=_summarize,
    figures=_figure,
    conclude=conclude,
    timed_rows=runner.fixed({row: suite.BUILDS[row] for row in CURVE_ROWS}),  # timed without validating again
    latency_record="curve_latency.json",  # its own: timing its rows replaced the suite table's run of fewer rows
)


def run(task, seeds: Sequence[int], out_dir: Path, cache_dir: Path, **kwargs) -> dict:
    """`runner.run` of the curve's rows (`CURVE_ROWS`) on `task`: `kwargs` as runner.run's (command, progress,
    device, rows: a subset, Single always). Rows recorded with validation numbers on other data (`SELECTION`)
    are measured again."""
    for seed in seeds:
        forget_stale_rows(runner.seed_dir(cache_dir, task, seed) / TABLE.record)
    return runner.run(task, TABLE, seeds, out_dir, cache_dir, **kwargs)


def forget_stale_rows(record: Path) -> list[str]:
    """Drop from `record` (a seed's cost_curve.json) the rows whose validation numbers were not measured on
    `SELECTION` (before it, on the circuits' own OOD data), so that they are measured again; returns them."""
    results = read_json_record(record)
    stale = [row for row, result in results.items() if result.get("validation", {}).get("data") != SELECTION]
    if stale:
        print(f"{record}: measuring {', '.join(stale)} again (validation numbers on older data)", flush=True)
        write_json_atomic(record, {row: result for row, result in results.items() if row not in stale})
        for row in stale:  # their logits too: a row measured again must not be compared on the old ones
            row_file(record.parent / TABLE_LOGITS, row).unlink(missing_ok=True)
    return stale
