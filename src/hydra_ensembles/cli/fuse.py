"""Fusion: M members into one Hydra Ensemble that runs them all in a single forward pass (paper 000, §4.2).

--mlp average merges the members' MLPs, norms and embeddings into one (the paper's merged MLP, cheapest): exact
for members pruned from one model and not fine-tuned, an approximation for members fine-tuned apart, which then
needs --data to measure how far the fused model is from its members. --mlp stack keeps each member's own
(exactly the members run one by one). Writes <out>/ensemble/ (hydra_config.json + model.safetensors + the
preprocessor files), which every later step takes as --model.

--finetune-train fuses first and then fine-tunes the fused ensemble as one module (paper 000, Fig. 1): each
member's cross-entropy on its own logits, summed, so the merged MLP, norms and embeddings are trained for all
members at once and each member's heads and classifier for it alone. Give it the pruned members (from `members`,
not fine-tuned): they share their MLPs exactly, so the fused model is exact before training and stays an exact
ensemble of its members after. A checkpoint is written every epoch (and every 10 minutes within one) under
<out>/checkpoints/: run the same command again to resume.
"""

from __future__ import annotations

import argparse
import shutil

from ..cost import count_parameters
from ..fusion import HydraEnsemble, fusion_deviation
from ..predictors import copy_preprocessor, load_preprocessor, save_predictor
from ..pruning import load_model
from ..training import AUGMENTATIONS, TrainConfig, finetune_fused
from ..training.recipes import MONITORS, PRECISIONS
from .common import (
    CommandError,
    add_data_options,
    add_device_argument,
    data_settings,
    read_data,
    resolve_device,
)
from .finetune import RECIPES, kept_epoch_line, patience, recipe_defaults, recipe_from_flags
from .members import member_dirs
from .step import Output, add_output_options, fingerprint_path, start_step

EXAMPLE = """hydra-ens fuse --members members-tuned --data val.csv --out hydra      # merged MLP, deviation measured
hydra-ens fuse --members members-tuned --mlp stack --out hydra-stack     # each member's own MLP: exact
hydra-ens fuse --members members --finetune-train train.csv --finetune-val val.csv --out hydra  # fuse, then tune"""
# the fine-tuning flags whose default is the recipe's (None: not given)
RECIPE_FLAGS = ("epochs", "lr", "monitor", "patience", "precision", "augment")


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
    parser.add_argument("--sample", type=int, default=256, help="inputs of --data to compare on")
    parser.add_argument(
        "--allow-identical", action="store_true", help="fuse identical members (refused by default: no diversity)"
    )
    add_finetune_options(parser)
    add_output_options(parser)
    add_data_options(parser)
    add_device_argument(parser)


def add_finetune_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "fine-tune the fused ensemble as one module (each member's cross-entropy summed; give pruned members)"
    )
    group.add_argument("--finetune-train", metavar="FILE", help="labelled training data: fine-tune after fusing")
    group.add_argument(
        "--finetune-val",
        metavar="FILE",
        help="labelled validation data: keeps the ensemble's best epoch (see --monitor), stops after --patience",
    )
    group.add_argument("--recipe", choices=sorted(RECIPES), help="default: by what the model reads (text or image)")
    group.add_argument("--epochs", type=int, help=f"at most this many epochs {recipe_defaults('epochs')}")
    group.add_argument("--lr", type=float, help=f"peak learning rate {recipe_defaults('lr')}")
    group.add_argument(
        "--monitor",
        choices=MONITORS,
        help=f"with --finetune-val, what picks the kept epoch, on the ensemble's probabilities: acc, acc_nll (ties "
        f"to the lower NLL), nll {recipe_defaults('monitor')}",
    )
    group.add_argument(
        "--patience",
        type=patience,
        help="with --finetune-val, stop after this many epochs without improvement; 0: every epoch runs "
        + recipe_defaults("patience"),
    )
    group.add_argument("--precision", choices=PRECISIONS, help="bf16: mixed precision (default: fp32)")
    group.add_argument(
        "--augment",
        choices=sorted(AUGMENTATIONS),
        help="images: augment every training batch (crop_flip: random resized crop, area 8-100%%, aspect 3/4-4/3, "
        "and horizontal flip; default: none)",
    )
    group.add_argument("--seed", type=int, help="batch order and augmentation seed (default 0)")


def finetune_recipe(args: argparse.Namespace, kind: str) -> TrainConfig:
    """The recipe for the fused ensemble: `--recipe` (default: by `kind`) with the flags given."""
    flags = {name: getattr(args, name) for name in RECIPE_FLAGS}
    return recipe_from_flags(args, kind, flags, "--finetune-val").with_(seed=args.seed or 0)


