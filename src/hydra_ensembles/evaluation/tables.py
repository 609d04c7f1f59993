"""Tables of evaluation results, one renderer for every report: the benchmark's tables, `hydra-ens evaluate`'s
report and the demo's terminal table.

Rows are aggregated over seeds (`aggregate`: mean, std and the number of runs of every number); cost ratios
are relative to the first row.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

from ..cost import format_latency


class Column(NamedTuple):
    """One metric column: its header, where the metric lives in a report ("id", "near", "far", "all"), its
    key, the scale it is printed at (100 for %) and its digits."""

    header: str
    where: str
    key: str
    scale: float
    digits: int


COLUMNS = [  # the paper's Tables 1-2
    Column("Acc", "id", "acc", 100, 1),
    Column("Brier", "id", "brier", 1, 3),
    Column("NLL", "id", "nll", 1, 3),
    Column("ECE", "id", "ece", 100, 1),
    Column("aECE", "id", "aece", 100, 1),
    Column("AUROC near", "near", "auroc", 100, 1),
    Column("AUROC far", "far", "auroc", 100, 1),
    Column("AUROC all", "all", "auroc", 100, 1),
    Column("FPR95 all", "all", "fpr95", 100, 1),
    Column("AUPR-In all", "all", "aupr_in", 100, 1),
    Column("AUPR-Out all", "all", "aupr_out", 100, 1),
]
SELECTIVE_COLUMNS = [  # selective classification, in `hydra-ens evaluate`'s report (`report.selective_metrics`)
    Column("AURC", "id", "aurc", 100, 2),
    Column("AUGRC", "id", "augrc", 100, 2),
    Column("Risk@80%cov", "id", "risk_at_coverage", 100, 1),
    Column("Cov@5%risk", "id", "coverage_at_risk", 100, 1),
]
EVALUATE_COLUMNS = [*COLUMNS, *SELECTIVE_COLUMNS]


def over_seeds(values: Sequence[float]) -> dict[str, float]:
    """{"mean", "std" (population; 0 for one run), "runs"} of one number's values over seeds."""
    std = statistics.pstdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": std, "runs": len(values)}


def aggregate(per_seed: dict[int, dict[str, dict]]) -> dict[str, dict]:
    """Mean and standard deviation over seeds of every number of every row."""
    rows = {}
    for row in dict.fromkeys(row for seed_results in per_seed.values() for row in seed_results):
        runs = [seed_results[row] for seed_results in per_seed.values() if row in seed_results]
        values: dict[str, list[float]] = {}
        for run in runs:
            for (where, key), value in _flatten(run).items():
                values.setdefault(f"{where}.{key}" if where else key, []).append(value)
        heads = runs[0].get("heads", "-")  # a row built without it (`Built.extra` is empty by default)
        rows[row] = {"heads": heads, **{k: over_seeds(v) for k, v in values.items()}}
    return rows


def _flatten(run: dict) -> dict[tuple[str, str], float]:
    flat = {("", k): float(run[k]) for k in ("params", "flops_per_example")}
    for where in ("id", "near", "far", "all"):
        for key, value in run["metrics"].get(where, {}).items():
            flat[(where, key)] = float(value)
    return flat


def latency_over_seeds(per_seed: Mapping[int, Mapping[str, dict]]) -> dict[str, dict]:
    """The latency column of rows timed on several seeds' models ({seed: {row: `cost.predictor_latency` stats}}):
    one seed's stats as they are (median, min, max over rounds); over several, `over_seeds` of each seed's
    median."""
    if len(per_seed) == 1:
        return dict(next(iter(per_seed.values())))
    rows = dict.fromkeys(row for timed in per_seed.values() for row in timed)
    return {row: over_seeds([timed[row]["median"] for timed in per_seed.values() if row in timed]) for row in rows}


def latency_ratio(stats: Mapping[str, float]) -> float:
    """A row's latency x the first row, from `latency_over_seeds`' stats: one seed's median over rounds, or the
    mean over seeds of each seed's median."""
    return stats["median"] if "median" in stats else stats["mean"]


def conventions(score: str = "msp") -> str:
    """The tables' conventions, naming the OOD `score` they were measured with (the benchmark's: MSP)."""
    measured = (
        "maximum softmax probability of the (ensemble) prediction"
        if score == "msp"
        else f"the {score} score (docs/ood_scores.md)"
    )
    return (
        "Acc, ECE, aECE, AUROC, FPR95, AUPR in %; mean ± std over seeds (population std; a single run shows its value "
        f"alone). OOD: {measured}, OOD = positive class (OpenOOD). Ensemble "
        "probability = mean of member softmaxes. FLOPs per example relative to the first row; latency relative to "
        "the first row on one batch, timed interleaved over repeated rounds on this machine: median (min-max) over "
        "rounds for one seed's models, mean ± std of each seed's median over several."
    )


