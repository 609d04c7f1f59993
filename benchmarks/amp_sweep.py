"""Adaptive MLP pruning on the demo's fine-tuned MiniLM: a delta-E sweep (paper 002, the shape of Table 7),
measured in one run, without recovery: kept MLP sizes, parameters and FLOPs relative to the unpruned model,
validation criterion and test accuracy / NLL on the demo's BBC split.

    python benchmarks/amp_sweep.py --model DIR [--deltas 0.01 0.05 0.1]

DIR: a fine-tuned MiniLM classifier, e.g. the demo's cached `single` model
($HYDRA_ENSEMBLES_CACHE/demo/<task>/seed0/models/single after `hydra-ens demo`).
"""

from __future__ import annotations

import argparse
import time

import torch

import hydra_ensembles as he
from hydra_ensembles.bench.tasks import text_task
from hydra_ensembles.importance.neurons import criterion_value
from hydra_ensembles.metrics import accuracy, nll


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--deltas", type=float, nargs="+", default=[0.01, 0.05, 0.1])
    parser.add_argument("--t-max", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    task = text_task("demo")
    model = he.load_model(args.model)
    pruning_set = task.val  # the pruning set: validation articles, labels unused (entropy criterion)
    probe = {k: v[:1] for k, v in task.test[0].items() if k != "labels"}
    base_flops, base_params = he.count_flops(model, probe), he.count_parameters(model)
    labels = he.labels_of(task.test)

    def row(name, m, sizes, criterion):
        probs = he.ensemble_probs(he.collect_member_logits(m, task.test).double())
        print(
            f"{name:<14}{str(sizes):<34}{he.count_parameters(m) / base_params:>8.2f}"
            f"{he.count_flops(m, probe) / base_flops:>8.2f}{criterion:>10.4f}{100 * accuracy(probs, labels):>8.1f}"
            f"{nll(probs, labels):>8.3f}"
        )

    started = time.perf_counter()
    scores = he.neuron_scores(model, pruning_set, loss="entropy", progress=False)
    print(
        f"MiniLM (demo single), pruning set {sum(len(b['labels']) for b in pruning_set)} articles, t_max {args.t_max}"
    )
    print(f"{'':<14}{'MLP sizes per block':<34}{'params':>8}{'FLOPs':>8}{'E':>10}{'acc %':>8}{'NLL':>8}")
    row(
        "unpruned",
        model,
        [len(k) for k in he.kept_neurons(model).values()],
        criterion_value(model, pruning_set, "entropy"),
    )
    for delta in args.deltas:
        pruned, record = he.adaptive_mlp_pruning(
            model, pruning_set, delta, t_max=args.t_max, loss="entropy", scores=scores, progress=False
        )
        row(f"dE = {delta:g}", pruned, record.sizes, record.entropies[-1])
    print(f"({time.perf_counter() - started:.0f} s on {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
