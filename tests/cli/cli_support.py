"""Fixtures and helpers for the CLI tests: tiny models saved as a user would have them on disk (with their
tokenizer / image processor), data files of the kinds users have, and `hydra-ens` run in a subprocess (or, for
refusals, in this process: `refused`).

Test modules import the fixtures they use from here (a second conftest.py would shadow tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as T
from conftest import build_clip_tokenizer
from PIL import Image

from hydra_ensembles.cli import main

TOPICS = {
    "sports": "match goal team player coach league score win season cup",
    "politics": "vote minister party election government law parliament policy debate tax",
    "business": "market shares profit bank company sales growth price trade investor",
}
OTHER = "recipe oven flour sugar butter bake garden flower seed soil rain"
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def sentences(words: str, count: int, seed: int) -> list[str]:
    rng, vocabulary = random.Random(seed), words.split()
    return [" ".join(rng.choices(vocabulary, k=rng.randint(5, 12))) for _ in range(count)]


def hydra_ens(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `hydra-ens ARGS` as a user would (a new process, progress bars off)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("HYDRA_ENS_DEBUG", None)
    result = subprocess.run(
        [sys.executable, "-m", "hydra_ensembles.cli", *args, "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"hydra-ens {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def refused(*args: str) -> subprocess.CompletedProcess:
    """`hydra-ens ARGS` run in this process (`main`, what the console script calls), for commands expected to be
    refused: they stop before any work, so a new process would spend its time on start-up alone (~4 s of torch
    and transformers imports a call). Returns what `hydra_ens` returns: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([*args, "--quiet"])
        except SystemExit as exit:  # argparse's own refusals
            code = exit.code
    return subprocess.CompletedProcess(["hydra-ens", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def text_files(tmp_path_factory) -> dict[str, Path]:
    """train.csv, val.jsonl, test.csv (labelled), ood.txt (unlabelled), new.txt (mixed inputs to predict)."""
    root = tmp_path_factory.mktemp("text-data")

    def rows(count: int, seed: int) -> list[tuple[str, str]]:
        out = [
            (text, topic)
            for i, (topic, words) in enumerate(TOPICS.items())
            for text in sentences(words, count, seed + i)
        ]
        random.Random(seed).shuffle(out)
        return out

    with (root / "train.csv").open("w") as f:
        f.write("text,label\n" + "".join(f"{t},{label}\n" for t, label in rows(24, 0)))
    with (root / "val.jsonl").open("w") as f:
        f.writelines(json.dumps({"text": t, "label": label}) + "\n" for t, label in rows(8, 10))
    with (root / "test.csv").open("w") as f:
        f.write("label,review\n" + "".join(f"{label},{t}\n" for t, label in rows(8, 20)))  # other column names
    (root / "ood.txt").write_text("\n".join(sentences(OTHER, 16, 30)) + "\n")
    (root / "new.txt").write_text("\n".join(sentences(TOPICS["sports"], 2, 40) + sentences(OTHER, 2, 41)) + "\n")
    return {p.stem: p for p in root.iterdir()}


@pytest.fixture(scope="session")
def text_encoder(tmp_path_factory) -> Path:
    """A tiny BERT encoder (no classifier) with a WordPiece tokenizer over the test vocabulary."""
    root = tmp_path_factory.mktemp("tiny-bert")
    words = sorted({w for text in [*TOPICS.values(), OTHER] for w in text.split()})
    T.BertTokenizer(vocab={token: i for i, token in enumerate(SPECIAL + words)}).save_pretrained(root)
    torch.manual_seed(0)
    config = T.BertConfig(
        vocab_size=len(SPECIAL) + len(words),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
    )
    T.BertModel(config).save_pretrained(root)
    return root


@pytest.fixture(scope="session")
def image_files(tmp_path_factory) -> dict[str, Path]:
    """train/ and test/ (a sub-folder per class: bright, dark), ood/ (flat folder of striped images)."""
    root = tmp_path_factory.mktemp("image-data")
    rng = np.random.default_rng(0)
    for split, count in (("train", 12), ("test", 6)):
        for label, level in (("bright", 200), ("dark", 50)):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(level + rng.normal(0, 20, (20, 20, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:03d}.png")
    (root / "ood").mkdir()
    for i in range(6):
        pixels = np.zeros((20, 20, 3), np.uint8)
        pixels[::2] = 255
        Image.fromarray(pixels).save(root / "ood" / f"stripes{i}.png")
    return {p.name: p for p in root.iterdir()}


@pytest.fixture(scope="session")
def image_classifier(tmp_path_factory) -> Path:
    """A tiny ViT classifier (classes bright / dark) with its image processor."""
    root = tmp_path_factory.mktemp("tiny-vit")
    torch.manual_seed(0)
    config = T.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        num_labels=2,
        id2label={0: "bright", 1: "dark"},
        label2id={"bright": 0, "dark": 1},
    )
    T.ViTForImageClassification(config).save_pretrained(root)
    T.ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(root)
    return root


@pytest.fixture(scope="session")
def clip_model(tmp_path_factory) -> Path:
    """A tiny two-tower CLIPModel as a user would have it: config, weights, tokenizer, image processor. The
    tokenizer is a real CLIPTokenizer over a small vocabulary (tests/conftest.py); the text tower pools at EOS."""
    root = tmp_path_factory.mktemp("tiny-clip")
    words = ["a", "an", "photo", "picture", "of", "the", "bright", "dark", "image", "grey"]
    tokenizer = build_clip_tokenizer(words, size=120, max_length=32)
    tokenizer.save_pretrained(root)
    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    ids = {f"{kind}_token_id": getattr(tokenizer, f"{kind}_token_id") for kind in ("pad", "bos", "eos")}
    text = dict(vocab_size=120, max_position_embeddings=32, **ids)
    torch.manual_seed(0)
    config = T.CLIPConfig(
        text_config=text | sizes, vision_config=dict(image_size=16, patch_size=4) | sizes, projection_dim=16
    )
    T.CLIPModel(config).save_pretrained(root)
    T.CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(root)
    return root
