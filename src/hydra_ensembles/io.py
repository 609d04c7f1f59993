"""Saving without losing anything: a directory is written whole or not at all."""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from safetensors import SafetensorError

SWAP_WAIT_POLLS = 200  # a reader waits up to 2 s for a save caught between its two renames
PREDICTOR_FILE = "predictor.json"  # what a saved wrapper predictor (or MLP student) is: its kind and settings
HYDRA_CONFIG = "hydra_config.json"  # a saved HydraEnsemble
TWO_TOWER_FILE = "two_tower.json"  # a saved TwoTowerModel
SAVED_MODEL_FILES = (HYDRA_CONFIG, PREDICTOR_FILE, TWO_TOWER_FILE, "config.json")  # a directory holding one: a save
PREPROCESSOR_FILES = (  # a tokenizer's or image processor's files, saved beside a model
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "spm.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "preprocessor_config.json",
    "processor_config.json",
)


@contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file beside `path` to write in the block; renamed onto `path` when the block ends (readers see
    the old file or the new, never half of one), removed if the block fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temporary_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes the file private; a saved result should be readable like any file
        _sync(Path(tmp))
        os.replace(tmp, path)
        _sync(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    remove_orphans(path, ".tmp")


def temporary_prefix(path: Path) -> str:
    """The name a save's temporary file or folder beside `path` starts with: `.<name>.<pid>@<machine>.`, the process
    writing it, so that a later save can tell what a killed writer left (`remove_orphans`)."""
    return f".{path.name}.{os.getpid()}@{_machine()}."


@functools.cache
def _machine() -> str:
    """8 hex digits for this host, boot and process-id namespace: within them a process id names one process (two
    containers can share a host name and a folder; another machine, or this one rebooted, reuses the ids)."""
    parts = [socket.gethostname()]
    for read in (lambda: Path("/proc/sys/kernel/random/boot_id").read_text(), lambda: os.readlink("/proc/self/ns/pid")):
        try:
            parts.append(read().strip())
        except OSError:  # no /proc (macOS): the host name alone
            parts.append("")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]


WRITER = re.compile(r"([0-9]{1,10})@([0-9a-f]{8})\.[a-z0-9_]+")  # <pid>@<machine>.<mkstemp's random part>


def remove_orphans(path: Path, suffix: str) -> None:
    """Remove the temporary files or folders (`suffix`) that saves of `path` left when their process was killed
    (SIGKILL, the OOM killer, a power cut; any other failure removes its own): those of this machine (`_machine`)
    whose process no longer runs. A live process's (a save under way), another machine's or container's (a shared
    disk) and those from before a reboot stay. Best effort: the save that calls it has succeeded already."""
    if os.name != "posix":  # os.kill(pid, 0) is no liveness check elsewhere
        return
    start = len(f".{path.name}.")
    for temporary in path.parent.glob(f".{glob.escape(path.name)}.*{suffix}"):
        writer = WRITER.fullmatch(temporary.name[start : -len(suffix)])
        if writer is None or writer[2] != _machine() or _running(int(writer[1])):
            continue
        try:
            if temporary.is_dir():
                shutil.rmtree(temporary)
            else:
                temporary.unlink(missing_ok=True)
        except OSError:  # not ours to remove (another user's, in a shared folder)
            continue


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: no signal, only the check that the process exists
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process; an id past the system's: not ours to judge
        return True
    return True


def _sync(path: Path) -> None:
    """Flush a file's bytes, or a directory's entries (a rename), to the disk: after a power loss the file holds
    what was written, not zero bytes renamed into place."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write text to `path` as UTF-8 (whatever the locale: tables hold ± and ×) through a temporary file and an atomic
    rename (`replacing`). A path that exists and is no regular file (/dev/null, /dev/stdout, a pipe) is written to as it
    is: a rename would replace it."""
    if Path(path).exists() and not Path(path).is_file():
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
        return
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Write JSON to `path` through a temporary file and an atomic rename (`replacing`)."""
    with replacing(path) as tmp, open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)


def read_json_record(path: str | os.PathLike) -> dict:
    """The JSON object a run recorded at `path` (`write_json_atomic`), or {} before it recorded anything."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        record = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"the record {path} is not valid JSON ({error}): restore it or delete it") from None
    if not isinstance(record, dict):
        raise ValueError(
            f"the record {path} holds a {type(record).__name__}, not a JSON object: restore it or delete it"
        )
    return record


