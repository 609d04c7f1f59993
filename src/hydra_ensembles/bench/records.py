"""Records: the small files a benchmark leaves in its cache, everything but trained weights (`models/`,
`checkpoints/`, `distill/`). A table renders from records alone; kept in a folder that outlives the machine
(`--records DIR`), they let a benchmark go on from a fresh machine, training again only the weights unfinished rows
need.

Provenance: training again may give other weights on another machine type, torch version or thread count, so every
model is checked against the digest recorded at its first build (`check_digest`). The single model, which every row
starts from, is checked by its recorded row's metrics where the records predate digests (`check_by_metrics`); where
it was rebuilt differently, it is measured as its row once and the tables say how far apart the builds measure
(`rebuilt_notes`), and the tables' differences compare a seed's two rows on one build where its logits were kept
(`same_build_stand_ins`). `checked_single` applies these to a seed's single model (`suite.Pieces.single`).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from ..evaluation.compare import measured_here, row_file
from ..io import read_json_record, replacing, weights_digest, write_json_atomic

# cache folders whose files are trained weights, never records (distill: the distilled students, with their
# teacher's digest beside them: a machine that retrains the teacher retrains them too)
WEIGHTS = frozenset({"models", "checkpoints", "distill"})
DIGESTS = "model_digests.json"  # {model name: digest of its weights}, in the folder that holds `models/`
SETTINGS = "settings.json"  # what a task's rows depend on beyond the fingerprint (amp-*): never mixed
BATCHES = "batches.json"  # where a task's splits are cut into batches (runner.record_batches): never mixed
RESULTS = "results.json"  # {row: result} of a seed (`runner.Table.record`'s default)
REBUILT = "rebuilt.json"  # {model name: how its rebuild measured against its recorded row}, beside DIGESTS
HEADLINE = {"id.acc": "accuracy", "all.auroc": "all-OOD AUROC"}  # what a note on a rebuilt model quotes both ways


def is_record(relative: Path) -> bool:
    """Whether the cache file at `relative` (to a cache root) is a record: not under a weights folder, and not a
    temporary file of an atomic write (a name starting with '.')."""
    return not WEIGHTS.intersection(relative.parts[:-1]) and not any(p.startswith(".") for p in relative.parts)


def copy_records(source: str | os.PathLike, target: str | os.PathLike, overwrite: bool) -> list[Path]:
    """Copy every record under `source` to `target`, each file atomically; a file `target` holds is kept unless
    `overwrite`, and a file both hold is merged (`_merged`). Returns the relative paths written (only files that
    change)."""
    source, target = Path(source), Path(target)
    if not source.is_dir():
        return []
    _check_settings_agree(source, target)  # before any file is written: the rows of both would already mix
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
            content = _merged(content, destination.read_bytes(), overwrite, path, destination)
            if content == destination.read_bytes():
                continue
        with replacing(destination) as tmp:
            tmp.write_bytes(content)
        written.append(relative)
    return written


def _merged(new: bytes, old: bytes, overwrite: bool, source: Path, target: Path) -> bytes:
    """What the record `target` (holding `old`) becomes when `new` is copied onto it from `source`: of two states
    of one model's search in progress, the one further on; of two timing records, every run of both (two
    different settings files are refused before any copy, `_check_settings_agree`); of two JSON objects, their
    union with the winner's
    values (`new` if `overwrite`), two digest files that disagree keeping the loser's digest as "<model>,
    rebuilt" (the tables say so); of two other files (logits), the winner. A JSON record that does not parse (cut
    short, or left with a merge's conflict markers) is refused: merging around it would lose the other's rows."""
    winner, loser = (new, old) if overwrite else (old, new)
    if target.suffix != ".json":
        return winner
    new_data, old_data = _parsed(new, source, target), _parsed(old, target, source)
    winner_data, loser_data = (new_data, old_data) if overwrite else (old_data, new_data)
    if not isinstance(winner_data, dict) or not isinstance(loser_data, dict):
        return winner
    if "removed" in winner_data and "removed" in loser_data:
        same_model = winner_data.get("model") == loser_data.get("model")
        return loser if same_model and len(loser_data["removed"]) > len(winner_data["removed"]) else winner
    if isinstance(winner_data.get("runs"), list) and isinstance(loser_data.get("runs"), list):  # timed runs
        kept = {json.dumps(run, sort_keys=True) for run in winner_data["runs"]}
        # the loser's other runs first: a reader takes the last run that fits, so the winner's stay the newest
        runs = [run for run in loser_data["runs"] if json.dumps(run, sort_keys=True) not in kept] + winner_data["runs"]
        return json.dumps(loser_data | winner_data | {"runs": runs}, indent=2, sort_keys=True).encode()
    if target.name == DIGESTS:
        merged = loser_data | winner_data | _conflicts(winner_data, loser_data)
        return json.dumps(merged, indent=2, sort_keys=True).encode()
    if loser_data.keys() <= winner_data.keys():
        return winner
    return json.dumps(loser_data | winner_data, indent=2, sort_keys=True).encode()


def _check_settings_agree(source: Path, target: Path) -> None:
    """Refuse two records whose settings files differ: `SETTINGS` (what an amp-* seed's rows depend on) or the
    task's batch layout (`BATCHES`: another cut trains other models under the same fingerprint)."""
    for path in sorted(p for name in (SETTINGS, BATCHES) for p in source.rglob(name)):
        other = target / path.relative_to(source)
        if not other.is_file():
            continue
        new, old = _parsed(path.read_bytes(), path, other), _parsed(other.read_bytes(), other, path)
        if new != old:
            raise ValueError(
                f"{path} and {other} record other settings ({_differing(new, old)}): their rows would mix in one "
                "table. Give one of the two runs its own cache (--cache, or the HYDRA_ENSEMBLES_CACHE variable) and "
                "records directory (--records)."
            )


def _differing(first: Mapping, second: Mapping) -> str:
    return ", ".join(
        f"{key}: {first.get(key)} vs {second.get(key)}"
        for key in sorted(first.keys() | second.keys())
        if first.get(key) != second.get(key)
    )


def _parsed(data: bytes, path: Path, other: Path) -> Any:
    """The JSON record `data` read from `path`, or a ValueError naming it and its other copy `other`."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"the record {path} is not valid JSON ({error}): restore it (from git or the other copy, {other}) or "
            "delete it, then copy the records again"
        ) from None


def _conflicts(winner: Mapping[str, str], loser: Mapping[str, str]) -> dict[str, str]:
    """{"<model>, rebuilt": the loser's digest} of every model the two digest files disagree on (not yet
    recorded as rebuilt), warning."""
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


def _read(folder: str | os.PathLike, record: str) -> dict:
    return read_json_record(Path(folder) / record)


def check_digest(folder: str | os.PathLike, name: str, model: nn.Module, digest: str | None = None) -> bool:
    """Compare the weights of the model `name` with the digest recorded in `folder`, recording it when there is
    none. A different digest warns, keeps the first and records the new one as "<name>, rebuilt" (once: the same
    rebuild loaded again is not news). Returns whether the model matches the record (True when there was none).
    `digest`: the model's `weights_digest`, when the caller has it already."""
    path, digests = Path(folder) / DIGESTS, _read(folder, DIGESTS)
    digest, recorded = digest or weights_digest(model), digests.get(name)
    if recorded is None:
        write_json_atomic(path, digests | {name: digest})
    elif recorded != digest and digests.get(f"{name}, rebuilt") != digest:  # said once per rebuild, not every run
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
    folder: Path, name: str, model: nn.Module, recorded: Mapping, measured: Mapping, tolerance: float = 1e-6
) -> bool:
    """Check `model`, trained again for rows recorded before digests existed, by its row's metrics: `recorded`, and
    `measured` now (`report.measure`). Every shared metric within `tolerance` (the same weights measure the same up
    to rounding; NaN agrees with nothing): its digest is recorded as `name`'s. Otherwise it warns and records it also
    as "<name>, rebuilt", with how far apart it measures (`record_measured_apart`). Returns whether they agreed."""
    common, apart = _apart(recorded, measured, tolerance)
    digest, digests = weights_digest(model), _read(folder, DIGESTS)
    if common and not apart:
        write_json_atomic(Path(folder) / DIGESTS, digests | {name: digest})
        return True
    differ = [f"{key} {old:.6g} recorded, {now:.6g} now" for key, old, now in apart[:3]]
    warnings.warn(
        f"{name}, trained again for rows recorded before digests existed, measures differently from the "
        f"recorded row ({'; '.join(differ or ['no metric recorded under the same name'])}): rows recorded before "
        "were measured on another build; rows built now use this one (the tables' notes say so).",
        stacklevel=2,
    )
    record_measured_apart(folder, name, digest, recorded, measured, tolerance)
    write_json_atomic(Path(folder) / DIGESTS, digests | {name: digest, f"{name}, rebuilt": digest})
    return False


