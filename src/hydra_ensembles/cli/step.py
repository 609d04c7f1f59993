"""The step record: the output directory of a command records what it was given and what it produced, so a rerun
of the same command is a no-op, an interrupted one resumes, and a later step can take the directory as --model."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..io import write_json_atomic
from ..predictors import saved_kind
from ..predictors.card import CARD_NAME
from ..version import __version__
from .common import CommandError

RECORD = "hydra-ens.json"  # in every output directory: the command, its settings, and what it produced
MEMBERS_FILE = "members.json"  # in a members directory (of `members` or `finetune`): its member checkpoints


def check_model_dir(path: str | os.PathLike, what: str = "--model") -> Path:
    """The saved predictor at `path`; the output directory of `finetune` or `fuse` stands for the model in it."""
    path = Path(path)
    if not path.exists():
        hub = len(path.parts) == 2 and not str(path).startswith((".", "/", "~")) and not path.parent.exists()
        fetch = f" If it is a Hub id: fetch it once (hf download {path} --local-dir DIR) and give DIR." if hub else ""
        raise CommandError(f"{what} {str(path)!r} does not exist.{fetch}")
    if not path.is_dir():
        raise CommandError(f"{what} {str(path)!r} is a file; give the model's directory.")
    record = json.loads((path / RECORD).read_text()) if (path / RECORD).is_file() else {}
    model_dir = record.get("results", {}).get("model_dir")  # a step's output holds its model there
    path = path / (model_dir or "")
    if (path / MEMBERS_FILE).is_file():
        raise CommandError(
            f"{what} {str(path)!r} is a members directory (models not yet fused): fuse them into one model first "
            f"(hydra-ens fuse --members {str(path)!r} --out DIR)."
        )
    try:
        saved_kind(path)
    except FileNotFoundError as error:
        if record and not record.get("finished"):
            raise CommandError(
                f"{what} {str(path)!r} holds an unfinished `hydra-ens {record.get('command')}` run: run that command "
                "again to finish it (it resumes where it stopped)."
            ) from None
        if record and not model_dir:  # e.g. the output of `scores` or `evaluate`
            raise CommandError(
                f"{what} {str(path)!r} is the output of `hydra-ens {record['command']}`, which holds no model: give "
                "your classifier's directory, or the output of a step that saves one (finetune, fuse, calibrate, ood, "
                "amp, distill)."
            ) from None
        raise CommandError(f"{what} {error}") from None
    return path


def fingerprint_path(path: str | os.PathLike, flag: str) -> dict:
    """Where an input lives and a digest of its contents' sizes and times: a changed input redoes the step."""
    if not Path(path).exists():
        raise CommandError(f"{flag} {str(path)!r} does not exist.")
    path = Path(path).resolve()
    # a model card is derived from the rest (evaluate rewrites it), hidden files (.DS_Store) are read by no step,
    # and a step's output written inside the input (`evaluate --model run --out run/report`) is no part of it:
    # none is an input
    steps = {record.parent for record in path.rglob(RECORD) if record.parent != path} if path.is_dir() else set()
    files = (
        sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and p.name != CARD_NAME and not p.name.startswith(".") and not steps & set(p.parents)
        )
        if path.is_dir()
        else [path]
    )
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(
            f"{file.relative_to(path) if path.is_dir() else file.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()
        )
    return {"path": str(path), "digest": digest.hexdigest()[:16]}


def _input_paths(settings: Any) -> list[Path]:
    """Every input path a step's settings name (the `fingerprint_path` records in them, at any depth)."""
    if isinstance(settings, dict):
        if set(settings) == {"path", "digest"}:
            return [Path(settings["path"])]
        return [path for value in settings.values() for path in _input_paths(value)]
    if isinstance(settings, list):
        return [path for value in settings for path in _input_paths(value)]
    return []


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--force", action="store_true", help="start over, replacing what --out holds (a finished or interrupted run)"
    )


def start_step(args: argparse.Namespace, command: str, settings: dict, result: str = "") -> Output | None:
    """The output directory of a step, or None (having said so) when this very step already finished there.

    `result` names what the step wrote (shown in the message); a finished `evaluate` shows its report again."""
    out = Output(args.out, command, settings, args.force)
    if not out.done():
        return out
    if (out.path / result).is_file() and result.endswith(".md"):
        print((out.path / result).read_text())
    print(f"already done: {out.path / result if result else out.path} (pass --force to redo)")
    return None


