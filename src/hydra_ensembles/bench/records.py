"""Records: the small files a benchmark leaves in its cache, everything but trained weights.

A seed's cache directory holds two kinds of file. Weights (under `models/` and `checkpoints/`, hundreds of MB a
model at BERT-base scale) can be rebuilt by training again. Records cannot be rebuilt cheaply and are small:
each finished row's metrics (`results.json`) and logits, the sequential Taylor scores, the circuits (finished,
and a search in progress), AMP's neuron scores and results, the timed latency, the digest of every model
built, and the epochs of the models trained one by one (`training.json`: the single model, the deep ensemble's
members and Hydra's fine-tuned members; each epoch's loss and validation metrics and the epoch kept). A table is
rendered from records alone.

Kept in a directory that outlives the machine (`hydra-ens bench ... --records DIR`, e.g. committed next to the
tables), records let a long benchmark go on from a fresh machine: finished rows are not rerun, circuits and
scores are not searched again, and only the weights that unfinished rows need are trained again. Whether training
again gives the same weights depends on the machine type, torch version and thread count, so every model built or
loaded is checked against the digest recorded when it was first built (`check_digest`): a rebuild that differs
says so instead of mixing two models' numbers silently; a single model rebuilt so is measured as the row it stands
for, once, so that the table says how far apart the two builds measure (`record_measured_apart`). Rows recorded
before digests existed are checked by the metrics of the row the model stands for instead (`check_by_metrics`).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from torch import nn

from ..cost import machine
from ..io import read_json_record, replacing, weights_digest, write_json_atomic

WEIGHTS = frozenset({"models", "checkpoints"})  # cache folders whose files are trained weights, never records
DIGESTS = "model_digests.json"  # {model name: digest of its weights}, in the folder that holds `models/`
REBUILT = "rebuilt.json"  # {model name: how its rebuild measured against its recorded row}, beside DIGESTS


def is_record(relative: Path) -> bool:
    """Whether the cache file at `relative` (to a cache root) is a record: not under a weights folder, and not a
    temporary file of an atomic write (a name starting with '.')."""
    return not WEIGHTS.intersection(relative.parts[:-1]) and not any(p.startswith(".") for p in relative.parts)


def copy_records(source: str | os.PathLike, target: str | os.PathLike, overwrite: bool) -> list[Path]:
    """Copy every record under `source` to the same relative path under `target`, each file atomically. A file
    `target` already holds is kept unless `overwrite`; a JSON object in both (results.json: one key per row) is
    merged, so rows finished on either side are kept and the side that wins decides only the shared keys.
    Returns the relative paths written (a file is written only when it changes). A missing `source` copies
    nothing."""
    source, target = Path(source), Path(target)
    if not source.is_dir():
        return []
    written = []
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if not path.is_file() or not is_record(relative):
            continue
        destination = target / relative
        try:
            content = path.read_bytes()
        except FileNotFoundError:  # moved aside while copying (a stale search state, a renamed logits file)
            continue
        if destination.exists():
            content = _merged(content, destination.read_bytes(), overwrite, relative.name)
            if content == destination.read_bytes():
                continue
        with replacing(destination) as tmp:
            tmp.write_bytes(content)
        written.append(relative)
    return written


def _merged(new: bytes, old: bytes, overwrite: bool, name: str) -> bytes:
    """What the record file `name` becomes when `new` is copied onto `old`. Two JSON objects: for the state of a
    search in progress (a "removed" list) of the same model, the one further on; otherwise their union, the
    winner's value (`new` if `overwrite`, else `old`) on shared keys, except that two digest files (DIGESTS)
    that disagree on a model keep the loser's digest as "<model>, rebuilt": the merged rows were measured on two
    builds, and the tables must say so (`rebuilt_notes`). Anything else: the winner."""
    winner, loser = (new, old) if overwrite else (old, new)
    try:
        winner_data, loser_data = json.loads(winner), json.loads(loser)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return winner
    if not isinstance(winner_data, dict) or not isinstance(loser_data, dict):
        return winner
    if "removed" in winner_data and "removed" in loser_data:
        same_model = winner_data.get("model") == loser_data.get("model")
        return loser if same_model and len(loser_data["removed"]) > len(winner_data["removed"]) else winner
    if name == DIGESTS:
        merged = loser_data | winner_data | _conflicts(winner_data, loser_data)
        return json.dumps(merged, indent=2, sort_keys=True).encode()
    if loser_data.keys() <= winner_data.keys():
        return winner
    return json.dumps(loser_data | winner_data, indent=2, sort_keys=True).encode()


def _conflicts(winner: Mapping[str, str], loser: Mapping[str, str]) -> dict[str, str]:
    """{"<model>, rebuilt": the loser's digest} for every model whose two recorded digests differ (and that does
    not record a rebuild already), warning: two machines built it differently and both measured rows."""
    differ = {
        name: digest
        for name, digest in loser.items()
        if not name.endswith(", rebuilt") and digest not in (winner.get(name, digest), winner.get(f"{name}, rebuilt"))
    }
    if differ:
        warnings.warn(
            f"two records of the same seed hold different weights for {', '.join(sorted(differ))}: their rows were "
            "measured on two builds (merged; the table says so).",
            stacklevel=4,  # copy_records' caller
        )
    return {f"{name}, rebuilt": digest for name, digest in differ.items() if f"{name}, rebuilt" not in winner}


def _digests(folder: str | os.PathLike) -> dict[str, str]:
    return read_json_record(Path(folder) / DIGESTS)


def _rebuilt(folder: Path) -> dict[str, dict]:
    return read_json_record(folder / REBUILT)


def check_digest(folder: str | os.PathLike, name: str, model: nn.Module) -> bool:
    """Compare the weights of the model `name` (built, or loaded from the cache) with the digest recorded in
    `folder`'s digest file, or record it when there is none. A different digest (a record from another machine,
    torch version or thread count, which trains differently) warns, saying what it means; the first digest is
    kept and the new one recorded as "<name>, rebuilt" (`rebuilt_differently`). Returns whether the model
    matches the record (True when there was none)."""
    path, digests = Path(folder) / DIGESTS, _digests(folder)
    digest, recorded = weights_digest(model), digests.get(name)
    if recorded is None:
        write_json_atomic(path, digests | {name: digest})
    elif recorded != digest:
        warnings.warn(
            f"the weights of {name} differ from the digest recorded in {path}: this machine built it differently "
            "(another machine type, torch version or thread count). Rows recorded before were measured on the "
            "earlier build; rows built now use this one (the table says so). For one consistent table, rerun "
            "without the records or on the kind of machine that made them.",
            stacklevel=2,
        )
        write_json_atomic(path, digests | {f"{name}, rebuilt": digest})
    return recorded is None or recorded == digest


def check_by_metrics(
    folder: str | os.PathLike,
    name: str,
    model: nn.Module,
    recorded: Mapping,
    measured: Mapping,
    tolerance: float = 1e-6,
) -> bool:
    """Rows recorded before digests existed (`unchecked`) name no weights that a model trained again can be
    compared with; its test metrics stand in. `recorded` and `measured`: the row that `model` stands for (e.g.
    Single), as recorded and as measured now (`evaluation.report.measure`). If every metric both hold agrees
    within `tolerance` (the same weights measure the same up to float rounding; another training run moves the
    NLL by ~1e-3; NaN agrees with nothing), the model's digest is recorded as `name`'s: the recorded rows were
    measured on it. Otherwise, or when the two share no metric, it warns, naming what differs, and records the
    digest as `name`'s and as "<name>, rebuilt" (`rebuilt_differently`: the tables' notes say so). Returns
    whether they agreed."""
    common, apart = _apart(recorded, measured, tolerance)
    differ = [f"{key} {recorded_value:.6g} recorded, {value:.6g} now" for key, recorded_value, value in apart]
    if not common:
        differ = ["no metric recorded under the same name"]
    folder, digest = Path(folder), weights_digest(model)
    if differ:
        warnings.warn(
            f"{name}, trained again for rows recorded before digests existed, measures differently from the "
            f"recorded row ({'; '.join(differ[:3])}): rows recorded before were measured on another build; rows "
            "built now use this one (the tables' notes say so).",
            stacklevel=2,
        )
        record_measured_apart(folder, name, digest, recorded, measured, tolerance)
    digests = _digests(folder) | {name: digest} | ({f"{name}, rebuilt": digest} if differ else {})
    write_json_atomic(folder / DIGESTS, digests)
    return not differ


def record_measured_apart(
    folder: str | os.PathLike, name: str, digest: str, recorded: Mapping, measured: Mapping, tolerance: float = 1e-6
) -> None:
    """Keep in `REBUILT` how the model `name` built again with other weights (their `digest`) than the recorded
    rows were measured on (`check_digest`, e.g. trained on another kind of machine) measures against the row it
    stands for: `recorded` and `measured` as in `check_by_metrics`. The tables' notes then say how far apart the
    two builds measure."""
    folder, (common, apart) = Path(folder), _apart(recorded, measured, tolerance)
    how = _how_apart(common, apart, tolerance) | {"digest": digest}
    write_json_atomic(folder / REBUILT, _rebuilt(folder) | {name: how})


def has_measured_rebuild(folder: str | os.PathLike, name: str, digest: str) -> bool:
    """Whether `REBUILT` in `folder` already says how the model `name` built again with weights `digest`
    measures: an entry for another rebuild (a third kind of machine) does not count."""
    return _rebuilt(Path(folder)).get(name, {}).get("digest") == digest


def _apart(recorded: Mapping, measured: Mapping, tolerance: float) -> tuple[list, list]:
    """(every metric both rows hold, those further apart than `tolerance`), each as (dotted key, recorded, now)."""
    common = _common_leaves(recorded.get("metrics", {}), measured["metrics"])
    apart = [
        (key, recorded_value, value)
        for key, recorded_value, value in common
        if not math.isclose(recorded_value, value, rel_tol=0, abs_tol=tolerance)
    ]
    return common, apart


HEADLINE = {"id.acc": "accuracy", "all.auroc": "all-OOD AUROC"}  # what a note on a rebuilt model quotes both ways


def _how_apart(common: list[tuple[str, float, float]], apart: list[tuple[str, float, float]], tolerance: float) -> dict:
    """What `REBUILT` keeps of a model that measured differently from its recorded row: how many of the compared
    (`common`) metrics are further apart than `tolerance`, the one furthest apart (NaN counts as furthest), and the
    HEADLINE metrics both ways."""
    how = {"compared": len(common), "apart": len(apart), "tolerance": tolerance}
    if apart:
        key, recorded_value, value = max(apart, key=lambda m: math.inf if math.isnan(m[2] - m[1]) else abs(m[2] - m[1]))
        how["furthest"] = {"metric": key, "recorded": recorded_value, "now": value}
    how["headline"] = {key: {"recorded": old, "now": now} for key, old, now in common if key in HEADLINE}
    return how


def _common_leaves(a: Mapping, b: Mapping, prefix: str = "") -> list[tuple[str, float, float]]:
    """(dotted key, a's number, b's number) for every numeric leaf that both nested dicts hold."""
    leaves = []
    for key in a.keys() & b.keys():
        if isinstance(a[key], Mapping) and isinstance(b[key], Mapping):
            leaves += _common_leaves(a[key], b[key], f"{prefix}{key}.")
        elif isinstance(a[key], (int, float)) and isinstance(b[key], (int, float)):
            leaves.append((f"{prefix}{key}", float(a[key]), float(b[key])))
    return sorted(leaves)


def rebuilt_differently(folder: str | os.PathLike) -> list[str]:
    """The models of `folder` that were built again with weights that differ from their first build."""
    return sorted(name.removesuffix(", rebuilt") for name in _digests(folder) if name.endswith(", rebuilt"))


def rebuilt_notes(seed: int, *folders: str | os.PathLike) -> list[str]:
    """The table note for a seed whose models in `folders` include some built again with other weights than the
    rows recorded before were measured on (`rebuilt_differently`); none if there are none."""
    names = [name for folder in folders for name in rebuilt_differently(folder)]
    if not names:
        return []
    measured = [_rebuild_sentence(name, how) for folder in folders for name, how in _rebuilt(Path(folder)).items()]
    return [
        f"Seed {seed}: {', '.join(names)} trained again with different weights (on another machine, or for rows "
        "recorded before digests existed, which it does not measure as); the rows, scores and circuits recorded "
        "before were measured on the first build (`bench.records`)." + "".join(f" {line}" for line in measured)
    ]


def _rebuild_sentence(name: str, how: Mapping) -> str:
    """One sentence of a table note from a `REBUILT` entry."""
    if not how["compared"]:
        return f"{name} shares no metric with its recorded row."
    if not how["apart"]:
        return (
            f"Measured as its recorded row, {name} agrees within {how['tolerance']:g} in all {how['compared']} metrics."
        )
    furthest = how["furthest"]
    return (
        f"Measured as its recorded row, {name} differs by more than {how['tolerance']:g} in {how['apart']} of "
        f"{how['compared']} metrics, the most in {furthest['metric']} ({furthest['recorded']:.6g} recorded, "
        f"{furthest['now']:.6g} now)."
        + "".join(
            f" Its {said}: {100 * both['recorded']:.1f} % recorded, {100 * both['now']:.1f} % now."
            for key, said in HEADLINE.items()
            if (both := how.get("headline", {}).get(key))  # absent from entries recorded before it was kept
        )
    )


def unchecked(folder: str | os.PathLike, name: str) -> bool:
    """Whether `folder` records finished rows (results.json) but no digest of the model `name` they came from."""
    return (Path(folder) / "results.json").exists() and name not in _digests(folder)


def discard_stale_state(path: str | os.PathLike, model: nn.Module) -> None:
    """Move aside the state of a search in progress at `path` (e.g. `circuit_avg_state.json`) when it was written
    for other weights than `model`'s (a model trained again differently on another machine), warning: the search
    starts over instead of refusing to resume. The state is kept as `.<name>.stale` (not a record)."""
    path = Path(path)
    if not path.exists() or json.loads(path.read_text()).get("model") in (None, weights_digest(model)):
        return
    warnings.warn(f"{path} was written for other model weights: the search starts over.", stacklevel=2)
    os.replace(path, path.with_name(f".{path.name}.stale"))


def recorded_latency(
    path: str | os.PathLike, rows: Sequence[str], time_rows: Callable[[], dict[str, dict]]
) -> tuple[dict[str, dict], dict]:
    """The latency of `rows` relative to the first ({row: `cost.predictor_latency` stats}) and when and where it
    was timed. Rows timed together earlier (one interleaved run recorded at `path`, the first row included) are
    read back: timing needs every row's model, which a fresh machine would have to train again. Otherwise
    `time_rows()` times them now and the record is replaced. Delete the file to time again."""
    path = Path(path)
    if path.exists():
        record = json.loads(path.read_text())
        if rows[0] in record["rows"] and set(rows) <= set(record["rows"]):
            return {row: record["rows"][row] for row in rows}, record["timed"]
    timed = {"machine": machine(), "date": datetime.date.today().isoformat()}
    latency = time_rows()
    write_json_atomic(path, {"rows": latency, "timed": timed})
    return latency, timed
