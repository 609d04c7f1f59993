"""Paired bootstrap intervals of the difference between two rows of a table: is row A's NLL, ECE or all-OOD AUROC
really different from row B's, given the test sets' size and the spread over seeds?

Paired: both rows see the same resampled examples, so what the two rows share (a hard test set, a lucky seed)
cancels out of the difference. Each resample draws N test examples with replacement from the N, and N_k examples of
each OOD set k from its N_k, for every seed; how they are drawn follows how the seeds met them:

- one test set for every seed (the benchmark's: `labels` one tensor): seeds and examples are crossed factors, so one
  draw of the examples serves every seed of the resample. Drawing them apart per seed would average a hard
  example's error away over the seeds and narrow the interval by up to sqrt(S);
- a test set per seed (`labels` one tensor per seed): seeds and examples are nested, so each seed gets its own
  draw of its own examples.

One seed: the percentile interval of the resampled differences, the test sets' sampling error alone, blind to how
much a retrained seed moves. Several seeds: the seeds are few (3 in the benchmark), too few to resample: drawing 3
seeds from 3 gives the seed mean 10 values, and the percentile interval is about [lowest seed, highest seed], which
misses 0 for equal rows whenever the three seeds lean the same way (1 time in 4). Instead the two sources of error
are added: the examples' (the variance of the resampled seed-mean difference, every seed kept) and the seeds'
(the sample variance of the S seeds' differences over S), and the interval is Student's t with Welch-Satterthwaite
degrees of freedom (the examples' part counted as known): S - 1 degrees of freedom when the seeds' part
dominates, more as the examples' part grows, so 3 seeds give wide intervals, honestly. The seeds' variance holds
part of the examples' again (what each seed's draw does not share), so the interval leans wide.

Metrics as the tables compute them (`report.evaluate`) from member logits (N, M, C), on the ensemble's predictive
distribution p = mean_m softmax(z_m): NLL, ECE with 15 equal-width bins, and "AUROC all", the mean over OOD sets of
the AUROC separating the test set (negative) from the set (positive) by the MSP score 1 - max_c p_c. The OOD
draws are stratified (each set drawn at its own size, the test set at its), so no resample lacks a class. A row's
value is the mean over seeds; the difference is A - B (NLL, ECE: below 0 when A is better; AUROC: above 0).
References: Efron & Tibshirani, "An Introduction to the Bootstrap", 1993, §13 (percentile intervals); Welch, 1947,
and Satterthwaite, 1946 (the degrees of freedom of a sum of variance estimates).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..metrics._checks import check_probs, check_scores
from ..metrics.ece import bin_index
from ..metrics.nll import example_nll
from ..uncertainty import ensemble_probs
from .compare import row_file
from .ood import msp
from .report import ood_sets

SAID = {"nll": ("NLL", 1.0, 3, ""), "ece": ("ECE", 100.0, 1, " %"), "auroc_all": ("AUROC all", 100.0, 1, " %")}
GOOD_SIGN = {"nll": -1.0, "ece": -1.0, "auroc_all": 1.0}  # the sign of A - B when A is better
CHUNK_ELEMENTS = 1 << 22  # resampled indices held at once (32 MiB of int64): memory stays flat in N and resamples


class Interval(NamedTuple):
    """The difference measured on the data as it is (`point`) and its bootstrap interval [`low`, `high`]."""

    point: float
    low: float
    high: float


def paired_bootstrap(
    a: Sequence[Mapping],
    b: Sequence[Mapping],
    labels: Tensor | Sequence[Tensor],
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    bins: int = 15,
) -> dict[str, Interval]:
    """{"nll", "ece", "auroc_all"}: the difference A - B of the mean over seeds, and its interval.

    Shape: `a`, `b`: one entry per seed (S >= 1, in the same order for both), each what `report.measure` saves,
    {"test": (N, M, C), "near" / "far" / "ood": {set: (N_k, M, C)}} (M may differ between the rows, N and the sets
    may not); `labels`: the test labels (N,), one tensor when every seed was scored on the same test and OOD sets
    (examples drawn once per resample for all its seeds), or one per seed when each seed has its own sets (drawn
    apart; see the module docstring). "auroc_all" only when there are OOD sets. One seed: the percentile interval,
    the (1 - level) / 2 and (1 + level) / 2 quantiles (linear interpolation) of the `resamples` differences;
    several: Student's t interval around the point with the examples' and the seeds' variances (module docstring).
    Seeded by `seed`: the same arguments give the same interval.
    """
    if len(a) != len(b):
        raise ValueError(f"the rows must be given the same seeds, got {len(a)} and {len(b)} runs.")
    if not a:
        raise ValueError("no runs to compare: give each row's logits on at least one seed.")
    if resamples < 2 or not 0 < level < 1:
        raise ValueError(f"resamples must be >= 2 and level in (0, 1), got {resamples} and {level}.")
    shared = isinstance(labels, Tensor)  # one test set for every seed: crossed, else nested
    labels = [labels] * len(a) if shared else list(labels)
    if len(labels) != len(a):
        raise ValueError(f"labels must be one tensor, or one per seed ({len(a)}), got {len(labels)}.")
    pairs = [(_Terms.of(x, y, bins), _Terms.of(z, y, bins)) for x, z, y in zip(a, b, labels)]
    for s, (first, second) in enumerate(pairs):
        _check_paired(first, second, s)
    per_seed = [_differences(*pair, *_identity(pair[0])) for pair in pairs]  # S x {metric: (1,)}
    if shared:
        _check_shared(pairs)
    drawn = (_crossed if shared else _nested)(pairs, resamples, seed)  # {metric: (R, S)}
    intervals = {}
    for metric, values in drawn.items():
        points = torch.cat([d[metric] for d in per_seed])  # (S,) each seed's difference on its data as it is
        intervals[metric] = (_percentile if len(pairs) == 1 else _t_interval)(points, values, level)
    return intervals


def _percentile(points: Tensor, drawn: Tensor, level: float) -> Interval:
    """One seed: its difference and the percentile interval of its `drawn` (R, 1) resampled differences."""
    quantiles = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    return Interval(points.mean().item(), *torch.quantile(drawn[:, 0], quantiles).tolist())


def _t_interval(points: Tensor, drawn: Tensor, level: float) -> Interval:
    """Several seeds: mean +- t * sqrt(v_examples + v_seeds), from the seeds' differences `points` (S,) and the
    resampled ones `drawn` (R, S); v_examples: the variance of the resampled seed means, v_seeds: the seeds'
    sample variance / S; t: Student's quantile at Welch-Satterthwaite's degrees of freedom, v_seeds' S - 1 and
    v_examples' as known (infinite)."""
    runs, point = len(points), points.mean().item()
    v_examples, v_seeds = drawn.mean(dim=1).var().item(), points.var().item() / runs
    # as a ratio: seeds that differ only by float noise (v_seeds ~ 1e-34) give a huge df (the normal), not 0 / 0
    df = math.inf if v_seeds == 0 else (runs - 1) * (1 + v_examples / v_seeds) ** 2
    half = t_quantile((1 + level) / 2, df) * math.sqrt(v_examples + v_seeds)
    return Interval(point, point - half, point + half)


