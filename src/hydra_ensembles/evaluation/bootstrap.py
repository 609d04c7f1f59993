"""Paired bootstrap intervals of the difference between two rows of a table: is row A's NLL, ECE or all-OOD AUROC
really different from row B's, given the test sets' size and the spread over seeds?

Each resample draws S seeds with replacement from the S seeds, and N test examples with replacement from the N,
N_k examples of each OOD set k from its N_k. Paired: both rows see the same examples, so what the two rows share
(a hard test set, a lucky seed) cancels out of the difference. How the examples are drawn follows how the seeds met
them:

- one test set for every seed (the benchmark's: `labels` one tensor): seeds and examples are crossed factors, so one
  draw of the examples serves every seed of the resample (Owen, "The pigeonhole bootstrap", Ann. Appl. Stat. 2007,
  slightly conservative). Drawing them apart per seed would average a hard example's error away over the seeds and
  narrow the interval by up to sqrt(S);
- a test set per seed (`labels` one tensor per seed): seeds and examples are nested, so each seed drawn gets its own
  draw of its own examples, a seed drawn twice two draws (Davison & Hinkley, "Bootstrap Methods and their
  Application", 1997, §3.8: resample the groups, then within each group drawn).

With one seed both are the same: the interval is the test sets' sampling error alone, blind to how much a
retrained seed moves.

Metrics as the tables compute them (`report.evaluate`) from member logits (N, M, C), on the ensemble's predictive
distribution p = mean_m softmax(z_m): NLL, ECE with 15 equal-width bins, and "AUROC all", the mean over OOD sets of
the AUROC separating the test set (negative) from the set (positive) by the MSP score 1 - max_c p_c. A row's value
is the mean over seeds; the difference is A - B (NLL, ECE: below 0 when A is better; AUROC: above 0).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from ..uncertainty import ensemble_probs
from .compare import row_file
from .ood import msp

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
    """{"nll", "ece", "auroc_all"}: the difference A - B of the mean over seeds, and its percentile interval.

    Shape: `a`, `b`: one entry per seed (S >= 1, in the same order for both), each what `report.measure` saves,
    {"test": (N, M, C), "near" / "far" / "ood": {set: (N_k, M, C)}} (M may differ between the rows, N and the sets
    may not); `labels`: the test labels (N,), one tensor when every seed was scored on the same test and OOD sets
    (examples drawn once per resample for all its seeds), or one per seed when each seed has its own sets (drawn
    apart; see the module docstring). "auroc_all" only when there are OOD sets. Percentile interval: the
    (1 - level) / 2 and (1 + level) / 2 quantiles (linear interpolation) of the `resamples` differences. Seeded by
    `seed`: the same arguments give the same interval. One seed: only its examples are resampled (the caller knows
    from len(a), and should say so).
    References: Owen, 2007 (crossed factors); Davison & Hinkley, 1997, §3.8 (nested) and §5.2 (percentile
    intervals).
    """
    if len(a) != len(b):
        raise ValueError(f"the rows must be given the same seeds, got {len(a)} and {len(b)} runs.")
    if not a:
        raise ValueError("no runs to compare: give each row's logits on at least one seed.")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"resamples must be >= 1 and level in (0, 1), got {resamples} and {level}.")
    shared = isinstance(labels, Tensor)  # one test set for every seed: crossed, else nested
    labels = [labels] * len(a) if shared else list(labels)
    if len(labels) != len(a):
        raise ValueError(f"labels must be one tensor, or one per seed ({len(a)}), got {len(labels)}.")
    pairs = [(_Terms.of(x, y, bins), _Terms.of(z, y, bins)) for x, z, y in zip(a, b, labels)]
    for s, (first, second) in enumerate(pairs):
        _check_paired(first, second, s)
    point = _seed_mean([_differences(*pair, *_identity(pair[0])) for pair in pairs])
    if shared:
        _check_shared(pairs)
    drawn = (_crossed if shared else _nested)(pairs, resamples, seed)
    quantiles = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    return {
        metric: Interval(point[metric], *torch.quantile(values, quantiles).tolist()) for metric, values in drawn.items()
    }


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
        labels = labels.long().to(probs.device)
        true_class = probs.gather(1, labels[:, None]).squeeze(1)
        confidence, prediction = probs.max(dim=1)
        sets = {name: scores for group in ("near", "far", "ood") for name, scores in logits.get(group, {}).items()}
        small = [name for name, scores in sets.items() if len(scores) < 2]
        if small:
            raise ValueError(f"OOD set(s) {small} have fewer than 2 examples: too few to resample.")
        return cls(
            nll=-torch.log(true_class.clamp_min(torch.finfo(torch.float64).eps)),
            gap=(prediction == labels).double() - confidence,
            bin=(confidence * bins).long().clamp(max=bins - 1),
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


def _seed_mean(per_seed: Sequence[Mapping[str, Tensor]]) -> dict[str, float]:
    return {metric: torch.stack([d[metric] for d in per_seed]).mean().item() for metric in per_seed[0]}


def _crossed(pairs: Sequence[tuple[_Terms, _Terms]], resamples: int, seed: int) -> dict[str, Tensor]:
    """{metric: (resamples,)} the mean over the S seeds drawn of each drawn seed's difference, every seed of a
    resample on the same drawn examples (the seeds share one test set). One generator, seeds drawn first, as
    `_nested`: with one seed the two draw the same examples."""
    runs, first = len(pairs), pairs[0][0]
    generator = torch.Generator().manual_seed(seed)
    drawn_seeds = torch.randint(runs, (resamples, runs), generator=generator)  # (R, S): which seed fills each slot
    times = torch.stack([(drawn_seeds == s).sum(dim=1) for s in range(runs)], dim=1).double()  # (R, S) draws of s
    widest = max([len(first.nll), *(v.shape[1] for v in first.ood_rank.values())])
    said: dict[str, list[Tensor]] = {}
    for rows in torch.arange(resamples).split(max(1, CHUNK_ELEMENTS // widest)):
        test = torch.randint(len(first.nll), (len(rows), len(first.nll)), generator=generator)
        ood = {
            k: torch.randint(v.shape[1], (len(rows), v.shape[1]), generator=generator)
            for k, v in first.ood_rank.items()
        }
        per_seed = [_differences(*pair, test, ood) for pair in pairs]  # S x {metric: (R_c,)}
        for metric in per_seed[0]:
            differences = torch.stack([d[metric] for d in per_seed], dim=1)  # (R_c, S)
            said.setdefault(metric, []).append((differences * times[rows]).sum(dim=1) / runs)
    return {metric: torch.cat(parts) for metric, parts in said.items()}


def _nested(pairs: Sequence[tuple[_Terms, _Terms]], resamples: int, seed: int) -> dict[str, Tensor]:
    """{metric: (resamples,)} the mean over the S seeds drawn of each drawn seed's difference on its own drawn
    examples (each seed has its own test set)."""
    runs, generator = len(pairs), torch.Generator().manual_seed(seed)
    drawn_seeds = torch.randint(runs, (resamples, runs), generator=generator)  # (R, S): which seed fills each slot
    slots: dict[str, Tensor] = {}
    for s, (first, second) in enumerate(pairs):
        where = (drawn_seeds == s).nonzero()  # (n_s, 2): the (resample, slot) pairs this seed fills
        widest = max([len(first.nll), *(v.shape[1] for v in first.ood_rank.values())])
        for chunk in where.split(max(1, CHUNK_ELEMENTS // widest)):
            test = torch.randint(len(first.nll), (len(chunk), len(first.nll)), generator=generator)
            ood = {
                k: torch.randint(v.shape[1], (len(chunk), v.shape[1]), generator=generator)
                for k, v in first.ood_rank.items()
            }
            for metric, values in _differences(first, second, test, ood).items():
                slots.setdefault(metric, torch.zeros(resamples, runs, dtype=torch.float64))
                slots[metric][chunk[:, 0], chunk[:, 1]] = values
    return {metric: values.mean(dim=1) for metric, values in slots.items()}


def row_differences(
    seed_dirs: Mapping[int, str | os.PathLike],
    labels: Tensor | Sequence[Tensor],
    pairs: Sequence[tuple[str, str]],
    logits: str = "logits",
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    other_dirs: Mapping[int, str | os.PathLike] | None = None,
) -> dict:
    """The paired bootstrap of each (row A, row B) of `pairs` whose logits every seed directory holds
    (`{seed: dir}`, `<dir>/<logits>/<row>.pt` as `compare` saves them; row B's from `other_dirs` when given: one
    row of two runs tested on the same data, e.g. two steps of an ablation), as a results file keeps it:
    {"resamples": R, "level": level, "seeds": [seed, ...], "pairs": [{"rows": [A, B], metric: {"point", "low",
    "high"}}]}, A - B in the metrics' own units (fractions, nats). {} when no pair has logits on every seed: tables
    recorded before their logits were kept render as they were. `labels`: as `paired_bootstrap`, in `seed_dirs`'
    order."""
    said, shared = [], isinstance(labels, Tensor)
    for first, second in pairs:
        second_dirs = list((other_dirs or seed_dirs).values())
        paths = [
            (row_file(Path(d) / logits, first), row_file(Path(e) / logits, second))
            for d, e in zip(seed_dirs.values(), second_dirs, strict=True)
        ]
        if not all(x.exists() and y.exists() for x, y in paths):
            continue
        loaded = [(torch.load(x), torch.load(y)) for x, y in paths]
        intervals = paired_bootstrap([x for x, _ in loaded], [y for _, y in loaded], labels, resamples, seed, level)
        said.append({"rows": [first, second]} | {metric: i._asdict() for metric, i in intervals.items()})
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
    level, resamples = 100 * differences["level"], differences["resamples"]
    if len(differences["seeds"]) == 1:
        drawn = "one seed: test examples resampled only, so retraining's spread is not in it"
    elif differences.get("examples") == "per seed":
        drawn = "seeds resampled, then each seed's own test examples"
    else:
        drawn = "seeds and test examples resampled, one draw of the examples for every seed: they share the test sets"
    said = (
        f"Differences, paired bootstrap {level:g} % interval ({drawn}; {resamples} resamples). A vs B: A - B in the "
        "table's units (NLL and ECE below 0, AUROC above 0 favour A); better / worse: the interval excludes 0 on "
        "A's good / bad side; not separated: it includes 0. Each interval is for its own comparison, not corrected "
        f"for the many made: of equal rows, about 1 comparison in {round(100 / (100 - level))} reads better or "
        "worse by chance."
    )
    lines = [
        f"- {pair['rows'][0]} vs {pair['rows'][1]}: "
        + "; ".join(_said(metric, Interval(**pair[metric])) for metric in SAID if metric in pair)
        for pair in differences["pairs"]
    ]
    return [said, "", *lines]


def _said(metric: str, interval: Interval) -> str:
    name, scale, digits, unit = SAID[metric]
    point, low, high = (f"{scale * value:.{digits}f}" for value in interval)
    return f"{name} {point} [{low}, {high}]{unit}, {verdict(metric, interval)}"


def verdict(metric: str, interval: Interval) -> str:
    """Better / worse when the interval of A - B excludes 0 on A's good / bad side, else not separated."""
    low, high = sorted(GOOD_SIGN[metric] * value for value in (interval.low, interval.high))
    return "better" if low > 0 else "worse" if high < 0 else "not separated"
