"""Export: a fused Hydra Ensemble, or one (pruned) model, as an ONNX graph for ONNX Runtime and other runtimes.

The graph takes what the model's tokenizer or image processor gives (input_ids, attention_mask, ... or
pixel_values), for any batch size and sequence length, and returns member_logits (B, M, C): average the members'
softmax for the ensemble's prediction. It is traced on an example made with the tokenizer or image processor
saved beside the model. Needs `pip install '.[export]'` from the clone. See docs/export.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from ..data.files import image_batches
from ..export import export_onnx, output_name
from ..predictors import load_predictor, load_preprocessor, model_config
from .common import CommandError
from .step import check_model_dir

EXAMPLE = """hydra-ens export hydra hydra.onnx          # the fused ensemble in hydra/ (the output of fuse)
hydra-ens export members/member0 member0.onnx   # one pruned member"""
# the example the graph is traced on: two texts of different lengths (padded), or two images
EXAMPLE_TEXTS = ("An example to trace the graph with.", "A second, longer example, so that the batch has padding.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="the saved ensemble or model (a directory with its tokenizer or processor)")
    parser.add_argument("out", help="the ONNX file to write (e.g. hydra.onnx)")


def run(args: argparse.Namespace) -> int:
    model_dir = check_model_dir(args.model, "MODEL")
    out = Path(args.out)
    if out.is_dir():
        raise CommandError(f"OUT {str(out)!r} is a directory; give a file name such as model.onnx.")
    predictor = load_predictor(model_dir)
    try:
        channels = getattr(model_config(predictor), "num_channels", 3)
    except (AttributeError, ValueError):  # no HF config (an MLP student): export_onnx says what it cannot export
        channels = 3
    example = example_inputs(model_dir, channels)
    export_onnx(predictor, out, example)
    output = output_name(predictor)
    shape = "(B, M, C)" if output == "member_logits" else "(B, M, D)"
    print(f"wrote {out}: inputs {', '.join(example)} -> {output} {shape}")
    return 0


def example_inputs(model_dir: Path, channels: int = 3) -> dict[str, Any]:
    """Two examples made by the tokenizer or image processor saved in `model_dir`; images with the model's
    `channels` (its config.num_channels), as `hydra-ens predict` would make them."""
    kind, preprocessor = load_preprocessor(model_dir)
    if kind == "text":
        return dict(preprocessor(list(EXAMPLE_TEXTS), padding=True, return_tensors="pt"))
    noise = np.random.default_rng(0).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
    return {"pixel_values": image_batches(preprocessor, noise, batch_size=2, channels=channels)[0]["pixel_values"]}