class Output:
    """An output directory and its record, written when a step starts and again when it finishes.

    The same step run again: a no-op when it finished, a resume when it was interrupted. A different step: refused
    when the directory holds a finished result (unless `force`), started afresh when it holds only the unfinished
    part of one (an interrupted run, or one stopped by bad input). A non-empty directory with no record (not a
    step's) is refused, so that nothing a user put there is ever deleted."""

    def __init__(self, path: str | os.PathLike, command: str, settings: dict, force: bool = False):
        self.path, self.command, self.started = Path(path), command, time.perf_counter()
        self.settings = json.loads(json.dumps(settings, default=str))
        record = self.path / RECORD
        if self.path.exists() and not self.path.is_dir():
            raise CommandError(f"--out {str(self.path)!r} is a file; give a directory.")
        previous = json.loads(record.read_text()) if record.is_file() else None
        if previous is None and self.path.is_dir() and any(self.path.iterdir()):
            raise CommandError(  # never written by a step: a rerun or --force would delete what it holds
                f"--out {str(self.path)!r} already holds files that no hydra-ens step wrote; give a new or empty "
                "directory."
            )
        same = previous is not None and (previous.get("command"), previous.get("settings")) == (command, self.settings)
        if previous is not None and (force or not (same or previous.get("finished"))):
            self._check_holds_no_input()
            if not force:  # what the interrupted run had done is lost: say so, and why
                why = _difference(previous, command, self.settings)
                print(f"--out {str(self.path)!r} held an interrupted run {why}: starting afresh")
            shutil.rmtree(self.path)  # --force, or the unfinished part of a different run: nothing finished is lost
            previous = None
        if previous is not None and not same:
            raise CommandError(
                f"--out {str(self.path)!r} holds the finished run {_difference(previous, command, self.settings)}; "
                "choose another --out, or pass --force to replace it."
            )
        self.previous = previous
        self.path.mkdir(parents=True, exist_ok=True)
        if previous is None:
            self._record(finished=False)

    def _check_holds_no_input(self) -> None:
        """Refuse to clear --out when it is, or holds, one of this step's inputs (`finetune --model run --out run
        --force` would delete the model it is about to read)."""
        here = self.path.resolve()
        for source in _input_paths(self.settings):
            if source == here or here in source.parents:
                raise CommandError(
                    f"--out {str(self.path)!r} holds this step's input {str(source)!r}: starting over there would "
                    "delete it. Choose another --out."
                )

    def done(self) -> bool:
        return self.previous is not None and self.previous.get("finished", False)

    def finish(self, results: dict | None = None) -> None:
        self._record(finished=True, results=results or {})

    def _record(self, finished: bool, results: dict | None = None) -> None:
        record = {
            "command": self.command,
            "settings": self.settings,
            "finished": finished,
            "library_version": __version__,
        }
        if finished:
            record |= {"wall_time_s": round(time.perf_counter() - self.started, 1), "results": results}
        write_json_atomic(self.path / RECORD, record)


def _difference(previous: dict, command: str, settings: dict) -> str:
    """How a run's record in --out differs from this run: another command, or which settings changed."""
    if previous.get("command") != command:
        return f"of another command, `hydra-ens {previous.get('command')}`"
    before = previous.get("settings") or {}
    changed = sorted(
        flag for k in before.keys() | settings.keys() for flag in _changed(k, before.get(k), settings.get(k))
    )
    return f"of `hydra-ens {command}` with other settings ({', '.join(changed)}; an input's size or time counts)"


FLAGS = {  # settings named otherwise than the flags they come from
    "sets": "--near/--far/--ood",
    "models": "--model",
    "source": "--scores/--circuit",
    "zero_shot": "--classes/--templates",
    "finetune": "--finetune-train/--finetune-val or their training flags",
}


def _changed(setting: str, before: Any, now: Any) -> list[str]:
    """The flags behind a setting that changed ("max_length" -> "--max-length"; the training recipe's by field,
    "--epochs"; a field that no flag sets, by name); none when it did not change."""
    if before == now:
        return []
    if setting == "recipe" and isinstance(before, dict) and isinstance(now, dict):
        return [f"--{k.replace('_', '-')}" for k in before.keys() | now.keys() if before.get(k) != now.get(k)]
    return [FLAGS.get(setting, f"--{setting.replace('_', '-')}")]