CONVENTIONS = conventions()
SELECTIVE_CONVENTIONS = (
    "Selective classification: an input is accepted when its confidence max_c p_c reaches a threshold; a failure is an "
    "accepted wrong prediction. AURC and AUGRC (%, lower is better): areas under the selective risk (errors / "
    "accepted) and the generalized risk (errors accepted / all) over coverage; Risk@80%cov: the error rate of the 80% "
    "most confident inputs; Cov@5%risk: the largest share of inputs accepted at an error rate of at most 5%. Tied "
    "confidences are accepted together (docs/selective.md)."
)


def table_lines(
    rows: Mapping[str, dict],
    latency: Mapping[str, dict] | None = None,
    columns: Sequence[Column] = COLUMNS,
    style: Literal["markdown", "text"] = "markdown",
) -> list[str]:
    """Aggregated rows (from `aggregate`) as a table: the method, its heads, `columns` (mean ± std over seeds,
    the value alone for one run), parameters (markdown only) and FLOPs relative to the first row; `latency`
    ({row: `cost.predictor_latency` stats}) adds "Latency x", the median (min-max) over interleaved rounds (or,
    from `latency_over_seeds`, the mean ± std over seeds of each seed's median).
    style="markdown" for reports, "text" for a terminal (aligned columns)."""
    first = next(iter(rows.values()))
    header = ["Method", "Heads", *(c.header for c in columns)]
    header += ["Params (M)"] if style == "markdown" else []
    header += ["FLOPs x"] + (["Latency x"] if latency else [])
    body = []
    for row, stats in rows.items():
        cells = [row, str(stats["heads"])]
        cells += [mean_std(stats.get(f"{c.where}.{c.key}"), c.scale, c.digits) for c in columns]
        cells += [f"{stats['params']['mean'] / 1e6:.2f}"] if style == "markdown" else []
        cells.append(f"{stats['flops_per_example']['mean'] / first['flops_per_example']['mean']:.2f}")
        if latency:
            cells.append(_latency_cell(latency.get(row)))
        body.append(cells)
    return render(header, body, style)


def _latency_cell(stats: Mapping[str, float] | None) -> str:
    if stats is None:
        return "–"
    return format_latency(stats) if "median" in stats else mean_std(stats, digits=2)


def render(header: Sequence[str], body: Sequence[Sequence[str]], style: Literal["markdown", "text"]) -> list[str]:
    """A table as markdown lines, or as aligned text (first column left, the others right)."""
    if style == "markdown":
        return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
            "| " + " | ".join(cells) + " |" for cells in body
        ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
        for line in [header, *body]
    ]


def mean_std(stat: Mapping[str, float] | None, scale: float = 1.0, digits: int = 1) -> str:
    """ "92.3 ± 0.4" over several runs, "92.3" for one run (no spread to show), "–" when missing."""
    if stat is None:
        return "–"
    if stat.get("runs", 2) < 2:
        return f"{stat['mean'] * scale:.{digits}f}"
    return f"{stat['mean'] * scale:.{digits}f} ± {stat['std'] * scale:.{digits}f}"


def per_set_lines(per_seed: dict[int, dict[str, dict]], sets: Sequence[str] | None = None) -> list[str]:
    """AUROC (%) per OOD set and row, mean over seeds. `sets`: the columns, in order (e.g. the near sets, then the
    far ones); by default every set measured, by name (a results file read back holds them so)."""
    first = next(iter(per_seed.values()))
    sets = list(sets) if sets else sorted(next(iter(first.values()))["metrics"]["ood"])
    lines = ["| Method | " + " | ".join(sets) + " |", "|" + "---|" * (len(sets) + 1)]
    for row in dict.fromkeys(r for results in per_seed.values() for r in results):
        means = []
        for name in sets:
            values = [r[row]["metrics"]["ood"][name]["auroc"] for r in per_seed.values() if row in r]
            means.append(f"{100 * statistics.fmean(values):.1f}")
        lines.append(f"| {row} | " + " | ".join(means) + " |")
    return lines


def conformal_lines(per_model: Mapping[str, Mapping[str, dict]], alpha: float) -> list[str]:
    """Split conformal coverage (%, mean ± std over the random splits) and mean set size per model and score, as a
    markdown table. per_model: {model: {score: `conformal.split_evaluation`'s result}}."""
    scores = list(next(iter(per_model.values())))
    header = ["Method"] + [f"{s.upper()} {what}" for s in scores for what in ("coverage", "set size")]
    body = []
    for model, by_score in per_model.items():
        cells = [model]
        for score in scores:
            stats = by_score[score]
            cells += [f"{100 * stats['coverage']:.1f} ± {100 * stats['coverage_std']:.1f}", f"{stats['set_size']:.2f}"]
        body.append(cells)
    first = next(iter(next(iter(per_model.values())).values()))
    note = (
        f"Split conformal prediction at alpha = {alpha} (target coverage {100 * (1 - alpha):.4g}%): calibrated on a "
        f"random half of the test data ({first['calibration_size']} inputs), measured on the other half, over "
        f"{first['splits']} seeded splits; coverage in % (mean ± std over the splits). Scores: THR = 1 - p_y, APS and "
        "RAPS randomised (docs/conformal.md)."
    )
    return [note, "", *render(header, body, "markdown")]
