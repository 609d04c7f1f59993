"""The sentiment data (vaderSentiment's source archive, fetched from PyPI once) and the text task built on it."""

import pytest

from hydra_ensembles.bench.datasets.text import load_sentiment
from hydra_ensembles.bench.tasks import SENTIMENT_SIZES, sentiment_data

# Sentences per domain as published with the data (Hutto & Gilbert 2014; ../shared/DATA.md), and how many of
# their lines carry a mean rating of exactly 0.0 (counted on the raw files once, outside the loader): those
# have no sign, and the loader drops them.
PUBLISHED = {"movies": 10_605, "amazon": 3_708, "nyt": 5_190, "tweets": 4_200}
NEUTRAL = {"movies": 37, "amazon": 98, "nyt": 244, "tweets": 4}


@pytest.mark.parametrize("domain", sorted(PUBLISHED))
def test_each_domain_has_its_published_sentences_labelled_by_sign(domain):
    rows = load_sentiment(domain)
    assert len(rows) == PUBLISHED[domain] - NEUTRAL[domain]
    assert {label for _, _, label in rows} == {0, 1}
    assert all(text and not text.startswith("\ufeff") for _, text, _ in rows)  # BOMs and blank lines gone
    if domain in ("amazon", "nyt"):  # sentences of one review/article share the id before "_"
        assert len({group for group, _, _ in rows}) < len(rows) / 5


def test_sentiment_splits_are_disjoint_and_balanced():
    import random

    data = sentiment_data(SENTIMENT_SIZES["quick"], random.Random(0))
    train, val, test = (set(split[0]) for split in (data.train, data.val, data.test))
    assert not (train & val or train & test or val & test)
    assert sum(data.train[1]) == len(data.train[1]) // 2  # as many positive as negative sentences
    assert set(data.near) == {"amazon"} and not (set(data.near["amazon"]) & (train | test))
