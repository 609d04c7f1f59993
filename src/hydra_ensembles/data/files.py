"""A user's own data, read into the dict batches every step takes.

Text: a CSV / TSV file with a header row, a JSONL file (one JSON object per line), or a plain-text file (one
example per line, no labels). Images: a folder with one sub-folder per class (`cats/001.png`, ...), a flat
folder of images (no labels), or — from Python — a numpy array (N, H, W) or (N, H, W, C), or a list of images.

    examples = read_examples("reviews.csv", text_column="review", label_column="stars")
    batches = text_batches(tokenizer, examples.inputs, label_ids(examples.labels, class_ids(model.config)))
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps

TEXT_SUFFIXES = (".csv", ".tsv", ".jsonl", ".txt")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


@dataclass
class Examples:
    """Examples read from one source: `inputs` are texts or PIL images, `labels` class names (None when the
    source has none), `names` say where each example came from ("line 3", "cats/001.png")."""

    inputs: list[Any]
    labels: list[str] | None
    names: list[str]
    kind: str  # "text" or "image"

    def __len__(self) -> int:
        return len(self.inputs)


def read_examples(
    path: str | os.PathLike, text_column: str = "text", label_column: str | None = None, labels_optional: bool = False
) -> Examples:
    """Text from a .csv / .tsv / .jsonl / .txt file, images from a folder (see the module docstring).

    `label_column` names the label column of a CSV / TSV / JSONL file (with `labels_optional`, a file without
    that column reads as unlabelled); images take their labels from the sub-folder names. Raises a ValueError
    naming the problem for anything unreadable or empty.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no data at {str(path)!r}: the path does not exist.")
    if path.is_dir():
        examples = read_image_folder(path)
    else:
        examples = read_texts(path, text_column, label_column, labels_optional)
    if not examples.inputs:
        raise ValueError(f"{str(path)!r} holds no examples.")
    return examples