def t_quantile(p: float, df: float) -> float:
    """Student's t distribution's p-quantile, p in [0.5, 1), df >= 1 (math.inf: the normal's). With x = sqrt(df)
    tan(theta), F(x) = 1/2 + Gamma((df + 1) / 2) / (sqrt(pi) Gamma(df / 2)) * integral_0^theta cos(u)^(df - 1) du,
    a bounded integrand on a bounded range: Simpson's rule (2,000 intervals) and bisection on theta in [0, pi/2).
    Within 2e-6 relative of scipy.stats.t.ppf for p up to 0.9999 and df from 1 to 1e6 (5e-4 at p = 1 - 1e-5 and
    df 1.5, where cos^(df - 1) has a root-like edge at pi/2). Above 1e6 degrees of freedom, the normal's (within
    1e-6 of t's there; the grid could not resolve cos^(df - 1) much beyond)."""
    if not 0.5 <= p < 1 or not df >= 1:
        raise ValueError(f"t_quantile needs p in [0.5, 1) and df >= 1, got p={p} and df={df}.")
    if df > 1e6:
        return statistics.NormalDist().inv_cdf(p)
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    weights = np.ones(2001)
    weights[1:-1:2], weights[2:-1:2] = 4, 2

    def cdf(theta: float) -> float:
        grid = np.linspace(0.0, theta, 2001)
        return 0.5 + scale * theta / 6000 * float(weights @ np.cos(grid) ** (df - 1))

    low, high = 0.0, math.pi / 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < p else (low, middle)
    return math.sqrt(df) * math.tan((low + high) / 2)


