"""Compare named predictors on the same data, one row each: the loop under `hydra-ens evaluate` and under every
benchmark table (`bench.runner`).

A row is a name and a build function returning `Built`: the predictor, what its result records beside the metrics
(`extra`, e.g. its heads), and, if it reads the data its own way (its own tokenizer), its own `Data`. `compare`
measures each row (`report.measure`), keeps its member logits (B, M, C) in `<logits_dir>/<row>.pt` (`row_file`) and
records its result in the `record_path` file as soon as it is measured, with the seconds it took and where and when
it was measured (`_measured`). A row found in the record is not built again (with `require_logits`, only if its
logits are there too: `hydra-ens evaluate` plots them; benchmark records often travel without them): an interrupted
comparison resumes at the next row, and a table renders from its records without a model.
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..cost import predictor_latency
from ..data.loaders import Batch
from ..io import read_json_record, write_json_atomic
from .report import measure


@dataclass
class Data:
    """What rows are measured on. A batch is a dict of tensors, the model's inputs with a batch dimension first
    (`input_ids`, `attention_mask`, ... or `pixel_values`); the test batches also hold the labels, under "labels"
    (B,). OOD sets, by name (near, far, or neither: `ood`), are unlabelled."""

    test: list[Batch]
    near: Mapping[str, list[Batch]] = field(default_factory=dict)
    far: Mapping[str, list[Batch]] = field(default_factory=dict)
    ood: Mapping[str, list[Batch]] = field(default_factory=dict)


@dataclass
class Built:
    """A row's predictor, what its result records beside the metrics (`extra`), and its own encoding of the data if
    any."""

    predictor: nn.Module
    extra: dict = field(default_factory=dict)
    data: Data | None = None


def compare(
    rows: Mapping[str, Callable[[], Built]],
    data: Data | None,
    record_path: str | os.PathLike,
    logits_dir: str | os.PathLike,
    progress: bool = False,
    *,
    require_logits: bool = False,
    score: str = "msp",
) -> dict[str, dict]:
    """{row: result} of every row, in order: read from `record_path` when recorded there (and, if `require_logits`,
    its logits are in `logits_dir`), else built, measured and recorded (`data`: the rows' data, unless a row brings
    its own). A result is `report.measure`'s, the row's `Built.extra`, `_seconds` and `_measured` ({machine, date}). OOD
    metrics by `score` (`report.measure`)."""
    results = read_json_record(record_path)
    for number, (name, build) in enumerate(rows.items(), start=1):
        if name in results and (not require_logits or row_file(logits_dir, name).exists()):
            continue
        print(f"[{number}/{len(rows)}] {name}", flush=True)
        started = time.perf_counter()
        built = build()
        on = built.data or data
        if on is None:
            raise ValueError(f"row {name!r} was given no data: pass `data` or build it with `Built(data=...)`.")
        logits_path = row_file(logits_dir, name)
        measured = measure(built.predictor, on.test, on.near, on.far, logits_path, on.ood, progress, score)
        results[name] = measured | built.extra | {"_seconds": round(time.perf_counter() - started, 1)}
        results[name]["_measured"] = measured_here()
        write_json_atomic(record_path, results)
    return {name: results[name] for name in rows}


def time_rows(
    predictors: Mapping[str, nn.Module], batches: Mapping[str, Batch], repeats: int, progress: bool = False
) -> dict[str, dict]:
    """`cost.predictor_latency` of every predictor on its batch, relative to the first, interleaved, saying so
    (`progress`: with a bar over the rounds)."""
    print(f"timing {len(predictors)} rows, interleaved, {repeats} rounds", flush=True)
    return predictor_latency(predictors, batches, repeats, progress=progress)


def row_file(folder: str | os.PathLike, row: str) -> Path:
    """The file in `folder` that holds the logits of the row `row`: the row's name, with each "/" (as in
    "pruned/layer") written " per " so that it stays one file."""
    return Path(folder) / f"{row.replace('/', ' per ')}.pt"


def measured_here() -> dict[str, str]:
    """{"machine", "date"}: where and when a result was measured, recorded with it."""
    return {"machine": machine(), "date": datetime.date.today().isoformat()}


def machine() -> str:
    """What a measurement ran on, for the tables that report one: platform, CPU model and the vector units its
    bf16 speed depends on, CPUs, torch version, threads."""
    return (
        f"{platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )


def cpu_model() -> str:
    """The CPU's model name and the instruction sets torch's CPU kernels use, e.g. "AMD EPYC (AVX512,
    AVX512-BF16, no AMX)": bf16 matrix products run ~2x fp32 with AVX512-BF16 and far faster with AMX tiles, so a
    speed-up measured on one machine type does not carry to another."""
    name = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as info:
            name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), name)
    units = [torch.backends.cpu.get_cpu_capability()]
    if getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)():
        units.append("AVX512-BF16")
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private: absent from some torch builds
    units.append("AMX unknown" if amx is None else "AMX" if amx() else "no AMX")
    return f"{name} ({', '.join(units)})"