def read_source(
    path: str | os.PathLike,
    kind: str,
    *,
    text_column: str = "text",
    label_column: str = "label",
    labelled: bool | None = None,
    flag: str = "data",
) -> Examples:
    """`read_examples`, checked against what the model reads (`kind`: "text" or "image"); errors name the source
    by `flag` (the command-line flag that gave it).

    labelled: True requires labels, False ignores them, None takes them when the source has them.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{flag} {str(path)!r} does not exist.")
    if labelled and path.is_file() and path.suffix.lower() == ".txt":
        raise ValueError(
            f"{flag} {str(path)!r} is plain text without labels; give a CSV or JSONL file with a {label_column!r} "
            "column."
        )
    column = label_column if labelled is not False and path.is_file() else None
    try:
        examples = read_examples(path, text_column, column, labels_optional=labelled is None)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}") from None
    if examples.kind != kind:
        hint = "a CSV / JSONL / .txt file" if kind == "text" else "a folder of images"
        raise ValueError(f"{flag} {str(path)!r} holds {examples.kind} data but the model reads {kind}s: give {hint}.")
    if labelled and examples.labels is None:
        raise ValueError(f"{flag} {str(path)!r} has no labels: give a folder with one sub-folder per class.")
    if labelled is False:
        examples.labels = None
    return examples


def read_texts(
    path: str | os.PathLike, text_column: str = "text", label_column: str | None = None, labels_optional: bool = False
) -> Examples:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        raise ValueError(
            f"cannot read {str(path)!r}: text data must be one of {', '.join(TEXT_SUFFIXES)}, and images a folder."
        )
    try:
        if suffix == ".txt":
            if label_column is not None and not labels_optional:
                raise ValueError(
                    f"{str(path)!r} is plain text (one example per line) and has no label column; "
                    "use a CSV or JSONL file for labelled data."
                )
            lines = [(n, line.strip()) for n, line in enumerate(text_lines(path), 1)]
            kept = [(n, line) for n, line in lines if line]
            return Examples([line for _, line in kept], None, [f"line {n}" for n, _ in kept], "text")
        records = _jsonl(path) if suffix == ".jsonl" else _csv(path, "\t" if suffix == ".tsv" else ",")
    except UnicodeDecodeError as error:
        raise ValueError(f"cannot read {str(path)!r}: it is not UTF-8 text ({error.reason}).") from None
    except csv.Error as error:  # e.g. a field over the csv module's size limit
        raise ValueError(f"cannot read {str(path)!r} as {suffix[1:].upper()}: {error}.") from None
    if not records:
        raise ValueError(f"{str(path)!r} holds no examples.")
    if labels_optional and label_column not in records[0][1]:
        label_column = None
    for column in (text_column, label_column):
        if column is not None and column not in records[0][1]:
            raise ValueError(
                f"{str(path)!r} has no column {column!r}; its columns are {sorted(records[0][1])}. "
                "Name the right one with --text-column / --label-column."
            )
    texts, labels, names = [], [], []
    for line, record in records:
        text = record.get(text_column)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{str(path)!r} line {line}: column {text_column!r} is empty or not text.")
        texts.append(text)
        names.append(f"line {line}")
        if label_column is not None:
            label = record.get(label_column)
            if label is None or str(label).strip() == "":
                raise ValueError(f"{str(path)!r} line {line}: the label ({label_column!r}) is missing.")
            labels.append(str(label).strip())
    return Examples(texts, labels if label_column is not None else None, names, "text")


def _csv(path: Path, delimiter: str) -> list[tuple[int, dict]]:
    """Rows as dicts by the header's names. utf-8-sig: Excel's byte-order mark is not part of the first column's
    name. A row with more or fewer fields than the header is refused: an unquoted comma would otherwise cut the
    text short.

    A TSV file is read unquoted first (a quote is text, as in GLUE's and most hand-written TSV files) and quoted
    again when it shows a quoting writer's marks (pandas, Python's csv, Excel: a field wrapped in quotes with its
    own quotes doubled) or a row does not fit the header (a quoted tab or line end). Read quoted, it must be
    strictly well formed (a closing quote followed by a tab or a line end) and every row must fit: otherwise the
    unquoted reading's error stands, since a stray quote could have merged lines."""
    if delimiter != "\t":
        return _rows(path, delimiter, csv.QUOTE_MINIMAL)
    try:
        rows = _rows(path, delimiter, csv.QUOTE_NONE)
    except _FieldCount as error:
        try:
            return _rows(path, delimiter, csv.QUOTE_MINIMAL, strict=True)
        except (csv.Error, _FieldCount):
            raise error from None
    quoted = any(_QUOTED_FIELD.fullmatch(value) for _, row in rows for value in (*row, *row.values()))
    return _rows(path, delimiter, csv.QUOTE_MINIMAL) if quoted else rows


_QUOTED_FIELD = re.compile(r'"(?:[^"]|"")*""(?:[^"]|"")*"')  # "...""..." : quoted, with a doubled quote inside


class _FieldCount(ValueError):
    """A row with more or fewer fields than the header, at line `line` (1-based) of the file."""

    def __init__(self, message: str, line: int):
        super().__init__(message)
        self.line = line


def _rows(path: Path, delimiter: str, quoting: int, strict: bool = False) -> list[tuple[int, dict]]:
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f, delimiter=delimiter, quoting=quoting, strict=strict)
        if reader.fieldnames is None:
            return []
        rows = []
        for row in reader:
            if None in row or None in row.values():
                fields = sum(v is not None for k, v in row.items() if k is not None) + len(row.get(None) or ())
                raise _FieldCount(
                    f"{str(path)!r} line {reader.line_num}: {fields} fields where the header has "
                    f"{len(reader.fieldnames)}"
                    + (': quote a text that holds commas ("like, this").' if delimiter == "," else "."),
                    reader.line_num,
                )
            rows.append((reader.line_num, row))
        return rows


