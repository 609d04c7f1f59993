"""Export a predictor as one graph: `torch.export` and ONNX, with a dynamic batch (and sequence length for text).

What is exported: a fused Hydra Ensemble, or one (pruned) Hugging Face model of a supported family. The graph takes
the model's inputs by their HF names (input_ids, attention_mask, ... or pixel_values) and returns the member
outputs: `member_logits` (B, M, C) for classifiers, `member_pooled` (B, M, D) for encoders (M = 1 for one model).
The ensemble probability is then the mean over M of softmax(member_logits), as in PyTorch.

Traced path: the fused engine's steps (`embed`, `run_layers`, `classify`), not `HydraEnsemble.forward`, whose row
chunking loops over the batch in Python (which would fix B) and whose input checks hash shapes (which a traced
size cannot be). ONNX goes through the dynamo exporter (`torch.onnx.export(dynamo=True)`), which needs the
`export` extra: onnx and onnxscript (onnxruntime to run the graph).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import Tensor, nn

from .adapters import get_adapter
from .data.loaders import split_batch
from .fusion import HydraEnsemble
from .io import remove_orphans, temporary_prefix
from .modes import evaluating

# Up to 1.8 GiB of weights the graph is one .onnx file; past it, the weights go to <path>.data beside it: protobuf's
# 2 GiB limit holds the whole file, graph included, so the weights stop short of it
ONE_FILE_BYTES = int(1.8 * 1024**3)


class FusedGraph(nn.Module):
    """A fused ensemble's forward pass without row chunking: inputs -> member outputs (B, M, C|D)."""

    def __init__(self, ensemble: HydraEnsemble):
        super().__init__()
        self.ensemble = ensemble

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        ensemble = self.ensemble
        x, mask = ensemble.embed(inputs)  # (1|M, B, T, d)
        hidden = ensemble.run_layers(x, mask, queries=ensemble.head_tokens)  # (M, B, q, d)
        return ensemble.classify(hidden, inputs).transpose(0, 1)  # (B, M, C|D)


class ModelGraph(nn.Module):
    """One HF model as an ensemble of one: inputs -> (B, 1, C|D)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.adapter = get_adapter(model)

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        return self.adapter.output(self.model, inputs)[:, None]  # (B, 1, C|D)


def graphs() -> dict[type, type[nn.Module]]:
    """What each exportable predictor is traced as; the first entry the predictor is an instance of wins. (A
    function: `transformers.PreTrainedModel` loads HF's modeling code, seconds that a CLI's --help need not pay.)"""
    return {HydraEnsemble: FusedGraph, transformers.PreTrainedModel: ModelGraph}


def graph_of(predictor: nn.Module) -> nn.Module:
    """The module that is traced for `predictor` (its train/eval modes untouched: `export_program` traces it in
    eval mode and gives the modes back)."""
    for kind, graph in graphs().items():
        if isinstance(predictor, kind):
            return graph(predictor)
    raise ValueError(
        f"cannot export a {type(predictor).__name__}: export takes a fused Hydra Ensemble or one Hugging Face model "
        f"({', '.join(k.__name__ for k in graphs())}). Export the model a wrapper is built on and apply the wrapper "
        "(e.g. temperature) to the graph's logits."
    )


def output_name(predictor: nn.Module) -> str:
    """The graph output's name: member_logits (B, M, C) of a classifier, member_pooled (B, M, D) of an encoder."""
    if isinstance(predictor, HydraEnsemble):
        classifier = predictor.is_classifier
    else:
        classifier = get_adapter(predictor).is_classifier(predictor)
    return "member_logits" if classifier else "member_pooled"


def export_program(predictor: nn.Module, example_inputs: Mapping[str, Any]) -> torch.export.ExportedProgram:
    """`torch.export` of `predictor` traced on `example_inputs`, with the batch dynamic and, for token inputs
    (B, T), the sequence length too. Call `.module()(inputs)` on the result for the member outputs (B, M, C|D).

    The example needs at least 2 rows and 2 tokens: sizes 0 and 1 are fixed by the tracer."""
    graph = graph_of(predictor)  # refuses what it cannot export before anything else
    inputs = example_inputs_of(predictor, example_inputs)
    with evaluating(graph):  # traced without dropout; a model exported halfway through training goes on training
        program = torch.export.export(graph, (inputs,), dynamic_shapes=(dynamic_shapes(inputs),))
    _check_dynamic(program, inputs)
    return program