def record_measured_apart(
    folder: Path, name: str, digest: str, recorded: Mapping, measured: Mapping, tolerance: float = 1e-6
) -> None:
    """Keep in `REBUILT` how the model `name` built again (weights `digest`) measures against the row it stands
    for (`recorded`, `measured` as in `check_by_metrics`): how many compared metrics are further apart than
    `tolerance`, the furthest (NaN counts as furthest), the HEADLINE metrics both ways, and the rows recorded so far
    (`rows_before`: a row recorded later was built on this build; `rebuilt_notes` names those). An entry for an
    earlier rebuild with other weights is kept in the new one's `earlier`, with the rows recorded on it."""
    common, apart = _apart(recorded, measured, tolerance)
    how = {"compared": len(common), "apart": len(apart), "tolerance": tolerance, "digest": digest}
    how["rows_before"] = sorted(read_json_record(Path(folder) / RESULTS))
    if apart:
        key, old, now = max(apart, key=lambda m: math.inf if math.isnan(m[2] - m[1]) else abs(m[2] - m[1]))
        how["furthest"] = {"metric": key, "recorded": old, "now": now}
    how["headline"] = {key: {"recorded": old, "now": now} for key, old, now in common if key in HEADLINE}
    entries = _read(folder, REBUILT)
    before = entries.get(name)
    if before is not None and before.get("digest") == digest:  # the same build measured again: found back then
        how |= {key: before[key] for key in ("rows_before", "earlier") if key in before}
    elif before is not None:  # a third build: the rows recorded on the second stay named
        how["earlier"] = [*before.pop("earlier", []), before]  # oldest first
    write_json_atomic(Path(folder) / REBUILT, entries | {name: how})