def text_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a text file, split at line ends only (\\n, \\r\\n, \\r): str.splitlines would also split at
    form feeds, U+0085 and U+2028, which JSON and texts may hold. utf-8-sig: a byte-order mark is not text."""
    return Path(path).read_text(encoding="utf-8-sig").split("\n")


def _jsonl(path: Path) -> list[tuple[int, dict]]:
    records = []
    for line, text in enumerate(text_lines(path), 1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{str(path)!r} line {line} is not valid JSON: {error.msg}.") from None
        if not isinstance(record, dict):
            raise ValueError(f'{str(path)!r} line {line} is not a JSON object ({{"text": ..., "label": ...}}).')
        records.append((line, record))
    return records


def read_image_folder(path: str | os.PathLike) -> Examples:
    """A folder of class sub-folders (labels = sub-folder names, sorted), or a flat folder of images."""
    path = Path(path)
    classes = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if classes and (loose := _image_files(path)):  # which did the user mean? Reading either drops the other
        raise ValueError(
            f"{str(path)!r} holds both images ({loose[0].name}, ...: {len(loose)}) and sub-folders "
            f"({', '.join(c.name for c in classes[:3])}): give a flat folder of images, or one sub-folder per class "
            "with every image inside one."
        )
    groups = [(c.name, _image_files(c)) for c in classes] if classes else [(None, _image_files(path))]
    images, labels, names = [], [], []
    for label, files in groups:
        for file in files:
            images.append(_open_image(file))
            labels.append(label)
            names.append(str(file.relative_to(path)))
    if not images:
        raise ValueError(
            f"{str(path)!r} holds no images ({', '.join(IMAGE_SUFFIXES)}): give a folder with one sub-folder of "
            "images per class, or a flat folder of images."
        )
    return Examples(images, labels if classes else None, names, "image")


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))


def _open_image(file: Path) -> Image.Image:
    try:
        with Image.open(file) as image:
            image.load()
    except OSError as error:
        raise ValueError(f"cannot read image {str(file)!r}: {error}.") from None
    try:
        return ImageOps.exif_transpose(image)  # upright as taken, as HF's load_image reads a phone photo
    except Exception:  # noqa: BLE001 - malformed EXIF: the pixels are fine, read them as stored
        return image


def class_ids(config: Any) -> dict[str, int]:
    """A classifier's class names -> ids: `config.id2label` inverted (HF saves `label2id` as null when only
    id2label was given, and leaves it at LABEL_i when id2label was set by hand), then any other name
    `label2id` adds."""
    names = {str(name): int(i) for i, name in (getattr(config, "id2label", None) or {}).items()}
    for name, i in (getattr(config, "label2id", None) or {}).items():
        names.setdefault(str(name), int(i))
    return names


def label_ids(
    labels: Sequence[str | int], label2id: Mapping[str, int] | None, num_labels: int | None = None
) -> list[int]:
    """Class names (or integer ids) -> ids, by the model's class names (`class_ids(config)`).

    Names the model knows map through `label2id`; otherwise integer ids 0..num_labels-1 are accepted as they are,
    unless the model's class names are themselves integers (then "1" could mean either: refused).
    """
    label2id = dict(label2id or {})
    num_labels = num_labels if num_labels is not None else len(label2id)
    names = [str(label) for label in labels]
    if all(name in label2id for name in names):
        return [int(label2id[name]) for name in names]
    integer_names = any(_is_int(name) for name in label2id)
    if not integer_names and all(_is_int(name) and 0 <= int(name) < num_labels for name in names):
        return [int(name) for name in names]
    unknown = sorted({name for name in names if name not in label2id})
    beyond = sorted({int(name) for name in unknown if _is_int(name) and not 0 <= int(name) < num_labels})
    if not integer_names and beyond and all(_is_int(name) for name in unknown):  # ids, some out of range
        raise ValueError(
            f"label id(s) {beyond[:5]} are outside the model's {num_labels} classes (ids 0..{num_labels - 1}, "
            f"{sorted(label2id, key=label2id.get)}): number the classes from 0 (labels 1..{num_labels} are one off), "
            "or use the class names."
        )
    raise ValueError(
        f"label(s) {unknown[:5]} are not classes of the model, whose classes are {sorted(label2id, key=label2id.get)}"
        + ("; use those names." if integer_names else f"; use those names or integer ids 0..{num_labels - 1}.")
    )


def _is_int(name: str) -> bool:
    return name.lstrip("-").isdigit()


@dataclass
class Encoded:
    """One data source, read and encoded for one model: `batches` are dicts of model inputs (+ labels); `cut`:
    how many texts were longer than the token limit and lost their end."""

    examples: Examples
    batches: list[dict[str, torch.Tensor]]
    cut: int = 0


def read_encoded(
    path: str | os.PathLike,
    kind: str,
    preprocessor,
    config: Any,
    *,
    labelled: bool | None = None,
    flag: str = "data",
    text_column: str = "text",
    label_column: str = "label",
    batch_size: int = 16,
    max_length: int = 128,
) -> Encoded:
    """`read_source`, encoded: texts through a tokenizer (cut at `token_limit`: `max_length`, or the model's
    positions if fewer), images through an image processor (to as many channels as `config.num_channels`), with
    label ids by the model's class names (`class_ids`) when the examples have labels."""
    examples = read_source(path, kind, text_column=text_column, label_column=label_column, labelled=labelled, flag=flag)
    labels = None
    if examples.labels is not None:
        try:
            labels = label_ids(examples.labels, class_ids(config), config.num_labels)
        except ValueError as error:
            raise ValueError(f"{flag} {str(path)!r}: {error}") from None
    if kind == "text":
        batches = text_batches(preprocessor, examples.inputs, labels, batch_size, max_length, config)
        return Encoded(examples, batches, cut=texts_cut(preprocessor, examples.inputs, max_length, config))
    channels = getattr(config, "num_channels", 3)
    return Encoded(examples, image_batches(preprocessor, examples.inputs, labels, batch_size, channels))


