"""One training step (forward, loss, backward, AdamW) in fp32 and in bf16 mixed precision (`TrainConfig.precision`:
the forward and the loss under bfloat16 autocast, float32 weights), timed interleaved on the pretrained MPNet-base
and DINOv2-S classifiers. Prints each round's seconds and the ratio of the best times.

    python benchmarks/train_precision.py --rounds 3

Measured on this project's 2-core CPU (Xeon with AMX), alone, by this script's first draft (its loss was the
logsumexp of the logits): MPNet-base, batch 16 x 128 tokens, 6.79-7.12 s fp32
vs 3.07-3.21 s bf16 (2.2x); DINOv2-S, batch 64 x 224 px, 17.1-20.4 s vs 10.4-11.1 s (1.65x).
"""

import argparse
import time

import torch
import transformers

from hydra_ensembles.bench.pretrained import dinov2_small, mpnet_base


def step_seconds(model: torch.nn.Module, inputs: dict, optimizer: torch.optim.Optimizer, bf16: bool) -> float:
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(**inputs).logits
        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return time.perf_counter() - started


def compare(name: str, model: torch.nn.Module, inputs: dict, rounds: int) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for bf16 in (False, True):  # warm-up
        step_seconds(model, inputs, optimizer, bf16)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for bf16 in (False, True):
            times[bf16].append(step_seconds(model, inputs, optimizer, bf16))
    fp32, bf16 = (" ".join(f"{t:.2f}" for t in times[k]) for k in (False, True))
    print(f"{name}: fp32 {fp32} s | bf16 {bf16} s | {min(times[False]) / min(times[True]):.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    mpnet = transformers.AutoModelForSequenceClassification.from_pretrained(mpnet_base(), num_labels=3)
    ids = torch.randint(5, 1000, (16, 128))
    text = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    compare("MPNet-base, 16 x 128 tokens", mpnet, text, args.rounds)
    dinov2 = transformers.AutoModelForImageClassification.from_pretrained(dinov2_small(), num_labels=10)
    compare("DINOv2-S, 64 x 224 px", dinov2, {"pixel_values": torch.randn(64, 3, 224, 224)}, args.rounds)


if __name__ == "__main__":
    main()
