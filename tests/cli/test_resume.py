"""An interrupted `hydra-ens finetune` (Ctrl-C after an epoch) resumes from its checkpoint when the same command
is run again, and ends with exactly the weights of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch
from cli_support import TOPICS, hydra_ens, sentences, text_encoder

import hydra_ensembles as he


def test_interrupted_finetune_resumes_to_the_uninterrupted_result(tmp_path, text_encoder):
    train = tmp_path / "train.csv"
    rows = [f"{text},{topic}\n" for i, (topic, words) in enumerate(TOPICS.items()) for text in sentences(words, 200, i)]
    train.write_text("text,label\n" + "".join(rows))
    args = ["finetune", "--model", str(text_encoder), "--data", str(train), "--epochs", "6", "--lr", "1e-3"]
    out = tmp_path / "interrupted"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    process = subprocess.Popen(
        [sys.executable, "-m", "hydra_ensembles.cli", *args, "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # a shell that runs the tests in the background (`cmd &`) ignores SIGINT, and the child would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    checkpoint = out / "checkpoints" / "model" / "checkpoint.pt"
    deadline = time.monotonic() + 240
    while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr  # interrupted after the first epoch's checkpoint, before the end
    assert "interrupted; run the same command again to resume" in stderr
    assert not (out / "model").exists()

    resumed = hydra_ens(*args, "--out", str(out))
    # a seeded restart would end with the same weights too: that the loop reads the checkpoint is tested in
    # tests/training/test_loop.py (it counts the resumed run's steps); here, that the CLI hands it the same folder
    assert "resuming from" in resumed.stdout
    assert not (out / "checkpoints").exists()  # cleaned up once the model is saved
    uninterrupted = hydra_ens(*args, "--out", str(tmp_path / "straight"))
    assert "resuming" not in uninterrupted.stdout
    a, b = he.load_model(out / "model"), he.load_model(tmp_path / "straight" / "model")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, atol=0, rtol=0, msg=name)