def has_measured_rebuild(folder: str | os.PathLike, name: str, digest: str) -> bool:
    """Whether `REBUILT` already says how the build `digest` of `name` measures (another build's entry does not
    count)."""
    return _read(folder, REBUILT).get(name, {}).get("digest") == digest


def _apart(recorded: Mapping, measured: Mapping, tolerance: float) -> tuple[list, list]:
    """(every metric both rows hold, those further apart than `tolerance`), each as (dotted key, recorded, now)."""
    common = _common_leaves(recorded.get("metrics", {}), measured["metrics"])
    return common, [m for m in common if not math.isclose(m[1], m[2], rel_tol=0, abs_tol=tolerance)]


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
    return sorted(name.removesuffix(", rebuilt") for name in _read(folder, DIGESTS) if name.endswith(", rebuilt"))


def rebuilt_notes(seed: int, *folders: str | os.PathLike) -> list[str]:
    """The table note of a seed whose models in `folders` were built again with other weights than the recorded
    rows were measured on; none if there are none."""
    names = [name for folder in folders for name in rebuilt_differently(folder)]
    if not names:
        return []
    measured = [
        _rebuild_sentence(name, how, _read(folder, RESULTS), back=_build_label(folder)(how.get("digest")) == FIRST)
        for folder in folders
        for name, how in _read(folder, REBUILT).items()
    ]
    return [
        f"Seed {seed}: {', '.join(names)} trained again with different weights (on another machine, or for rows "
        "recorded before digests existed, which it does not measure as); the rows, scores and circuits recorded "
        "before were measured on the first build (`bench.records`). Two rows of this seed built on different "
        "builds do not share their base model: their difference holds the builds' too (over several seeds, within "
        "the interval's seed spread; with one seed, outside its interval)." + "".join(f" {line}" for line in measured)
    ]