def check_finetune_flags(args: argparse.Namespace, kind: str) -> None:
    flags = ("finetune_val", "recipe", "seed", *RECIPE_FLAGS)
    given = [f"--{name.replace('_', '-')}" for name in flags if getattr(args, name) is not None]
    if given and not args.finetune_train:
        raise CommandError(f"{', '.join(given)} set(s) how to fine-tune the fused ensemble: add --finetune-train FILE.")
    if args.augment and (args.recipe or kind) != "image":
        raise CommandError(f"--augment {args.augment} transforms images; these members read {kind}: leave it out.")


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    dirs = member_dirs(args.members, "--members")
    settings = {
        "members": fingerprint_path(args.members, "--members"),
        "mlp": args.mlp,
        "data": fingerprint_path(args.data, "--data") if args.data else None,
        "sample": args.sample,
        "allow_identical": args.allow_identical,
        **data_settings(args),
    }
    kind, _ = load_preprocessor(dirs[0])
    check_finetune_flags(args, kind)
    recipe = finetune_recipe(args, kind) if args.finetune_train else None
    if recipe is not None:  # only then: a plain fuse keeps the settings (and the finished outputs) it had
        settings["finetune"] = {
            "train": fingerprint_path(args.finetune_train, "--finetune-train"),
            "val": fingerprint_path(args.finetune_val, "--finetune-val") if args.finetune_val else None,
            "recipe": recipe.key(),
        }
    if args.sample < 1:
        raise CommandError(f"--sample must be at least 1, got {args.sample}.")
    out = start_step(args, "fuse", settings, "ensemble")
    if out is None:
        return 0
    members = [load_model(d).to(device) for d in dirs]
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
    exactness = describe(ensemble, deviation)
    history = _finetune(args, out, ensemble, dirs[0], recipe, exactness) if recipe is not None else None
    target = out.path / "ensemble"
    save_predictor(ensemble, target, also=lambda folder: copy_preprocessor(dirs[0], folder))
    shutil.rmtree(out.path / "checkpoints", ignore_errors=True)  # only once the model they would resume is saved
    params = count_parameters(ensemble)
    out.finish(
        {
            "model_dir": "ensemble",
            "members": len(members),
            "parameters": params,
            "averaged_tensors": len(ensemble.averaged),
            "deviation": deviation,
            **({"finetune": history} if history is not None else {}),
        }
    )
    print(f"fused {len(members)} members ({args.mlp} MLPs, {params / 1e6:.2f} M parameters) -> {target}")
    print(f"  {ensemble.extra_repr()}")
    if history is None:
        print(f"  {exactness}")
    return 0


def _finetune(
    args: argparse.Namespace, out: Output, ensemble: HydraEnsemble, model_dir, recipe: TrainConfig, exactness: str
) -> dict:
    """Fine-tune the fused ensemble as one module, in place; prints the fusion's `exactness` (before the training,
    which takes minutes to hours), then returns its epochs and the kept one."""
    if not ensemble.is_classifier:
        raise CommandError(
            "--finetune-train trains the members' classifiers, and these members have none (pruned from an "
            "encoder): fine-tune the encoder into a classifier first (hydra-ens finetune), then prune members from it."
        )
    config = ensemble.model_config
    train = read_data(args, args.finetune_train, model_dir, config, labelled=True, flag="--finetune-train").batches
    val = None
    if args.finetune_val:
        val = read_data(args, args.finetune_val, model_dir, config, labelled=True, flag="--finetune-val").batches
    checkpoints = out.path / "checkpoints"
    if (checkpoints / "checkpoint.pt").exists():
        print(f"resuming from {checkpoints}")
    print(f"fused {ensemble.num_members} members: {exactness} (before fine-tuning)", flush=True)
    epochs = f"{recipe.epochs} epoch{'s' if recipe.epochs != 1 else ''}"
    print(f"fine-tuning the fused ensemble as one module ({epochs}, lr {recipe.lr:g}, members' losses summed)")
    try:
        finetune_fused(
            ensemble,
            train,
            recipe,
            val_loader=val,
            checkpoint_dir=checkpoints,
            progress=not args.quiet,
        )
    except ValueError as error:
        raise CommandError(f"--finetune-train: {error}") from None
    for record in ensemble.training_history:
        print("  " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()))
    kept = kept_epoch_line(ensemble.training_history, ensemble.kept_epoch, recipe, val is not None)
    print("  " + kept.replace("--val", "--finetune-val"))
    return {"epochs": ensemble.training_history, "kept_epoch": ensemble.kept_epoch}


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
