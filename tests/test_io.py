"""Atomic saves: a crash while writing keeps the previous content."""

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import safetensors.torch
import torch

from hydra_ensembles.io import (
    load_weights,
    read_json_record,
    reading_dir,
    replacing,
    save_dir_atomic,
    temporary_prefix,
    write_json_atomic,
)


def test_json_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    write_json_atomic(path, {"step": 1})
    monkeypatch.setattr(json, "dump", lambda *a, **k: (_ for _ in ()).throw(OSError("crash")))
    with pytest.raises(OSError):
        write_json_atomic(path, {"step": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_record_not_yet_written_reads_empty(tmp_path):
    path = tmp_path / "results.json"
    assert read_json_record(path) == {}
    write_json_atomic(path, {"Single": {"acc": 0.9}})
    assert read_json_record(path) == {"Single": {"acc": 0.9}}


def _save(name, text):
    """A save's `write`: a model's config and one file of its own."""
    return lambda d: ((d / "config.json").write_text("{}"), (d / name).write_text(text))


def test_directory_save_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "out"
    save_dir_atomic(target, _save("a.txt", "old"))
    with pytest.raises(RuntimeError):
        save_dir_atomic(target, lambda d: ((d / "a.txt").write_text("new"), (_ for _ in ()).throw(RuntimeError()))[0])
    assert (target / "a.txt").read_text() == "old"
    save_dir_atomic(target, _save("b.txt", "new"))  # a previous save's own files go with it
    assert sorted(p.name for p in target.iterdir()) == ["b.txt", "config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _written_by(path, pid, machine=None):
    """The prefix of a temporary file or folder beside `path` that process `pid` (of another machine) left."""
    prefix = temporary_prefix(path).replace(f".{os.getpid()}@", f".{pid}@")
    return prefix if machine is None else prefix[: prefix.index("@") + 1] + machine + "."


def test_a_save_removes_what_a_killed_writer_left_and_keeps_what_may_be_under_way(tmp_path):
    target, folder, other = tmp_path / "checkpoint.pt", tmp_path / "model", tmp_path / "checkpoint.pt.bak"
    finished = subprocess.Popen(["true"])
    finished.wait()  # a process that no longer runs: a writer killed midway
    running = subprocess.Popen(["sleep", "60"])  # another process, its save under way
    try:
        kept = [
            _written_by(target, running.pid) + "abc123.tmp",
            _written_by(target, finished.pid, machine="0123abcd") + "abc123.tmp",  # a shared disk: we cannot tell
            _written_by(other, finished.pid) + "abc123.tmp",  # another target's, left for its own saves
            _written_by(target, "9" * 30) + "abc123.tmp",  # no process id of ours
        ]
        for name in [*kept, _written_by(target, finished.pid) + "abc123.tmp"]:
            (tmp_path / name).write_bytes(b"half a checkpoint")
        (tmp_path / (_written_by(folder, finished.pid) + "xyz.partial")).mkdir()
        with replacing(target) as under_way:  # this process's own save, still being written: it stays
            under_way.write_bytes(b"a save under way")
            write_json_atomic(target, {"step": 1})
            save_dir_atomic(folder, _save("a.txt", "new"))
            left = sorted(p.name for p in tmp_path.iterdir())
    finally:
        running.kill()
        running.wait()
    assert left == sorted(["checkpoint.pt", "model", under_way.name, *kept])
    assert target.read_bytes() == b"a save under way"


def test_an_orphan_that_cannot_be_removed_leaves_the_save_succeeded(tmp_path, monkeypatch):
    target = tmp_path / "state.json"
    finished = subprocess.Popen(["true"])
    finished.wait()
    orphan = tmp_path / (_written_by(target, finished.pid) + "abc123.tmp")
    orphan.write_text("another user's, in a shared folder")
    unlink = Path.unlink
    monkeypatch.setattr(
        Path, "unlink", lambda p, **k: (_ for _ in ()).throw(PermissionError()) if p == orphan else unlink(p, **k)
    )
    write_json_atomic(target, {"step": 1})  # no error: the file is in place
    assert json.loads(target.read_text()) == {"step": 1} and orphan.exists()


def _fused(model_type: str):
    """A save like a fused ensemble's: hydra_config.json with the model's config, no config.json."""
    return lambda d: (d / "hydra_config.json").write_text(json.dumps({"model_config": {"model_type": model_type}}))


def _mimo(model_type: str):
    """A save like MIMO's: predictor.json recording its network's config, the weights beside it."""
    return lambda d: (d / "predictor.json").write_text(json.dumps({"model_config": {"model_type": model_type}}))


def _ensemble(model_type: str):
    """A save like a deep ensemble's: predictor.json and its members in subfolders."""

    def write(d):
        (d / "predictor.json").write_text("{}")
        (d / "member0").mkdir()
        (d / "member0" / "config.json").write_text(json.dumps({"model_type": model_type}))

    return write


def test_a_save_keeps_the_tokenizer_beside_it_and_refuses_to_replace_what_is_no_save(tmp_path):
    """HF's habit, tokenizer.save_pretrained(d) then model.save_pretrained(d), kept the model alone: the save
    replaced the directory whole. A directory of other files (no saved model) would have been deleted."""
    target = tmp_path / "model"
    target.mkdir()
    (target / "tokenizer.json").write_text("tok")
    save_dir_atomic(target, _save("weights", "1"))
    save_dir_atomic(target, _save("weights", "2"))  # saved again: still there
    assert (target / "tokenizer.json").read_text() == "tok" and (target / "weights").read_text() == "2"
    save_dir_atomic(target, lambda d: (_save("weights", "3")(d), (d / "tokenizer.json").write_text("new")))
    assert (target / "tokenizer.json").read_text() == "new"  # a save that writes its own wins

    image = tmp_path / "image"  # another kind of model saved over an image model: its image processor goes
    save_dir_atomic(image, lambda d: ((d / "config.json").write_text('{"model_type": "vit"}'),))
    (image / "preprocessor_config.json").write_text("{}")
    save_dir_atomic(image, lambda d: ((d / "config.json").write_text('{"model_type": "bert"}'),))
    assert not (image / "preprocessor_config.json").exists()
    # a fused ensemble or a predictor saved again over itself (load, fine-tune, save in place) kept no tokenizer:
    # they have no config.json; their model_type is the recorded config's or their first member's
    for name, save in (("fused", _fused), ("ensemble", _ensemble), ("mimo", _mimo)):
        save_dir_atomic(tmp_path / name, save("bert"))
        (tmp_path / name / "tokenizer.json").write_text("tok")
        save_dir_atomic(tmp_path / name, save("bert"))
        assert (tmp_path / name / "tokenizer.json").read_text() == "tok", name
        save_dir_atomic(tmp_path / name, save("vit"))
        assert not (tmp_path / name / "tokenizer.json").exists(), name
    hidden = tmp_path / "hidden"  # a tokenizer and a .DS_Store: no files of the user's to lose
    hidden.mkdir()
    (hidden / ".DS_Store").write_text("")
    (hidden / "vocab.txt").write_text("v")
    save_dir_atomic(hidden, _save("weights", "1"))
    assert (hidden / "vocab.txt").read_text() == "v"

    results = tmp_path / "results"
    results.mkdir()
    (results / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds notes.txt and no saved model: a save replaces its directory"):
        save_dir_atomic(results, _save("weights", "1"))
    assert [p.name for p in results.iterdir()] == ["notes.txt"]
    with pytest.raises(FileExistsError, match="is a file, not a directory"):
        save_dir_atomic(results / "notes.txt", _save("weights", "1"))


def test_rebatch_pads_token_inputs_and_keeps_order():
    from hydra_ensembles.data.loaders import rebatch

    a = {
        "input_ids": torch.tensor([[1, 2, 3]]),
        "attention_mask": torch.ones(1, 3, dtype=torch.long),
        "labels": torch.tensor([0]),
    }
    b = {"input_ids": torch.tensor([[4, 5], [6, 7]]), "attention_mask": torch.ones(2, 2, dtype=torch.long)}
    b["labels"] = torch.tensor([1, 1])
    out = rebatch([a, b], size=2)
    assert [x["input_ids"].tolist() for x in out] == [[[1, 2, 3], [4, 5, 0]], [[6, 7, 0]]]
    assert out[0]["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]] and "labels" not in out[0]
    with pytest.raises(ValueError, match="differs in shape"):
        rebatch([{"pixel_values": torch.zeros(1, 3, 4, 4)}, {"pixel_values": torch.zeros(1, 3, 8, 8)}], size=2)


def test_a_reader_waits_for_a_save_between_its_renames_and_puts_back_only_a_dead_one(tmp_path):
    """A reader that found the save between the writer's two renames put the previous one back: the writer's second
    rename then failed on a non-empty directory and the new save was lost."""
    target, previous = tmp_path / "out", tmp_path / ".out.hydra-previous"
    save_dir_atomic(target, _save("a.txt", "old"))
    target.rename(previous)  # the writer's first rename
    writer = threading.Timer(0.1, lambda: save_dir_atomic_second_rename(tmp_path, target))
    writer.start()
    with reading_dir(target, "saved model") as path:
        assert (path / "a.txt").read_text() == "new"  # the writer's save, not the previous one put back
    writer.join()
    assert previous.exists()  # left to the writer to remove
    shutil.rmtree(target)
    previous.rename(tmp_path / "kept")
    save_dir_atomic(tmp_path / "old", _save("a.txt", "old"))
    (tmp_path / "old").rename(tmp_path / ".gone.hydra-previous")  # a writer that died between its renames
    with reading_dir(tmp_path / "gone", "saved model") as path:
        assert (path / "a.txt").read_text() == "old"


def save_dir_atomic_second_rename(tmp_path, target):
    new = tmp_path / ".out.new"
    _save("a.txt", "new")(new.mkdir() or new)
    os.rename(new, target)


def test_a_failed_swap_puts_the_previous_save_back_and_leaves_nothing_behind(tmp_path, monkeypatch):
    target = tmp_path / "out"
    save_dir_atomic(target, _save("a.txt", "old"))
    renames = []
    real_rename = os.rename

    def rename(src, dst):
        renames.append(dst)
        if len(renames) == 2:  # the new save onto the path
            raise OSError("disk full")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="disk full"):
        save_dir_atomic(target, _save("a.txt", "new"))
    monkeypatch.undo()
    assert (target / "a.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_weights_load_in_the_dtypes_they_were_saved_in(tmp_path):
    """MultiHeadMLP came back float32 from a float64 save; a mixed save (bf16 weights, fp32 norm) was cast whole."""
    import safetensors.torch

    saved = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.LayerNorm(3))
    saved[0].to(torch.bfloat16)
    safetensors.torch.save_file({k: v.contiguous() for k, v in saved.state_dict().items()}, tmp_path / "w.safetensors")
    fresh = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.LayerNorm(3))
    fresh[1].weight.requires_grad_(False)  # what was frozen stays frozen
    loaded = load_weights(fresh, tmp_path / "w.safetensors")
    assert [p.dtype for p in loaded.parameters()] == [torch.bfloat16] * 2 + [torch.float32] * 2
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), saved.state_dict().values()))
    assert [p.requires_grad for p in loaded.parameters()] == [True, True, False, True]


def test_a_weights_file_that_is_no_safetensors_file_is_named_with_the_fix(tmp_path):
    """A Git LFS pointer cloned in place of the weights: the error names the file (or, read by HF's loader, the
    directory), not only safetensors' own 'header too large'."""
    pointer = tmp_path / "model.safetensors"
    pointer.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 12\n")
    with pytest.raises(
        ValueError, match=rf"cannot read the weights file {tmp_path}/model.safetensors \(.*git lfs pull"
    ):
        load_weights(torch.nn.Linear(1, 1), pointer)
    with pytest.raises(ValueError, match=rf"cannot read the weights file in '{tmp_path}' \(.*git lfs pull"):
        with reading_dir(tmp_path, "saved model"):
            safetensors.torch.load_file(pointer)  # as HF's loader reads it