def text_batches(
    tokenizer,
    texts: Sequence[str],
    labels: Sequence[int] | None = None,
    batch_size: int = 16,
    max_length: int = 128,
    config: Any = None,
) -> list[dict[str, torch.Tensor]]:
    """Tokenized batches: input_ids / attention_mask (B, T), plus labels (B,) when given. Texts are cut at
    `token_limit` tokens: `max_length`, or the model's positions if fewer."""
    max_length = token_limit(tokenizer, max_length, config)
    return _batched(
        len(texts),
        labels,
        batch_size,
        lambda rows: dict(
            tokenizer(
                [texts[i] for i in rows], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
            )
        ),
    )


def token_limit(tokenizer, max_length: int, config: Any = None) -> int:
    """Where `text_batches` cuts a text: at `max_length` tokens, or the model's positions if fewer (the
    tokenizer's `model_max_length`, and `model_positions(config)` for a tokenizer saved without one); past those
    the forward pass fails. A `max_length` that leaves no token for the text after the tokenizer's special ones
    ([CLS], [SEP]) is refused: the tokenizer would silently cut nothing."""
    special = tokenizer.num_special_tokens_to_add(pair=False)
    if max_length <= special:
        raise ValueError(
            f"max_length {max_length} leaves no token for the text: the tokenizer adds {special} special token(s); "
            f"give more than {special} (--max-length)."
        )
    return min(max_length, tokenizer.model_max_length, model_positions(config) or max_length)


# families whose position ids start after the padding index (HF's create_position_ids_from_input_ids)
POSITIONS_AFTER_PADDING = ("roberta", "xlm-roberta", "camembert", "data2vec-text", "mpnet")