def _rebuild_sentence(name: str, how: Mapping, rows: Mapping, back: bool = False) -> str:
    """The sentences of a table note from a `REBUILT` entry, `rows` the folder's recorded rows; `back`: the entry's
    build is the first one's again (`_back_on_first_build`)."""
    again = f"{name} was built again as its first build (the same weights) after a rebuild. " if back else ""
    return again + _measured_sentence(name, how) + _built_on_sentence(name, how, rows)


def _measured_sentence(name: str, how: Mapping) -> str:
    compared, tolerance, headline = how["compared"], how["tolerance"], how.get("headline", {})  # none in old entries
    if not compared:
        return f"{name} shares no metric with its recorded row."
    if not how["apart"]:
        return f"Measured as its recorded row, {name} agrees within {tolerance:g} in all {compared} metrics."
    furthest = how["furthest"]
    return (
        f"Measured as its recorded row, {name} differs by more than {tolerance:g} in {how['apart']} of {compared} "
        f"metrics, the most in {furthest['metric']} ({furthest['recorded']:.6g} recorded, {furthest['now']:.6g} now)."
        + "".join(
            f" Its {said}: {100 * headline[key]['recorded']:.1f} % recorded, {100 * headline[key]['now']:.1f} % now."
            for key, said in HEADLINE.items()
            if key in headline
        )
    )


def _built_on_sentence(name: str, how: Mapping, rows: Mapping) -> str:
    """The rows recorded after the rebuild was found, so built on it, and those of each earlier rebuild (recorded
    between it and the next); a row deleted and measured again since counts as before; entries written before
    `rows_before` existed say nothing."""
    if "rows_before" not in how:
        return ""
    since = [row for row in rows if row not in how["rows_before"]]
    earlier = [build for build in how.get("earlier", []) if "rows_before" in build]
    on_earlier = []  # the latest first: each rebuild's rows, recorded before the next one was found
    for build, after in zip(earlier, [*earlier[1:], how]):
        on = [row for row in after["rows_before"] if row not in build["rows_before"]]
        on_earlier.insert(0, f" On its earlier rebuild {build['digest']}: {', '.join(on) or 'no row'}.")
    if not since and not on_earlier:
        return f" No row was recorded on this build of {name}."
    sentence = f" Rows recorded on this build of {name} (the others are the first build's): {', '.join(since)}."
    if not on_earlier:
        return sentence
    now = ", ".join(since) if since else "none"
    return f" Rows recorded on this build of {name}: {now}.{''.join(on_earlier)} The others are the first build's."


FIRST = "first"  # `single_builds`' name for the single model's first build
AGAIN = "Single, trained again"  # the logits of the single model's latest rebuild, beside the Single row's


def single_builds(folder: str | os.PathLike) -> dict[str, str]:
    """{row: the build of the single model it was made from} for the rows recorded in `folder`: `FIRST`, or the
    digest of a rebuild (a row recorded after a rebuild was found was made from it: `REBUILT`'s `rows_before`, as
    `rebuilt_notes` reads them; a build back on the first digest is `FIRST`). {} when it cannot be told: no digest
    recorded, a rebuild whose entry was not kept (digests merged from another record), or rebuild entries written
    before `rows_before` existed."""
    rows, digests = sorted(read_json_record(Path(folder) / RESULTS)), _read(folder, DIGESTS)
    how = _read(folder, REBUILT).get("single")
    if "single" not in digests or (how is None and "single, rebuilt" in digests):
        return {}
    if how is None:
        return dict.fromkeys(rows, FIRST)
    builds = [*how.get("earlier", []), how]  # oldest first
    if any("rows_before" not in build for build in builds):
        return {}
    label = _build_label(folder)
    made: dict[str, str] = {}
    for build, before in zip(builds, [FIRST, *(label(build["digest"]) for build in builds[:-1])]):
        made |= {row: before for row in build["rows_before"] if row not in made}  # recorded before `build`
    return {row: made.get(row, label(how["digest"])) for row in rows}


