"""Fusion: M members into one Hydra Ensemble that runs them all in a single forward pass (paper 000, §4.2).

--mlp average merges the members' MLPs, norms and embeddings into one (the paper's merged MLP, cheapest): exact
for members pruned from one model and not fine-tuned, an approximation for members fine-tuned apart, which then
needs --data to measure how far the fused model is from its members. --mlp stack keeps each member's own
(exactly the members run one by one). Writes <out>/ensemble/ (hydra_config.json + model.safetensors + the
preprocessor files), which every later step takes as --model.
"""

from __future__ import annotations

import argparse

from ..cost import count_parameters
from ..fusion import HydraEnsemble, fusion_deviation
from ..predictors import copy_preprocessor
from ..pruning import load_model
from .common import CommandError, add_data_options, data_settings, read_data
from .members import member_dirs
from .step import add_output_options, fingerprint_path, start_step

EXAMPLE = """hydra-ens fuse --members members-tuned --data val.csv --out hydra      # merged MLP, deviation measured
hydra-ens fuse --members members-tuned --mlp stack --out hydra-stack     # each member's own MLP: exact"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--members", required=True, help="a members directory (from members or finetune)")
    parser.add_argument(
        "--mlp",
        choices=("average", "stack"),
        default="average",
        help="average: one merged MLP (the paper's; approximate after separate fine-tuning); stack: exact",
    )
    parser.add_argument(
        "--data",
        help="a sample of your inputs (labels unused) on which to measure the fused model against its members; "
        "required when --mlp average merges members that differ",
    )
    parser.add_argument("--sample", type=int, default=256, help="inputs of --data to compare on (default: 256)")
    parser.add_argument(
        "--allow-identical", action="store_true", help="fuse identical members (refused by default: no diversity)"
    )
    add_output_options(parser)
    add_data_options(parser)


def run(args: argparse.Namespace) -> int:
    dirs = member_dirs(args.members, "--members")
    settings = {
        "members": fingerprint_path(args.members, "--members"),
        "mlp": args.mlp,
        "data": fingerprint_path(args.data, "--data") if args.data else None,
        "sample": args.sample,
        "allow_identical": args.allow_identical,
        **data_settings(args),
    }
    out = start_step(args, "fuse", settings, "ensemble")
    if out is None:
        return 0
    if args.sample < 1:
        raise CommandError(f"--sample must be at least 1, got {args.sample}.")
    members = [load_model(d) for d in dirs]
    try:
        ensemble = HydraEnsemble.fuse(members, mlp=args.mlp, allow_identical=args.allow_identical)
    except ValueError as error:
        raise CommandError(str(error).replace("allow_identical=True", "--allow-identical")) from None
    if ensemble.averaged and not args.data:
        raise CommandError(
            f"--mlp average merges {len(ensemble.averaged)} tensors in which the members differ (they were "
            "fine-tuned apart), so the fused model only approximates them: pass --data FILE (a sample of your "
            "inputs) to measure how far, or use --mlp stack, which is exact."
        )
    deviation = None
    if args.data:
        data = read_data(args, args.data, dirs[0], members[0].config, labelled=False, flag="--data")
        deviation = fusion_deviation(ensemble, members, data.batches, max_examples=args.sample)
    target = out.path / "ensemble"
    ensemble.save_pretrained(target)
    copy_preprocessor(dirs[0], target)
    params = count_parameters(ensemble)
    out.finish(
        {
            "model_dir": "ensemble",
            "members": len(members),
            "parameters": params,
            "averaged_tensors": len(ensemble.averaged),
            "deviation": deviation,
        }
    )
    print(f"fused {len(members)} members ({args.mlp} MLPs, {params / 1e6:.2f} M parameters) -> {target}")
    print(f"  {ensemble.extra_repr()}")
    print(f"  {describe(ensemble, deviation)}")
    return 0


def describe(ensemble: HydraEnsemble, deviation: dict | None) -> str:
    """One line: is the fused model exactly its members, and if not, how far from them it is."""
    exact = "exact by construction" if not ensemble.averaged else f"{len(ensemble.averaged)} differing tensors averaged"
    if deviation is None:
        return f"{exact} (members share their MLPs, norms and embeddings)"
    line = (
        f"{exact}; measured on {deviation['examples']} inputs against the members run one by one: "
        f"max |logit difference| {deviation['logits']:.3g}, max |probability difference| {deviation['probs']:.3g}"
    )
    if ensemble.averaged:
        line += " (the merged MLP's approximation; --mlp stack is exact)"
    return line
