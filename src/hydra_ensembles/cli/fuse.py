"""Fusion: M members into one Hydra Ensemble that runs them all in a single forward pass (paper 000, §4.2).

--mlp average merges the members' MLPs, norms and embeddings into one (the paper's merged MLP, cheapest);
--mlp stack keeps each member's own (exactly the members run one by one). Writes <out>/ensemble/
(hydra_config.json + model.safetensors + the preprocessor files), which every later step takes as --model.
"""

from __future__ import annotations

import argparse

from ..cost import count_parameters
from ..fusion import HydraEnsemble
from ..pruning import load_model
from .common import Output, add_output_options, copy_preprocessor, fingerprint_path
from .members import member_dirs

EXAMPLE = "hydra-ens fuse --members members-tuned --mlp average --out hydra"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--members", required=True, help="a members directory (from members or finetune)")
    parser.add_argument("--mlp", choices=("average", "stack"), default="average")
    add_output_options(parser)


def run(args: argparse.Namespace) -> int:
    dirs = member_dirs(args.members, "--members")
    settings = {"members": fingerprint_path(args.members, "--members"), "mlp": args.mlp}
    out = Output(args.out, "fuse", settings, args.force)
    if out.done():
        print(f"already done: {out.path}/ensemble (pass --force to redo)")
        return 0
    members = [load_model(d) for d in dirs]
    ensemble = HydraEnsemble.fuse(members, mlp=args.mlp)
    target = out.path / "ensemble"
    ensemble.save_pretrained(target)
    copy_preprocessor(dirs[0], target)
    params = count_parameters(ensemble)
    out.finish({"model_dir": "ensemble", "members": len(members), "parameters": params})
    print(f"fused {len(members)} members ({args.mlp} MLPs, {params / 1e6:.2f} M parameters) -> {target}")
    print(f"  {ensemble.extra_repr()}")
    return 0