def _build_label(folder: str | os.PathLike) -> Callable[[str], str]:
    """A build's name in `single_builds`: `FIRST` for the first build's digest, else the digest. The first build of
    rows recorded before digests existed has none (`check_by_metrics` records the rebuild's as both)."""
    digests = _read(folder, DIGESTS)
    first = digests.get("single") if digests.get("single") != digests.get("single, rebuilt") else None
    return lambda digest: FIRST if first is not None and digest == first else digest


def single_logits(folder: str | os.PathLike) -> dict[str, str]:
    """{build (as `single_builds` names it): the row name of its logits} for the builds of the single model whose
    logits `folder` keeps: "Single" for the first, `AGAIN` for the latest rebuild (measured when it was found) and
    `build_logits` for an earlier one."""
    how, label = _read(folder, REBUILT).get("single", {}), _build_label(folder)
    names = {label(build["digest"]): build_logits(build["digest"]) for build in how.get("earlier", [])}
    names |= {label(how["digest"]): AGAIN} if how else {}
    names |= {FIRST: "Single"}
    return {build: name for build, name in names.items() if row_file(Path(folder) / "logits", name).exists()}


def same_build_stand_ins(
    seed_dirs: Mapping[int, str | os.PathLike], pairs: Sequence[tuple[str, str]], independent: Collection[str] = ()
) -> tuple[dict[tuple[str, str], dict[int, tuple[str, str]]], dict[tuple[str, str], list[int]]]:
    """Where a pair of rows of a seed was made from different builds of its single model (`single_builds`), compare
    each on one build: a Single row stands in as the build its partner was made from, where its logits were kept
    (`single_logits`); `independent`: rows not made from the single model (trained from scratch). Returns ({pair:
    {seed: (row A's logits, row B's logits)}} for the stand-ins, {pair: [seeds still on different builds]}), for
    `bootstrap.row_differences`' `stand_ins` and the table's lines."""
    stand_ins: dict[tuple[str, str], dict[int, tuple[str, str]]] = {}
    apart: dict[tuple[str, str], list[int]] = {}
    for seed, folder in seed_dirs.items():
        builds, logits = single_builds(folder), single_logits(folder)
        for first, second in pairs:
            made = [builds.get(first), builds.get(second)]
            if None in made or made[0] == made[1] or {first, second} & set(independent):
                continue
            if second == "Single" and made[0] in logits:
                stand_ins.setdefault((first, second), {})[seed] = (first, logits[made[0]])
            elif first == "Single" and made[1] in logits:
                stand_ins.setdefault((first, second), {})[seed] = (logits[made[1]], second)
            else:
                apart.setdefault((first, second), []).append(seed)
    return stand_ins, apart


def checked_single(folder: Path, model: nn.Module, measure: Callable[[nn.Module, Path], dict]) -> nn.Module:
    """The single model of a seed (trained now or loaded), checked as the module docstring says. `measure(model,
    logits_path)`: the model measured as the Single row (`evaluation.report.measure` on the task's data)."""
    recorded = read_json_record(folder / RESULTS).get("Single")
    again = row_file(folder / "logits", AGAIN)  # beside the recorded row's logits
    if recorded is not None and "single" not in _read(folder, DIGESTS):  # rows recorded before digests existed
        if check_by_metrics(folder, "single", model, recorded, measure(model, again)):
            os.replace(again, row_file(folder / "logits", "Single"))  # the recorded row's, lost with its machine
            print(f"{folder}: the single model trained again measures as its recorded row", flush=True)
        return model
    digest = weights_digest(model)  # once: hashing every weight of a large model takes a while
    if not check_digest(folder, "single", model, digest) and recorded is not None:
        if not has_measured_rebuild(folder, "single", digest):
            _keep_earlier_rebuild(folder)
            record_measured_apart(folder, "single", digest, recorded, measure(model, again))
    elif recorded is not None and _back_on_first_build(folder, digest):
        _keep_earlier_rebuild(folder)  # the rows recorded from now on are the first build's again
        record_measured_apart(folder, "single", digest, recorded, recorded)  # its own weights: as recorded
    return model