@dataclass
class _Terms:
    """One row on one seed, reduced to what each metric needs per example (float64)."""

    nll: Tensor  # (N,) -log p_{i, y_i}, clamped as `metrics.nll`
    gap: Tensor  # (N,) correct_i - confidence_i
    bin: Tensor  # (N,) ECE bin of confidence_i, as `metrics.ece`
    bins: int
    id_order: Tensor  # (N,) the test examples by MSP score, ascending
    ood_rank: dict[str, Tensor]  # {set: (2, N_k)} how many test MSP scores are < and <= each OOD example's

    @classmethod
    def of(cls, logits: Mapping, labels: Tensor, bins: int) -> _Terms:
        test = logits["test"]
        if len(test) < 2 or len(labels) != len(test):
            raise ValueError(
                f"the test set needs at least 2 examples, each with a label, to resample: got {len(test)} "
                f"examples and {len(labels)} labels."
            )
        probs = ensemble_probs(test.double())  # (N, C)
        check_probs(probs, labels, "paired_bootstrap")  # before .long(): float labels are refused, not truncated
        labels = labels.long().to(probs.device)
        true_class = probs.gather(1, labels[:, None]).squeeze(1)
        confidence, prediction = probs.max(dim=1)
        sets = ood_sets(*(logits.get(group) for group in ("near", "far", "ood")))
        small = [name for name, scores in sets.items() if len(scores) < 2]
        if small:
            raise ValueError(f"OOD set(s) {small} have fewer than 2 examples: too few to resample.")
        for scores in sets.values():
            check_scores(msp(scores).numpy(), "paired_bootstrap")
        return cls(
            nll=example_nll(true_class),
            gap=(prediction == labels).double() - confidence,
            bin=bin_index(confidence, bins),
            bins=bins,
            id_order=msp(test).argsort(),
            ood_rank={name: _ranks(msp(test), msp(scores)) for name, scores in sets.items()},
        )

    def metrics(self, test: Tensor, ood: Mapping[str, Tensor], counts: Tensor) -> dict[str, Tensor]:
        """Each metric on R resamples: `test` (R, N) and `ood` {set: (R, N_k)} indices, `counts` (R, N) how often
        each test example was drawn. -> {metric: (R,)}."""
        gap = torch.zeros(len(test), self.bins, dtype=torch.float64).scatter_add_(1, self.bin[test], self.gap[test])
        said = {"nll": self.nll[test].mean(dim=1), "ece": gap.abs().sum(dim=1) / test.shape[1]}
        if self.ood_rank:
            cumulative = torch.nn.functional.pad(counts[:, self.id_order].cumsum(dim=1), (1, 0))  # (R, N + 1)
            per_set = [_auroc(cumulative, self.ood_rank[name], drawn) for name, drawn in ood.items()]
            said["auroc_all"] = torch.stack(per_set).mean(dim=0)
        return said


def _ranks(id_score: Tensor, ood_score: Tensor) -> Tensor:
    """(2, N_k): for each OOD score t_j, #{i: s_i < t_j} and #{i: s_i <= t_j} among the N test scores."""
    ordered = id_score.sort().values
    return torch.stack([torch.searchsorted(ordered, ood_score, right=right) for right in (False, True)])