def torch_save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """`torch.save` through a temporary file and an atomic rename (`replacing`): a run stopped midway leaves the
    old file or none, never a truncated one that every later run would fail to load."""
    with replacing(path) as tmp:
        torch.save(obj, tmp)


def save_dir_atomic(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp_dir)`, then swap `tmp_dir` into `path`.

    If `write` fails or the process dies midway, `path` still holds the previous save. The swap is two renames;
    should the process die between them, the previous save sits at `.<name>.hydra-previous` beside it and
    the next save, or a loader that finds it so (`settle_dir`), puts it back.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(path)
    preprocessor = _replaceable(path)
    tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(path), suffix=".partial", dir=path.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes the directory private; a saved model should be readable like any other
    try:
        write(tmp)
        for name in preprocessor if _same_model_type(path, tmp) else ():  # a tokenizer saved there stays with it
            if not (tmp / name).exists():
                shutil.copy2(path / name, tmp / name)
        for folder, _, files in os.walk(tmp):  # every byte on the disk before the swap makes it the save
            for name in files:
                _sync(Path(folder) / name)
            _sync(Path(folder))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    previous = _swap_name(path)
    try:
        if path.exists():
            os.rename(path, previous)
        os.rename(tmp, path)
    except BaseException:  # nothing half-done stays behind: the previous save goes back, the new one away
        shutil.rmtree(tmp, ignore_errors=True)
        recover_dir(path)
        raise
    _sync(path.parent)
    shutil.rmtree(previous, ignore_errors=True)
    remove_orphans(path, ".partial")
    return path


def _replaceable(path: Path) -> list[str]:
    """The preprocessor files in `path` that a save into it may keep (`_same_model_type`); refuses a directory
    that holds other files (hidden ones aside) and no saved model, since the save replaces the directory whole (a
    previous save's other files are its own)."""
    if not path.exists():
        return []
    if not path.is_dir():
        raise FileExistsError(f"{path} is a file, not a directory: save to another path, or remove it first.")
    names = sorted(entry.name for entry in path.iterdir())
    others = [name for name in names if name not in PREPROCESSOR_FILES and not name.startswith(".")]
    if others and not set(names) & set(SAVED_MODEL_FILES):
        shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
        raise FileExistsError(
            f"{path} holds {shown} and no saved model: a save replaces its directory whole, so they would be lost. "
            "Save into a new or empty directory (or move them out first)."
        )
    return [name for name in names if name in PREPROCESSOR_FILES and (path / name).is_file()]


def _same_model_type(old: Path, new: Path) -> bool:
    """Whether the preprocessor files in `old` belong with the save in `new`: `old` held no saved model (they were
    saved before it), or both saves hold models of one model_type (another model's image processor would make a
    text model's folder load as an image model's)."""
    if not any((old / name).is_file() for name in SAVED_MODEL_FILES):
        return True
    kind = _saved_model_type(old)
    return kind is not None and kind == _saved_model_type(new)


def _saved_model_type(folder: Path, depth: int = 3) -> str | None:
    """The HF model_type of the save in `folder`: its config.json's, the config a fused ensemble or a predictor
    (MIMO) records, or, for a predictor or two-tower save whose models sit in subfolders, its first saved
    subfolder's ("None" when a config names none). None when no save is found."""
    if (folder / "config.json").is_file():
        return str(json.loads((folder / "config.json").read_text()).get("model_type"))
    for record in (HYDRA_CONFIG, PREDICTOR_FILE):  # a fused ensemble, or a predictor that records its network's
        config = json.loads((folder / record).read_text()).get("model_config") if (folder / record).is_file() else None
        if isinstance(config, dict):
            return str(config.get("model_type"))
    if depth == 0:
        return None
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if any((sub / name).is_file() for name in SAVED_MODEL_FILES):
            return _saved_model_type(sub, depth - 1)
    return None


def _swap_name(path: Path) -> Path:
    """Where a save's previous version waits during the swap: hidden and named for this library, so that
    `recover_dir` never deletes a user's own `<name>.previous` backup."""
    return path.with_name(f".{path.name}.hydra-previous")


def recover_dir(path: str | os.PathLike) -> None:
    """Finish or undo a swap that was cut off by a crash."""
    path = Path(path)
    previous = _swap_name(path)
    if not previous.exists():
        return
    if path.exists():  # cut after the second rename: the new save is complete, the old one is stale
        shutil.rmtree(previous, ignore_errors=True)
    else:  # cut between the renames: put the previous save back
        os.rename(previous, path)


def settle_dir(path: str | os.PathLike) -> None:
    """Before reading `path`: a save caught between its two renames is waited for (a writer takes microseconds
    there) and put back only if it stays cut off (its writer died). A reader that swapped it back while the writer
    lived would make the writer's second rename fail."""
    path = Path(path)
    if path.exists() or not _swap_name(path).exists():
        return
    for _ in range(SWAP_WAIT_POLLS):
        time.sleep(0.01)
        if path.exists():
            return
    recover_dir(path)


def saved_inside(path: str | os.PathLike) -> str:
    """ " It holds a saved model one level down, in 'run/model': load that (...)." for a directory whose sub-folders
    hold a save (`SAVED_MODEL_FILES`), as a CLI step's output folder does; "" otherwise (or when it cannot be read).
    For errors on a directory that is not itself a save."""
    try:
        inside = sorted(str(s) for s in Path(path).iterdir() if any((s / n).is_file() for n in SAVED_MODEL_FILES))
    except OSError:  # not a directory, or one this user may not read
        return ""
    if not inside:
        return ""
    return (
        f" It holds a saved model one level down, in {' and '.join(map(repr, inside))}: load that "
        "(`hydra_ensembles.predictors.load_predictor` reads every kind)."
    )


@contextmanager
def reading_dir(path: str | os.PathLike, what: str) -> Iterator[Path]:
    """`path` (`settle_dir`), checked to be a directory; a weights file in it that cannot be read is named by the
    directory (`unreadable_weights`: HF's loader does not say which file)."""
    path = Path(path)
    settle_dir(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no {what} at {str(path)!r}: the directory does not exist.")
    try:
        yield path
    except SafetensorError as error:
        raise unreadable_weights(error, f"in {str(path)!r}") from error


def read_safetensors(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file at `path`; one that is not such a file is named (`unreadable_weights`)."""
    try:
        return safetensors.torch.load_file(str(path), device=str(device))
    except SafetensorError as error:
        raise unreadable_weights(error, str(path)) from error


def unreadable_weights(error: Exception, where: str) -> ValueError:
    """The error of a weights file `where` that safetensors cannot read: most often a Git LFS pointer."""
    return ValueError(
        f"cannot read the weights file {where} ({error}): it is no safetensors file, or a damaged one. A Git LFS "
        "pointer in its place is fetched with `git lfs pull`."
    )


def load_weights(module: torch.nn.Module, path: str | os.PathLike) -> torch.nn.Module:
    """`module` with the safetensors file at `path` loaded, each tensor in the dtype it was saved in (a float64,
    bf16 or mixed save; `load_state_dict` alone would cast it into the freshly built float32 module). The module
    must not tie weights (assigning breaks ties). Returns the module."""
    module.load_state_dict(read_safetensors(path), assign=True)
    return module


def without_late_defaults(settings: dict[str, Any], late_defaults: dict[str, Any]) -> dict[str, Any]:
    """`settings` less the fields added after caches were keyed by them (`late_defaults`: name -> default) that
    are at their default: a key computed before such a field existed stays the same."""
    return {k: v for k, v in settings.items() if k not in late_defaults or late_defaults[k] != v}


def tensor_digest(tensors: Iterable[torch.Tensor]) -> str:
    """A short hash of tensors' shapes and bytes: what a saved state must match to be resumed."""
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def batches_digest(batches: Iterable[Mapping[str, Any]]) -> str:
    """`tensor_digest` of batches' tensors, batch by batch, keys sorted within a batch: the data a saved state
    (a circuit search, a training checkpoint) must have been computed on to be resumed."""
    return tensor_digest(v for batch in batches for _, v in sorted(batch.items()) if isinstance(v, torch.Tensor))


def weights_digest(module: torch.nn.Module) -> str:
    """`tensor_digest` of a module's state dict, in key order: the same weights give the same digest, on any
    device. A submodule whose tensors are laid out by the device (a fused layer with uneven heads: ragged on a
    CPU, padded on a GPU) enters with its `canonical_tensors()` in place of those it holds."""
    state = module.state_dict()
    for name, sub in module.named_modules():
        canonical = getattr(sub, "canonical_tensors", None)
        if callable(canonical):
            state.update({f"{name}.{key}" if name else key: tensor for key, tensor in canonical().items()})
    return tensor_digest(t for _, t in sorted(state.items()) if isinstance(t, torch.Tensor))