def _back_on_first_build(folder: Path, digest: str) -> bool:
    """Whether the single model `digest`, the first build's, follows a rebuild (say AMD, then Intel, then AMD)."""
    latest = _read(folder, REBUILT).get("single", {}).get("digest")
    return latest is not None and latest != digest == _read(folder, DIGESTS).get("single")


def build_logits(digest: str) -> str:
    """The row name of the logits of an earlier rebuild `digest` of the single model (`AGAIN` is the latest's)."""
    return f"Single, build {digest}"


def _keep_earlier_rebuild(folder: Path) -> None:
    """Before a third build of the single model is measured into `AGAIN`, keep the second's logits under its
    digest (`build_logits`): the rows made from it still compare on it (`same_build_stand_ins`)."""
    earlier, again = _read(folder, REBUILT).get("single", {}).get("digest"), row_file(folder / "logits", AGAIN)
    if earlier is not None and again.exists():
        os.replace(again, row_file(folder / "logits", build_logits(earlier)))


def discard_stale_state(path: str | os.PathLike, model: nn.Module) -> None:
    """Move aside (as `.<name>.stale`, not a record) the state of a search in progress written for other
    weights than `model`'s, warning: the search starts over instead of refusing to resume."""
    path = Path(path)
    if not path.exists() or json.loads(path.read_text()).get("model") in (None, weights_digest(model)):
        return
    warnings.warn(f"{path} was written for other model weights: the search starts over.", stacklevel=2)
    os.replace(path, path.with_name(f".{path.name}.stale"))


def recorded_latency(
    path: str | os.PathLike,
    rows: Sequence[str],
    time_rows: Callable[[], dict[str, dict]],
    conditions: Mapping[str, Any],
) -> tuple[dict[str, dict], dict]:
    """The latency of `rows` relative to the first ({row: stats}) and where, when and how it was timed
    (`measured_here` and `conditions`, e.g. {"device": "cpu", "batch": 32}): read back from a run recorded at
    `path` that timed them all together, relative to the same first row, under the same conditions (timing needs
    every row's model, which a fresh machine would train again), else timed now by `time_rows()`, replacing the
    runs under these conditions it covers (each table of a seed keeps its own). Runs recorded before conditions
    were kept were timed on a CPU, at a batch not recorded. Delete the file to time again."""
    record = read_json_record(path)
    runs = record.get("runs", [record] if record else [])  # a record of one run: written before runs were kept
    for run in reversed(runs):
        if _same_reference(run, rows) and set(rows) <= set(run["rows"]) and _timed_as(run, conditions):
            return {row: run["rows"][row] for row in rows}, run["timed"]
    timed, latency = measured_here() | dict(conditions), time_rows()
    kept = [
        run
        for run in runs
        if not (_same_reference(run, rows) and _timed_as(run, conditions) and set(run["rows"]) <= set(latency))
    ]
    write_json_atomic(path, {"runs": [*kept, {"rows": latency, "timed": timed}]})
    return latency, timed


def _same_reference(run: Mapping[str, Any], rows: Sequence[str]) -> bool:
    """Whether a recorded latency run's ratios are relative to `rows[0]`: its ratio to itself is 1 in every round
    (the record's rows are stored sorted, not in the order timed)."""
    reference = run["rows"].get(rows[0], {})
    return reference.get("median") == reference.get("min") == reference.get("max") == 1.0


def _timed_as(run: Mapping[str, Any], conditions: Mapping[str, Any]) -> bool:
    """Whether a recorded latency run was timed under `conditions` (a condition it did not record: its default
    in `LATENCY_DEFAULTS`, or any)."""
    timed = run["timed"]
    return all(timed.get(key, LATENCY_DEFAULTS.get(key, value)) == value for key, value in conditions.items())


LATENCY_DEFAULTS = {"device": "cpu"}  # what a latency run recorded before its conditions were was timed on