def _auroc(cumulative: Tensor, rank: Tensor, ood: Tensor) -> Tensor:
    """AUROC (OOD positive, ties one half) of R resamples, from `cumulative` (R, N + 1), the test examples' draw
    counts summed in order of their scores (from 0), `rank` (`_ranks`) and `ood` (R, N_k) the OOD examples drawn.

    AUROC = (1 / (N N_k)) sum_j [#{i: s_i < t_j} + #{i: s_i = t_j} / 2] = sum_j [less_j + at_most_j] / (2 N N_k),
    counting the drawn test examples (with repeats) against each drawn OOD example t_j.
    """
    less, at_most = cumulative.gather(1, rank[0][ood]), cumulative.gather(1, rank[1][ood])  # (R, N_k)
    return (less + at_most).sum(dim=1) / (2.0 * (cumulative.shape[1] - 1) * ood.shape[1])


def _check_paired(first: _Terms, second: _Terms, seed: int) -> None:
    if len(first.nll) != len(second.nll) or list(first.ood_rank) != list(second.ood_rank):
        raise ValueError(
            f"run {seed}: the rows were measured on different data ({len(first.nll)} and {len(second.nll)} test "
            f"examples, OOD sets {list(first.ood_rank)} and {list(second.ood_rank)}): pair runs of the same task."
        )
    for name, rank in first.ood_rank.items():
        if rank.shape != second.ood_rank[name].shape:
            raise ValueError(
                f"run {seed}: the OOD set {name!r} has {rank.shape[1]} and {second.ood_rank[name].shape[1]} "
                "examples in the two rows: pair runs of the same task."
            )


def _check_shared(pairs: Sequence[tuple[_Terms, _Terms]]) -> None:
    """One labels tensor says every seed was scored on the same sets: their sizes must agree across seeds."""
    sizes = [(len(first.nll), {k: v.shape[1] for k, v in first.ood_rank.items()}) for first, _ in pairs]
    for s, size in enumerate(sizes[1:], start=1):
        if size != sizes[0]:
            raise ValueError(
                f"one labels tensor says the seeds share their test and OOD sets, but run {s} has {size[0]} test "
                f"examples and OOD sets {size[1]} where run 0 has {sizes[0][0]} and {sizes[0][1]}: pass one labels "
                "tensor per seed when each seed has its own sets."
            )


def _identity(terms: _Terms) -> tuple[Tensor, dict[str, Tensor]]:
    """The data as it is: one 'resample' holding every example once."""
    return torch.arange(len(terms.nll))[None], {k: torch.arange(v.shape[1])[None] for k, v in terms.ood_rank.items()}