def model_positions(config: Any) -> int | None:
    """The most tokens the model's learned position embeddings take (`max_position_embeddings`, less the padding
    offset of the RoBERTa family); None for relative positions only (DeBERTa's `position_biased_input` off) or a
    config without them. A tokenizer saved without `model_max_length` leaves this the only limit."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None or getattr(config, "position_biased_input", True) is False:
        return None
    if getattr(config, "model_type", None) in POSITIONS_AFTER_PADDING:
        positions -= (getattr(config, "pad_token_id", None) or 0) + 1
    return positions


def texts_cut(tokenizer, texts: Sequence[str], max_length: int = 128, config: Any = None) -> int:
    """How many of `texts` `text_batches` cuts: longer than `token_limit` tokens."""
    limit, cut = token_limit(tokenizer, max_length, config), 0
    for start in range(0, len(texts), 1024):  # cut one token past the limit: memory bounded by the limit
        lengths = tokenizer(
            list(texts[start : start + 1024]),
            truncation=True,
            max_length=limit + 1,
            return_length=True,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["length"]
        cut += sum(length > limit for length in lengths)
    return cut


def image_batches(
    processor,
    images: np.ndarray | Sequence[Any],
    labels: Sequence[int] | None = None,
    batch_size: int = 32,
    channels: int = 3,
) -> list[dict[str, torch.Tensor]]:
    """Batches of pixel_values (B, C, H, W) from an image processor, plus labels (B,) when given.

    `images`: PIL images, or arrays (H, W) / (H, W, C) — uint8 0..255 or float 0..1 — or one array (N, H, W[, C]).
    `channels`: what the model reads (its config.num_channels): 3 makes every image RGB, 1 greyscale.
    """
    pil = [_to_pil(image, channels) for image in images]
    return _batched(
        len(pil), labels, batch_size, lambda rows: dict(processor(images=[pil[i] for i in rows], return_tensors="pt"))
    )


def _to_pil(image: Any, channels: int) -> Image.Image:
    if isinstance(image, Image.Image) and image.mode in WIDE_MODES:
        image = _to_8_bits(image)
    if not isinstance(image, Image.Image):
        array = np.asarray(image)
        if array.ndim not in (2, 3):
            raise ValueError(f"an image must be (H, W) or (H, W, C), got an array of shape {array.shape}.")
        if np.issubdtype(array.dtype, np.integer) and array.dtype != np.uint8:  # integer pixels are 0..255
            if array.min(initial=0) < 0 or array.max(initial=0) > 255:
                raise ValueError(f"integer image pixels must be 0..255, got {array.min()}..{array.max()}.")
            array = array.astype(np.uint8)
        elif array.dtype != np.uint8:
            if array.min(initial=0.0) < 0 or array.max(initial=0.0) > 1:  # 0..255 floats would all clip to white
                raise ValueError(
                    f"float image pixels must be 0..1, got {array.min():g}..{array.max():g}: divide 0..255 by 255."
                )
            array = (array.astype(np.float32) * 255).round().astype(np.uint8)
        image = Image.fromarray(array[..., 0] if array.ndim == 3 and array.shape[-1] == 1 else array)
    if image.has_transparency_data:  # an alpha band, an RGBA palette, or a transparent colour (P, L, RGB)
        image = _on_white(image)
    return image.convert("RGB" if channels == 3 else "L")


def _on_white(image: Image.Image) -> Image.Image:
    """A transparent image composited onto white, as transformers' `convert_to_rgb` does: PIL's convert("RGB")
    drops the alpha channel, which shows whatever colour the transparent pixels hold (often black)."""
    rgba = image.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)


WIDE_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")  # PIL modes wider than 8 bits a channel


def _to_8_bits(image: Image.Image) -> Image.Image:
    """A 16-bit image (a PNG or TIFF scan) as 8 bits, its full range to the full range: PIL's own convert("L")
    clips every value above 255 to white. A transparent grey (a PNG's tRNS) becomes an alpha band (mode "LA"). A
    32-bit integer image whose pixels fit 16 bits is read as 16 bits (some readers open 16-bit files so); wider
    ones and float images have no fixed range: refused."""
    if not image.mode.startswith("I;16") and not (image.mode == "I" and np.asarray(image).max(initial=0) <= 65535):
        raise ValueError(
            f"an image in PIL mode {image.mode!r} (32-bit, beyond 16 bits or float) has no fixed pixel range: "
            "convert it to 8 or 16 bits, or pass it as a float array scaled to 0..1."
        )
    array = np.asarray(image).astype(np.float32)
    if array.min(initial=0) < 0:
        raise ValueError(f"a 16-bit image's pixels must be 0..65535, got {array.min():g}..{array.max():g}.")
    grey = (array / 257).round().astype(np.uint8)
    transparent = image.info.get("transparency")  # a PNG's 16-bit transparent grey (tRNS)
    if not isinstance(transparent, int):
        return Image.fromarray(grey)
    # an alpha band, not an 8-bit transparent grey: other 16-bit greys round to the same 8 bits
    alpha = np.where(array == transparent, 0, 255).astype(np.uint8)
    return Image.fromarray(np.stack([grey, alpha], axis=-1), mode="LA")


def _batched(count: int, labels, batch_size: int, encode) -> list[dict[str, torch.Tensor]]:
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}.")
    if labels is not None and len(labels) != count:
        raise ValueError(f"{count} inputs but {len(labels)} labels: give one label per input.")
    batches = []
    for start in range(0, count, batch_size):
        rows = list(range(start, min(start + batch_size, count)))
        batch = encode(rows)
        if labels is not None:
            batch["labels"] = torch.tensor([int(labels[i]) for i in rows])
        batches.append(batch)
    return batches
