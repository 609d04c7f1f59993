"""Where the fused ensemble's latency goes beyond its FLOPs (issue 13): the free table's models of one seed,
profiled op by op on the latency batch, with time grouped by kind of op and relative to Single.

FLOPs count the matrix products (and attention's QK^T, AV); a fused ensemble also runs every member's norms,
activations, residual adds and layout copies, and Python dispatches its ops. This script measures each share:

    python benchmarks/profile_free.py amp-text --seed 0

The models come from the cache that `hydra-ens bench amp-text --tables free` filled (nothing is trained here).
Each model runs `--warmup` passes, then `--rounds` profiled passes, interleaved as `cost.interleaved_latency` does;
a kind's time is the median over rounds of the summed self CPU time of its ops; "dispatch and Python" is wall time
minus all ops.
"""

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler's start/stop lines, before torch loads

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile

from hydra_ensembles.bench import cache_dir, runner
from hydra_ensembles.bench.amp import LATENCY_BATCH, free_predictors
from hydra_ensembles.bench.tasks import TASKS
from hydra_ensembles.cli.bench import AMP
from hydra_ensembles.cost import count_flops, interleaved_latency
from hydra_ensembles.data.loaders import rebatch

KINDS = {  # aten op name -> kind; anything else is "other ops"
    "matmul": ("addmm", "mm", "bmm", "baddbmm", "matmul", "linear", "einsum"),
    "attention (SDPA)": ("scaled_dot_product", "_softmax", "softmax"),
    "norms": ("layer_norm", "native_layer_norm", "addcmul"),
    "activation": ("gelu", "silu", "relu", "tanh"),
    "elementwise": ("add", "add_", "mul", "mul_", "div", "sub", "rsub", "where", "masked_fill"),
    "copies and indexing": (
        "copy_",
        "clone",
        "contiguous",
        "cat",
        "stack",
        "index",
        "index_select",
        "gather",
        "embedding",
        "_to_copy",
        "to",
        "expand",
        "narrow",
        "slice",
        "select",
    ),
}


def kind_of(op: str) -> str:
    name = op.removeprefix("aten::")
    for kind, names in KINDS.items():
        if name in names or (kind == "attention (SDPA)" and any(n in name for n in names)):
            return kind
    return "other ops"


def profiled_pass(model: torch.nn.Module, inputs: dict) -> dict[str, float]:
    """Seconds per kind of op for one forward pass, plus "dispatch and Python" and "wall"."""
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        model(**inputs)
        wall = time.perf_counter() - started
    seconds: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        if event.key.startswith("aten::"):
            seconds[kind_of(event.key)] += event.self_cpu_time_total / 1e6
    seconds["dispatch and Python"] = wall - sum(seconds.values())
    seconds["wall"] = wall
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", choices=sorted(AMP))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--delta",
        type=float,
        help="the AMP base's delta-E (default: the seed's free base, read "
        "from benchmarks/results/<experiment>/amp.json)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    task = TASKS[AMP[args.experiment]]("full")
    delta = args.delta
    if delta is None:
        summary = json.loads(Path(f"benchmarks/results/{args.experiment}/amp.json").read_text())
        delta = summary["per_seed"][str(args.seed)]["free_delta"]
    seed_cache = runner.seed_dir(cache_dir() / "bench" / "full", task, args.seed)
    predictors = free_predictors(task, args.seed, seed_cache, delta)
    batch = rebatch(task.test, LATENCY_BATCH)[0]
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    flops = {name: count_flops(model, inputs) for name, model in predictors.items()}
    for model in predictors.values():
        model.eval()
    # cost.interleaved_latency's rounds (rotated order, warm-up first), each pass profiled; warm-up passes dropped
    passes: dict[str, list[dict[str, float]]] = {name: [] for name in predictors}
    runs = {name: lambda n=name: passes[n].append(profiled_pass(predictors[n], inputs)) for name in predictors}
    interleaved_latency(runs, repeats=args.rounds, warmup=args.warmup)
    rounds = {name: done[args.warmup :] for name, done in passes.items()}
    names = list(predictors)
    kinds = [*KINDS, "other ops", "dispatch and Python", "wall"]
    median = {name: {k: statistics.median(r.get(k, 0.0) for r in rs) for k in kinds} for name, rs in rounds.items()}
    single = median["Single"]
    print(
        f"{args.experiment} seed {args.seed}, AMP base delta-E {delta:g}, batch {len(next(iter(inputs.values())))}, "
        f"{torch.get_num_threads()} threads; median of {args.rounds} profiled rounds; ms (x Single's wall)"
    )
    print(f"{'':<22}" + "".join(f"{name[:21]:>22}" for name in names))
    for kind in kinds:
        cells = [f"{median[n][kind] * 1e3:.1f} ({median[n][kind] / single['wall']:.2f})" for n in names]
        print(f"{kind:<22}" + "".join(f"{c:>22}" for c in cells))
    print(f"{'FLOPs x Single':<22}" + "".join(f"{flops[n] / flops['Single']:>22.2f}" for n in names))
    print(
        f"{'matmul ms / GFLOP':<22}" + "".join(f"{median[n]['matmul'] * 1e3 / (flops[n] / 1e9):>22.2f}" for n in names)
    )


if __name__ == "__main__":
    main()