def _differences(first: _Terms, second: _Terms, test: Tensor, ood: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A - B of each metric on the same resamples: test (R, N), ood {set: (R, N_k)} -> {metric: (R,)}."""
    counts = torch.zeros(test.shape, dtype=torch.float64)
    counts.scatter_add_(1, test, torch.ones_like(counts))  # (R, N) draws of each test example
    mine, theirs = first.metrics(test, ood, counts), second.metrics(test, ood, counts)
    return {metric: mine[metric] - theirs[metric] for metric in mine}


def _generator(seed: int, resamples: int, runs: int) -> torch.Generator:
    """The draws' generator, seeded by `seed`, past the (resamples, runs) seed draws the intervals made when seeds
    were resampled: a one-seed interval draws the same examples as then (its committed tables stand)."""
    generator = torch.Generator().manual_seed(seed)
    torch.randint(runs, (resamples, runs), generator=generator)
    return generator


def _crossed(pairs: Sequence[tuple[_Terms, _Terms]], resamples: int, seed: int) -> dict[str, Tensor]:
    """{metric: (resamples, S)} each seed's difference, every seed of a resample on the same drawn examples (the
    seeds share one test set)."""
    first, generator = pairs[0][0], _generator(seed, resamples, len(pairs))
    said: dict[str, list[Tensor]] = {}
    for test, ood in _draws(first, resamples, generator):
        per_seed = [_differences(*pair, test, ood) for pair in pairs]  # S x {metric: (R_c,)}
        for metric in per_seed[0]:
            said.setdefault(metric, []).append(torch.stack([d[metric] for d in per_seed], dim=1))
    return {metric: torch.cat(parts) for metric, parts in said.items()}


def _nested(pairs: Sequence[tuple[_Terms, _Terms]], resamples: int, seed: int) -> dict[str, Tensor]:
    """{metric: (resamples, S)} each seed's difference on its own drawn examples (each seed has its own test
    set)."""
    runs, generator = len(pairs), _generator(seed, resamples, len(pairs))
    said: dict[str, Tensor] = {}
    for s, (first, second) in enumerate(pairs):
        start = 0
        for test, ood in _draws(first, resamples, generator):
            rows = slice(start, start + len(test))
            for metric, values in _differences(first, second, test, ood).items():
                said.setdefault(metric, torch.zeros(resamples, runs, dtype=torch.float64))[rows, s] = values
            start += len(test)
    return said


def _draws(terms: _Terms, resamples: int, generator: torch.Generator):
    """The `resamples` draws of `terms`' test examples (R_c, N) and of each OOD set's ({set: (R_c, N_k)}), in
    chunks of R_c resamples that keep the indices held at once under `CHUNK_ELEMENTS`."""
    widest = max([len(terms.nll), *(v.shape[1] for v in terms.ood_rank.values())])
    for rows in torch.arange(resamples).split(max(1, CHUNK_ELEMENTS // widest)):
        test = torch.randint(len(terms.nll), (len(rows), len(terms.nll)), generator=generator)
        ood = {
            k: torch.randint(v.shape[1], (len(rows), v.shape[1]), generator=generator)
            for k, v in terms.ood_rank.items()
        }
        yield test, ood


def row_differences(
    seed_dirs: Mapping[int, str | os.PathLike],
    labels: Tensor | Sequence[Tensor],
    pairs: Sequence[tuple[str, str]],
    logits: str = "logits",
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    other_dirs: Mapping[int, str | os.PathLike] | None = None,
    stand_ins: Mapping[tuple[str, str], Mapping[int, tuple[str, str]]] | None = None,
) -> dict:
    """The paired bootstrap of each (row A, row B) of `pairs` whose logits every seed directory holds
    (`{seed: dir}`, `<dir>/<logits>/<row>.pt` as `compare` saves them; row B's from `other_dirs` when given: one
    row of two runs tested on the same data, e.g. two steps of an ablation), as a results file keeps it:
    {"resamples": R, "level": level, "seeds": [seed, ...], "pairs": [{"rows": [A, B], metric: {"point", "low",
    "high"}}]}, A - B in the metrics' own units (fractions, nats). {} when no pair has logits on every seed: tables
    recorded before their logits were kept render as they were. `labels`: as `paired_bootstrap`, in `seed_dirs`'
    order. `stand_ins`: {(A, B): {seed: (A's logits, B's logits)}}, the rows' files of a seed read instead of A's
    and B's own (e.g. the build of a model that the other row was made from), kept in the pair's "stand_ins"."""
    said, shared, other_dirs = [], isinstance(labels, Tensor), other_dirs or seed_dirs
    stand_ins = stand_ins or {}
    if set(other_dirs) != set(seed_dirs):
        raise ValueError(f"other_dirs must hold the seeds of seed_dirs, {list(seed_dirs)}, got {list(other_dirs)}.")
    for first, second in pairs:
        read = {s: tuple(stand_ins.get((first, second), {}).get(s, (first, second))) for s in seed_dirs}
        paths = [
            (row_file(Path(seed_dirs[s]) / logits, a), row_file(Path(other_dirs[s]) / logits, b))
            for s, (a, b) in read.items()
        ]
        if not all(x.exists() and y.exists() for x, y in paths):
            continue
        loaded = [(torch.load(x), torch.load(y)) for x, y in paths]
        intervals = paired_bootstrap([x for x, _ in loaded], [y for _, y in loaded], labels, resamples, seed, level)
        read_instead = {str(s): list(files) for s, files in read.items() if files != (first, second)}
        said.append(
            {"rows": [first, second]}
            | ({"stand_ins": read_instead} if read_instead else {})
            | {metric: i._asdict() for metric, i in intervals.items()}
        )
    examples = "shared" if shared else "per seed"
    return (
        {"resamples": resamples, "level": level, "seeds": list(seed_dirs), "examples": examples, "pairs": said}
        if said
        else {}
    )


def difference_lines(differences: Mapping) -> list[str]:
    """`row_differences` as markdown: what was resampled, then one line per pair, "- A vs B: NLL -0.012 [-0.020,
    -0.004], better; ECE -0.3 [-0.5, -0.1] %, better; AUROC all 1.2 [-0.4, 2.0] %, not separated", A - B in the
    tables' units with its interval and what the interval says of A against B."""
    level, resamples, seeds = 100 * differences["level"], differences["resamples"], len(differences["seeds"])
    if seeds == 1:
        kind, drawn = "paired bootstrap", "one seed: test examples resampled only, so retraining's spread is not in it"
    else:
        examples = "each seed's own" if differences.get("examples") == "per seed" else "one draw for every seed"
        kind = "Student's t"
        drawn = (
            f"the test examples' bootstrap variance ({examples}, paired) plus the {seeds} seeds' variance / {seeds}, "
            "Welch-Satterthwaite degrees of freedom: few seeds, wide intervals"
        )
    said = (
        f"Differences, {kind} {level:g} % interval ({drawn}; {resamples} resamples). A vs B: A - B in the "
        "table's units (NLL and ECE below 0, AUROC above 0 favour A); better / worse: the interval excludes 0 on "
        "A's good / bad side; not separated: it includes 0. Each interval is for its own comparison, not corrected "
        f"for the many made: of equal rows, about 1 comparison in {round(100 / (100 - level))} reads better or "
        "worse by chance."
    )
    if any("stand_ins" in pair or "builds_apart" in pair for pair in differences["pairs"]):
        said += (
            " Where a seed's two rows were made from different builds of its model (trained again elsewhere: the "
            "notes), \"X as B\" says that seed's row B was read from X, B's build that row A was made from; "
            '"different builds" names the seeds where no such file was kept: their difference holds the builds\' too.'
        )
    lines = [
        f"- {pair['rows'][0]} vs {pair['rows'][1]}{_builds(pair)}: "
        + "; ".join(_said(metric, Interval(**pair[metric])) for metric in SAID if metric in pair)
        for pair in differences["pairs"]
    ]
    return [said, "", *lines]


