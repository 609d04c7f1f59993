"""Issue 44 item 5: what each circuit search would cost on a user's validation set — a 144-head model (MPNet-base)
with 1,000 validation examples — predicted from probes timed on this machine, as `method="auto"` predicts it.

The probe (`importance.circuit.budget.costs_of`) times every candidate of the first step on one batch, fp32 and
bf16; a search's time is then its candidate evaluations (`Choice.evaluations`) times that cost per example. The
model is all-mpnet-base-v2 with a new 2-class head (the cost does not depend on the weights' training), the
examples sentiment-task sentences at 64 tokens (ID validation and the OOD validation texts: the timing only).

    python benchmarks/circuit_cost.py --examples 360 1000 --budget 96 48 --time-budget 30
    python benchmarks/circuit_cost.py --random --device cuda --batch-size 64 --probe-examples 256   # on a GPU

Prints, for each search `auto` may run (`budget.ladder`: exact, exact in bf16, multi-2/4/8), the predicted minutes
for `budget` removals at each example count, and the largest number of examples (ID and OOD, half each) with which
it fits `--time-budget` minutes.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

from hydra_ensembles.bench import tasks
from hydra_ensembles.bench.pretrained import mpnet_base
from hydra_ensembles.data.loaders import rebatch
from hydra_ensembles.evaluation.compare import machine
from hydra_ensembles.importance.circuit.budget import costs_of, ladder
from hydra_ensembles.pruning import kept_heads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, nargs="+", default=[360, 1000], help="validation examples, in all")
    parser.add_argument("--budget", type=int, nargs="+", default=[96, 48], help="removals the search ranks")
    parser.add_argument("--time-budget", type=float, default=30.0, help="minutes")
    parser.add_argument("--probe-examples", type=int, default=64, help="examples the probes read (cost per example)")
    parser.add_argument("--batch-size", type=int, default=16, help="examples a candidate evaluation runs at once")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--random", action="store_true", help="MPNet-base's shape with random weights and tokens (no packages needed)"
    )
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    half = args.probe_examples // 2
    if args.random:  # the cost depends on the shapes alone

        def sentences(count: int) -> dict:  # random tokens, 64 a sentence
            ids = torch.randint(1000, 30000, (count, 64))
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

        model = transformers.MPNetForSequenceClassification(transformers.MPNetConfig(vocab_size=30527, num_labels=2))
        id_batches = rebatch([sentences(half) | {"labels": torch.randint(0, 2, (half,))}], 16)
        ood_batches = rebatch([sentences(half)], 16)
    else:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(str(mpnet_base()), num_labels=2)
        task = tasks.TASKS["sentiment-mpnet"]("full")
        id_batches = rebatch(task.circuit_id, 16)[: max(1, half // 16)]
        ood_batches = rebatch(task.circuit_ood, 16)[: max(1, half // 16)]
    model = model.eval().to(args.device)

    def clock() -> float:  # a GPU runs asynchronously: the probe's clock waits for it
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter()

    started = time.perf_counter()
    costs = costs_of(model, id_batches, ood_batches, batch_size=args.batch_size, clock=clock)
    candidates = sum(map(len, kept_heads(model).values()))
    rungs = ladder(costs)
    print(f"# Circuit search cost: all-mpnet-base-v2 ({candidates} heads), 64 tokens")
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else machine()
    print(f"Machine: {where}; batch {args.batch_size}" + ("; random weights and tokens" if args.random else ""))
    per = ", ".join(f"{p} {1e3 * s / sum(costs.examples):.2f} ms" for p, s in costs.per_candidate.items())
    print(f"Probe: {time.perf_counter() - started:.0f} s; one candidate evaluation per example: {per}")
    print()
    header = ["search", *(f"{b} removals, {n} ex. (min)" for b in args.budget for n in args.examples)]
    header += [f"fits {args.time_budget:g} min with ({b} removals)" for b in args.budget]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    seconds = args.time_budget * 60
    for rung in rungs:
        cells = [rung.name]
        for budget in args.budget:
            for n in args.examples:
                cells.append(f"{costs.seconds(rung, candidates, 0, budget, n) / 60:.1f}")
        for budget in args.budget:
            per_example = costs.seconds(rung, candidates, 0, budget, 1)
            cells.append(f"{int(seconds / per_example)} examples")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
