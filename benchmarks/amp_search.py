"""What the adaptive-pruning search's shortcut saves, measured in one run: Algorithm 1 on a fine-tuned model with
`reuse_prefix=True` (block l's sizes run blocks l.. from the states entering block l, computed once) and with
`reuse_prefix=False` (the full model for every size, as Algorithm 1 is written), interleaved and repeated; both
must give the same sizes.

    python benchmarks/amp_search.py --model DIR [--examples 64] [--delta 0.02] [--rounds 2]

DIR: a fine-tuned text classifier, e.g. the text benchmark's cached single model
($HYDRA_ENSEMBLES_CACHE/bench/full/text-bbc-<fingerprint>/seed0/models/single).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import hydra_ensembles as he
from hydra_ensembles.bench.tasks import text_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--examples", type=int, default=64, help="pruning-set size (training articles)")
    parser.add_argument("--delta", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    model = he.load_model(args.model).eval()
    batches = text_task("full").train[: max(1, args.examples // 16)]
    scores = he.neuron_scores(model, batches, loss="entropy", progress=False)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    sizes: dict[bool, list[int]] = {}
    for round_ in range(args.rounds):
        for reuse in (True, False) if round_ % 2 == 0 else (False, True):  # order rotated: neither always first
            started = time.perf_counter()
            _, record = he.adaptive_mlp_pruning(
                model, batches, args.delta, scores=scores, reuse_prefix=reuse, progress=False
            )
            seconds[reuse].append(time.perf_counter() - started)
            sizes[reuse] = record.sizes
    assert sizes[True] == sizes[False], sizes
    ratios = [full / fast for full, fast in zip(seconds[False], seconds[True])]
    print(
        f"{type(model).__name__}, {sum(len(b['labels']) for b in batches)} examples, delta-E {args.delta}, "
        f"{torch.get_num_threads()} threads; sizes {sizes[True]} either way"
    )
    print(f"full pass per size: {', '.join(f'{s:.1f}' for s in seconds[False])} s")
    print(f"from block l:       {', '.join(f'{s:.1f}' for s in seconds[True])} s")
    print(f"speed-up: median {statistics.median(ratios):.2f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