def _builds(pair: Mapping) -> str:
    """ " (seed 1: Single, trained again as Single; different builds: seed 0)", or "" where every seed's two rows
    share a build."""
    read = [
        f"seed {seed}: " + ", ".join(f"{x} as {row}" for x, row in zip(files, pair["rows"]) if x != row)
        for seed, files in pair.get("stand_ins", {}).items()
    ]
    apart = pair.get("builds_apart", [])
    read += [f"different builds: seed{'s' * (len(apart) > 1)} {', '.join(map(str, apart))}"] if apart else []
    return f" ({'; '.join(read)})" if read else ""


def _said(metric: str, interval: Interval) -> str:
    """ "NLL -0.012 [-0.020, -0.004], better": an interval end that excludes 0 is never printed as 0 (rounded
    away from it, one more digit at a time) so that the line reads as its verdict."""
    name, scale, digits, unit = SAID[metric]
    point = f"{scale * interval.point:.{digits}f}"
    point = point.removeprefix("-") if float(point) == 0 else point  # "-0.0" read as a direction it does not have
    low, high = (_away_from_zero(scale * value, digits) for value in (interval.low, interval.high))
    return f"{name} {point} [{low}, {high}]{unit}, {verdict(metric, interval)}"


def _away_from_zero(value: float, digits: int) -> str:
    """`value` to `digits` decimals, or more while a nonzero value would print as 0 (at most 6)."""
    said = f"{value:.{digits}f}"
    while value != 0 and float(said) == 0 and digits < 6:
        digits += 1
        said = f"{value:.{digits}f}"
    return said


def verdict(metric: str, interval: Interval) -> str:
    """Better / worse when the interval of A - B excludes 0 on A's good / bad side, else not separated."""
    low, high = sorted(GOOD_SIGN[metric] * value for value in (interval.low, interval.high))
    return "better" if low > 0 else "worse" if high < 0 else "not separated"
