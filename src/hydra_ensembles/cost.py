"""Cost accounting: parameters and FLOPs of a single model, its members and the fused ensemble.

FLOPs come from `torch.utils.flop_counter` (a multiply-add counts as 2 FLOPs; MACs = FLOPs / 2, the unit of the
paper's Table 7 "Mult-Adds"). PyTorch's counter has no formula for the CPU flash-attention kernel that
`scaled_dot_product_attention` picks on CPU, so we register the standard SDPA formula for it; without that,
attention's QK^T and AV products would be silently left out on CPU. What is computed is counted: a fused layer
whose members keep different numbers of heads runs them ragged on a CPU, without zero-padded heads
(`fusion.layer`), so its count there is that of the heads kept (padded on a GPU, it counts the padding too).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count
from tqdm.auto import tqdm

from .data.loaders import to_device
from .modes import evaluating


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)  # QK^T and AV, as for the GPU kernels


_SDPA_ON_CPU = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flops}


def count_parameters(module: nn.Module) -> int:
    """Number of parameters (shared tensors counted once). The zero heads a fused layer stores in its padded
    layout (`FusedLayer.padding_parameters`; the layout a GPU takes) are not counted: the same ensemble has as
    many parameters on every device."""
    padding = sum(sub.padding_parameters() for sub in module.modules() if hasattr(sub, "padding_parameters"))
    return sum(p.numel() for p in module.parameters()) - padding


def stored_parameters(predictor: nn.Module) -> int:
    """The parameters `predictor` stores: `count_parameters`, except where a model in its chain of wrappers (each
    holds the next as `base`) says it stores fewer (`stored_parameters`: a deep ensemble of LoRA adapters merged
    into copies of one model stores one copy and the adapters); the wrappers' own parameters (a temperature) are
    added to that."""
    inner = predictor
    while inner is not None:
        stored = getattr(inner, "stored_parameters", None)
        if isinstance(stored, int):
            return stored + count_parameters(predictor) - count_parameters(inner)
        following = getattr(inner, "base", None)
        inner = following if isinstance(following, nn.Module) and following is not inner else None
    return count_parameters(predictor)


@torch.no_grad()
def count_flops(module: nn.Module, inputs: Mapping[str, Any]) -> int:
    """FLOPs of one forward pass of `module(**inputs)`, in eval mode; every submodule's mode is restored after (a
    wrapper in training mode may hold members in eval mode: `module.train()` would switch their dropout on).

    The parameters are counted with requires_grad off (restored after): a view of a parameter taken under no_grad
    still says it requires grad, and one returned by a submodule (a fused DeBERTa's distance table) would make
    the counter's module tracker fail. A module compiled in place (`nn.Module.compile`, `inference.prepare`) is
    counted eager: the FLOPs are the graph's, and run under the counter, dynamo skips its frame and every call
    after runs eager (the timing after would time an eager model)."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    compiled = {sub: sub._compiled_call_impl for sub in module.modules() if getattr(sub, "_compiled_call_impl", None)}
    try:
        for p in trainable:
            p.requires_grad_(False)
        for sub in compiled:
            sub._compiled_call_impl = None
        with evaluating(module), FlopCounterMode(display=False, custom_mapping=_SDPA_ON_CPU) as counter:
            module(**to_device(inputs, next(module.parameters()).device))
    finally:
        for p in trainable:
            p.requires_grad_(True)
        for sub, call in compiled.items():
            sub._compiled_call_impl = call
    return counter.get_total_flops()


@dataclass
class Cost:
    """One row of a cost table."""

    name: str
    parameters: int
    flops: int

    @property
    def macs(self) -> int:
        return self.flops // 2


def cost_table(
    single: nn.Module, members: Sequence[nn.Module], ensemble: nn.Module, inputs: Mapping[str, Any]
) -> list[Cost]:
    """Costs of the single model, each member, M separate members together, the deep ensemble (M single
    models) and the fused ensemble, for one forward pass on `inputs`."""
    single_cost = Cost("single", count_parameters(single), count_flops(single, inputs))
    member_costs = [Cost(f"member {m}", count_parameters(x), count_flops(x, inputs)) for m, x in enumerate(members)]
    count = len(members)
    return [
        single_cost,
        *member_costs,
        Cost(f"{count} separate members", sum(c.parameters for c in member_costs), sum(c.flops for c in member_costs)),
        Cost(f"deep ensemble ({count} x single)", count * single_cost.parameters, count * single_cost.flops),
        Cost("fused Hydra Ensemble", count_parameters(ensemble), count_flops(ensemble, inputs)),
    ]


def format_cost_table(rows: Sequence[Cost]) -> str:
    """A plain-text table with ratios to the first row."""
    base = rows[0]
    lines = [f"{'model':<30} {'params (M)':>11} {'x single':>9} {'GFLOPs':>10} {'GMACs':>9} {'x single':>9}"]
    for row in rows:
        lines.append(
            f"{row.name:<30} {row.parameters / 1e6:>11.2f} {row.parameters / base.parameters:>9.2f} "
            f"{row.flops / 1e9:>10.3f} {row.macs / 1e9:>9.3f} {row.flops / base.flops:>9.2f}"
        )
    return "\n".join(lines)


# ---- latency ----


def interleaved_latency(
    runs: Mapping[str, Callable[[], object]], repeats: int = 7, warmup: int = 1, progress: bool = False
) -> dict[str, dict[str, float]]:
    """Time several models against the first, interleaved, so that the machine's drift hits all of them alike.

    In each of `repeats` rounds every callable runs once, in an order rotated by one each round, every other
    cycle of len(runs) rounds reversed (so none is always first or last, nor always after the same one; each
    runs first equally often over 2 len(runs) rounds); the round's ratio of each model is its time over the first
    model's time in that round. `warmup` rounds run first and are not timed. Each callable runs one forward pass
    (and synchronises the device if it is a GPU). Returns {name: {"median", "min", "max": ratio to the first over
    the rounds, "seconds": median seconds per call}}; report the median with its min-max spread. `progress`: a
    bar over the rounds (updated between them, outside the timed calls).
    """
    names = list(runs)
    if not names or repeats < 1:
        raise ValueError(
            f"interleaved_latency needs at least one callable and repeats >= 1, got {len(names)}, {repeats}."
        )
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_ in tqdm(range(warmup + repeats), desc="timing", unit="round", disable=not progress, leave=False):
        shift = round_ % len(names)
        order = names[shift:] + names[:shift]
        # every other cycle of rotations reversed: a rotation alone keeps who runs before whom (its cache effects)
        for name in order if (round_ // len(names)) % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            runs[name]()
            if round_ >= warmup:
                seconds[name].append(time.perf_counter() - start)
    reference = seconds[names[0]]
    result = {}
    for name in names:
        ratios = [t / r for t, r in zip(seconds[name], reference)]
        result[name] = {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "seconds": statistics.median(seconds[name]),
        }
    return result


def predictor_latency(
    predictors: Mapping[str, nn.Module],
    batches: Mapping[str, Mapping[str, Any]],
    repeats: int = 7,
    progress: bool = False,
) -> dict[str, dict[str, float]]:
    """`interleaved_latency` of predictors (modules called as `model(**inputs)`), each on its batch of inputs
    (`batches[name]`, the same examples encoded for that model; a `labels` entry is left out), relative to the
    first, in eval mode without gradients; `progress`: a bar over the rounds."""

    def run(model: nn.Module, batch: Mapping[str, Any]) -> Callable[[], object]:
        on_gpu = any(p.is_cuda for p in model.parameters())
        inputs = to_device({k: v for k, v in batch.items() if k != "labels"}, next(model.parameters()).device)

        def forward() -> None:
            with torch.inference_mode():
                model(**inputs)
            if on_gpu:
                torch.cuda.synchronize()

        return forward

    for model in predictors.values():
        model.eval()
    runs = {name: run(model, batches[name]) for name, model in predictors.items()}
    return interleaved_latency(runs, repeats, progress=progress)


def format_latency(stats: Mapping[str, float]) -> str:
    """ "1.93 (1.85-2.02)": the median ratio and its spread over the rounds."""
    return f"{stats['median']:.2f} ({stats['min']:.2f}-{stats['max']:.2f})"