def export_onnx(predictor: nn.Module, path: str | os.PathLike, example_inputs: Mapping[str, Any]) -> Path:
    """Write `predictor` as an ONNX graph at `path` (see the module docstring): the graph's inputs are named as
    the model's (`example_inputs`' keys), its output `member_logits` (B, M, C) or `member_pooled` (B, M, D).
    Returns `path`. Needs onnx and onnxscript (`pip install '.[export]'` from the clone).

    One file (below 2 GiB of weights) is replaced atomically. Two files (the weights in `<path>.data`) are replaced
    one after the other, weights first: an export stopped between the two leaves the old graph beside the new
    weights, which do not load together; export again."""
    _require_onnx()
    program = export_program(predictor, example_inputs).run_decompositions(_attention_decompositions())
    names = list(example_inputs_of(predictor, example_inputs))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = weight_bytes(predictor)
    tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(path), suffix=".partial", dir=path.parent))
    try:
        written = tmp / path.name
        torch.onnx.export(
            program,
            f=written,
            input_names=names,
            output_names=[output_name(predictor)],
            external_data=weights >= ONE_FILE_BYTES,
            dynamo=True,
            verbose=False,
        )
        files = sorted(tmp.iterdir(), key=lambda f: f == written)  # the weights first, the graph last
        for file in files:
            os.replace(file, path.parent / file.name)
        if len(files) == 1:  # a one-file graph: the weights of an earlier, larger export are stale
            path.with_name(path.name + ".data").unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    remove_orphans(path, ".partial")
    return path


def example_inputs_of(predictor: nn.Module, example_inputs: Mapping[str, Any]) -> dict[str, Tensor]:
    """The model inputs of a batch (labels dropped; checked against the family), on the predictor's device."""
    adapter = predictor.adapter if isinstance(predictor, HydraEnsemble) else get_adapter(predictor)
    inputs, _ = split_batch(adapter, dict(example_inputs))
    tensors = {k: v for k, v in inputs.items() if isinstance(v, Tensor)}
    if len(tensors) < len(inputs):
        raise ValueError(f"export takes tensor inputs only; drop {sorted(set(inputs) - set(tensors))}.")
    small = {k: tuple(v.shape) for k, v in tensors.items() if min(v.shape[: 2 if v.dim() == 2 else 1]) < 2}
    if small:
        raise ValueError(
            f"the example inputs {small} have fewer than 2 rows or tokens, which the tracer would fix as constants: "
            "give an example of at least 2 inputs of at least 2 tokens."
        )
    device = next(predictor.parameters()).device
    return {k: v.to(device) for k, v in tensors.items()}


def dynamic_shapes(inputs: Mapping[str, Tensor]) -> dict[str, dict[int, Any]]:
    """Token inputs (B, T): both axes dynamic; others (pixel_values (B, C, H, W)): the batch. The ranges are
    inferred (Dim.AUTO), and `_check_dynamic` refuses a program that fixed one."""
    auto = torch.export.Dim.AUTO
    return {k: {0: auto, 1: auto} if v.dim() == 2 else {0: auto} for k, v in inputs.items()}


def _check_dynamic(program: torch.export.ExportedProgram, inputs: Mapping[str, Tensor]) -> None:
    """Refuse a program whose batch or sequence length the trace fixed to the example's."""
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in _user_inputs(program)]
    for (name, tensor), node in zip(inputs.items(), placeholders, strict=True):
        axes = range(2 if tensor.dim() == 2 else 1)
        fixed = [axis for axis in axes if isinstance(node.meta["val"].shape[axis], int)]
        if fixed:
            raise ValueError(
                f"the traced graph fixed axis {fixed} of {name} to the example's size {tuple(tensor.shape)}: this "
                "model has control flow on the input's size, so one graph cannot take every batch and length."
            )


def _attention_decompositions() -> dict:
    """torch's own decomposition of scaled_dot_product_attention (into matmuls and a softmax), applied before the
    ONNX exporter's: with a float score bias (MPNet's) and dynamic shapes, torch 2.13's ONNX decomposition views
    the attention output with strides it does not have and fails. ONNX opset 20 has no attention op, so the graph
    holds the same matmuls either way."""
    aten = torch.ops.aten
    ops = (
        aten.scaled_dot_product_attention.default,
        aten._scaled_dot_product_attention_math.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
    )
    table = torch.export.default_decompositions()
    return {op: table[op] for op in ops if op in table}


def _user_inputs(program: torch.export.ExportedProgram) -> list[str]:
    user = torch.export.graph_signature.InputKind.USER_INPUT
    return [spec.arg.name for spec in program.graph_signature.input_specs if spec.kind == user]


def weight_bytes(module: nn.Module) -> int:
    """The bytes of `module`'s parameters and buffers, each storage once (a tied embedding is stored once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in module.state_dict().values()}
    return sum(storages.values())


def _require_onnx() -> None:
    missing = [name for name in ("onnx", "onnxscript") if not _importable(name)]
    if missing:
        raise ValueError(
            f"ONNX export needs {' and '.join(missing)}: pip install '.[export]' from the clone (onnx, onnxscript, "
            "onnxruntime)."
        )


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True
