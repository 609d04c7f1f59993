"""The README runs as written: its Python quick start, its "Start from your fine-tuned model" commands (on a tiny
saved classifier), and every `hydra-ens` command line in it and in docs/ names flags the parsers have."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as T
from tolerances import U32, reordered_sum

from hydra_ensembles.cli import build_parser
from hydra_ensembles.cli.step import RECORD

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
PREDICT_KEYS = {"input", "prediction", "probability", "mutual_information", "ood_score", "ood", "score", "threshold"}


def section(heading: str, text: str = README) -> str:
    """The text under the heading `heading` (any level), up to the next heading of that level or above."""
    match = re.search(rf"^(#+) {re.escape(heading)}$", text, re.M)
    assert match, f"no heading {heading!r}"
    body = text[match.end() :]
    end = re.search(rf"^#{{1,{len(match.group(1))}}} ", body, re.M)
    return body[: end.start()] if end else body


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


# ---- the Python quick start ----


@pytest.mark.real_model
def test_readme_quick_start_runs(minilm_path, capsys, tmp_path, monkeypatch):
    code = code_blocks(section("Python quick start"), "python")[0]
    assert len([line for line in code.strip().splitlines() if line.strip()]) <= 12
    mine = tmp_path / "my-classifier"  # the reader's fine-tuned classifier: MiniLM with a head of 3 classes
    T.AutoModelForSequenceClassification.from_pretrained(minilm_path, num_labels=3).save_pretrained(mine)
    T.AutoTokenizer.from_pretrained(minilm_path).save_pretrained(mine)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    out = namespace["out"]
    assert out.member_logits.shape == (3, 3, 3)
    # each member's float32 softmax sums to 1 within the rounding of 3 terms; the mean of 3 members adds 3 more
    assert out.probs.sum(-1).sub(1).abs().max() <= reordered_sum(9, 1.0, U32)
    assert capsys.readouterr().out.strip()


# ---- "Start from your fine-tuned model", run as written ----

TOPICS = {
    "sports": "match goal team player coach league score win season cup",
    "politics": "vote minister party election government law parliament policy debate tax",
    "business": "market shares profit bank company sales growth price trade investor",
}
OTHER = {
    "near": "phone chip software screen laptop network data app robot internet",
    "far": "recipe oven flour sugar butter bake garden flower seed soil rain",
}
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def sentences(words: str, count: int, seed: int) -> list[str]:
    rng, vocabulary = random.Random(seed), words.split()
    return [" ".join(rng.choices(vocabulary, k=rng.randint(5, 12))) for _ in range(count)]


def labelled_csv(path: Path, per_class: int, seed: int) -> None:
    topics = enumerate(TOPICS.items())
    rows = [(text, topic) for i, (topic, words) in topics for text in sentences(words, per_class, seed + i)]
    random.Random(seed).shuffle(rows)
    path.write_text("text,label\n" + "".join(f"{text},{label}\n" for text, label in rows))


def saved_classifier(path: Path) -> None:
    """A tiny BERT sequence classifier over the three topics, saved as `save_pretrained` does, with a WordPiece
    tokenizer over the test vocabulary (built offline): 2 layers x 6 heads, so a third of them can be pruned."""
    words = sorted({w for text in [*TOPICS.values(), *OTHER.values()] for w in text.split()})
    T.BertTokenizer(vocab={token: i for i, token in enumerate(SPECIAL + words)}).save_pretrained(path)
    torch.manual_seed(0)
    config = T.BertConfig(
        vocab_size=len(SPECIAL) + len(words),
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=6,
        intermediate_size=64,
        max_position_embeddings=64,
        id2label=dict(enumerate(TOPICS)),
        label2id={topic: i for i, topic in enumerate(TOPICS)},
    )
    T.BertForSequenceClassification(config).save_pretrained(path)


def user_files(root: Path) -> None:
    """Every file the README's commands name, small: my-classifier/ and the splits of its table."""
    saved_classifier(root / "my-classifier")
    labelled_csv(root / "train.csv", 12, 0)
    labelled_csv(root / "val.csv", 6, 10)
    labelled_csv(root / "test.csv", 6, 20)
    (root / "ood-val.txt").write_text("\n".join(sentences(OTHER["near"], 4, 30) + sentences(OTHER["far"], 4, 31)))
    (root / "near-ood-test.csv").write_text("text\n" + "\n".join(sentences(OTHER["near"], 8, 32)) + "\n")
    (root / "far-ood-test.txt").write_text("\n".join(sentences(OTHER["far"], 8, 33)) + "\n")
    (root / "new.txt").write_text("\n".join(sentences(TOPICS["sports"], 2, 40) + sentences(OTHER["far"], 2, 41)))


def flag_values(commands: str, flag: str) -> list[str]:
    return [value for line in commands.splitlines() for value in re.findall(rf"{flag} (\S+)", line)]


def test_readme_start_from_your_model_runs(tmp_path):
    block = code_blocks(section("Start from your fine-tuned model"), "bash")[0]
    user_files(tmp_path)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the venv's hydra-ens
    env.pop("HYDRA_ENS_DEBUG", None)
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + block],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"the README's commands failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    outs = flag_values(block, "--out")
    assert {"scores", "members", "members-tuned", "hydra", "hydra-calibrated", "report"} <= set(outs)
    for out in outs:
        assert (tmp_path / out / RECORD).is_file(), f"--out {out} has no {RECORD}"
    assert (tmp_path / "report" / "report.md").is_file() and (tmp_path / "report" / "metrics.json").is_file()
    (output,) = flag_values(block, "--output")
    rows = [json.loads(line) for line in (tmp_path / output).read_text().splitlines()]
    assert len(rows) == 4
    assert all(set(row) == PREDICT_KEYS for row in rows)
    documented = section("Reading `predict`'s output")
    assert all(f"`{key}`" in documented for key in PREDICT_KEYS), "the README names every key predict writes"


# ---- every command line in the README and docs/ names real flags ----

PARSER = build_parser()
SUBPARSERS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices


def command_lines(text: str) -> list[str]:
    """`hydra-ens ...` lines of the bash / console code blocks (continuations joined), and inline code spans that
    start with `hydra-ens` or with a command name followed by a flag (`fuse --mlp stack`)."""
    lines = []
    for block in code_blocks(text, "(?:bash|console|sh)?"):
        joined = re.sub(r"\\\n\s*", " ", block)
        lines += [line.strip() for line in joined.splitlines() if line.strip().startswith("hydra-ens ")]
    for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text):
        first = span.split()[0] if span.split() else ""
        if first == "hydra-ens" or (first in SUBPARSERS and " --" in span):
            lines.append(span if first == "hydra-ens" else f"hydra-ens {span}")
    return lines


def unknown_flags(line: str) -> list[str]:
    """What in `line` the parsers do not know: the command, or flags the command does not have. Placeholders
    (`<command>`, `text|image`, `[--quick]`, `...`) are skipped."""
    words = shlex.split(line, comments=True)[1:]
    if not words or words[0].startswith("-"):
        return [w for w in words if w.startswith("--") and w.split("=")[0] not in ("--help", "--version")]
    command, *rest = words
    if not re.fullmatch(r"[a-z][a-z-]*", command):
        return []
    if command not in SUBPARSERS:
        return [command]
    known = set(SUBPARSERS[command]._option_string_actions)
    flags = [w.strip("[]").split("=")[0] for w in rest if w.strip("[").startswith("--")]
    return [flag for flag in flags if flag not in known]


def test_readme_code_blocks_parse_in_full(tmp_path):
    """The README's code-block commands parse as written: flags, values, choices and required flags."""
    lines = [line for block in code_blocks(README, "bash") for line in command_lines(f"```bash\n{block}```")]
    assert len(lines) >= 7
    for line in lines:
        try:
            PARSER.parse_args(shlex.split(line, comments=True)[1:])
        except SystemExit as exit:
            pytest.fail(f"README.md: {line!r} does not parse (exit {exit.code})")


@pytest.mark.parametrize("path", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_commands_name_real_flags(path):
    text = (ROOT / path if path == "README.md" else ROOT / "docs" / path).read_text()
    wrong = {line: bad for line in command_lines(text) if (bad := unknown_flags(line))}
    assert not wrong, f"{path}: commands or flags hydra-ens does not have: {wrong}"
