"""Hydra distillation (paper 001): compress any saved ensemble into one student with a shared body and one head
per member, so it keeps the members' disagreement; also writes the knowledge-distillation (KD) student.

--teacher: any saved ensemble, a predictor of more than one member (a Hydra Ensemble, a deep ensemble,
BatchEnsemble; not MC dropout, whose m-th sample is a new mask at every call: head m would learn noise).
--model: the student's starting point, a classifier over the same classes read by the same preprocessor (e.g.
the fine-tuned single model, or the teacher's base checkpoint). Phase 1 trains it as one head on the ensemble
mean (the KD student); phase 2 grows one head per member — a copy of the last --head-layers layers and the
classifier — and trains head m against member m. With --val each phase keeps its epoch with the best validation
NLL. Writes <out>/hydra/ and <out>/kd/ (both saved Hydra Ensembles: `evaluate` and `predict` take them as
--model); checkpoints per epoch (and every 10 minutes within one) under <out>/checkpoints/: run the same
command again to resume.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from torch import nn

from ..adapters import get_adapter
from ..cost import count_parameters
from ..distill import attach_teacher, distill
from ..fusion import HydraEnsemble
from ..predictors import (
    class_names,
    copy_preprocessor,
    describe_saved,
    load_preprocessor,
    num_members,
    save_predictor,
)
from ..pruning import load_model
from .common import (
    CommandError,
    add_data_options,
    add_device_argument,
    check_one_model,
    classifier_at,
    data_settings,
    on_device,
    read_data,
    resolve_device,
)
from .finetune import RECIPES, recipe_defaults
from .step import add_output_options, check_model_dir, fingerprint_path, start_step

EXAMPLE = """hydra-ens distill --teacher hydra/ensemble --model single/model --data train.csv --val val.csv --out st
hydra-ens evaluate --model single/model --model st/hydra --model st/kd --data test.csv --out report"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--teacher", required=True, help="a saved predictor with member logits (B, M, C)")
    parser.add_argument("--model", required=True, help="the student's starting classifier (an HF checkpoint)")
    parser.add_argument("--data", required=True, help="transfer data (labels not needed)")
    parser.add_argument("--val", help="labelled validation data: each phase keeps its best-NLL epoch")
    parser.add_argument(
        "--head-layers",
        type=int,
        default=1,
        help="layers each head owns; 0: the classifier alone, the library default",
    )
    parser.add_argument("--temperature", type=float, default=2.0, help="T of the KL losses")
    parser.add_argument("--epochs", type=int, help=f"epochs of each phase {recipe_defaults('epochs')}")
    parser.add_argument("--lr", type=float, help=f"learning rate of each phase {recipe_defaults('lr')}")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the seed of each phase's batch order (the fused student has no dropout; the grown heads are copies)",
    )
    add_output_options(parser)
    add_data_options(parser)
    add_device_argument(parser)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    model_dir = check_model_dir(args.model, "--model")
    check_one_model(model_dir, "distill")
    teacher_dir = check_model_dir(args.teacher, "--teacher")
    kind, _ = load_preprocessor(model_dir)
    recipe = RECIPES[kind].with_(monitor="nll", seed=args.seed)
    recipe = recipe.with_(**{k: v for k, v in {"epochs": args.epochs, "lr": args.lr}.items() if v is not None})
    if not args.val:
        recipe = recipe.with_(patience=None)
    if args.temperature <= 0:
        raise CommandError(f"--temperature must be > 0, got {args.temperature}.")
    settings = {
        "teacher": fingerprint_path(args.teacher, "--teacher"),
        "model": fingerprint_path(model_dir, "--model"),
        "data": fingerprint_path(args.data, "--data"),
        "val": fingerprint_path(args.val, "--val") if args.val else None,
        "head_layers": args.head_layers,
        "temperature": args.temperature,
        "recipe": recipe.key(),
        **data_settings(args),
    }
    out = start_step(args, "distill", settings)
    if out is None:
        return 0
    _check_same_preprocessor(teacher_dir, model_dir)
    teacher, student_model = (on_device(model, device) for model in _teacher_and_student(teacher_dir, model_dir))
    layers = get_adapter(student_model).num_layers(student_model)
    if not 0 <= args.head_layers <= layers:  # before the teacher runs over the whole transfer set
        raise CommandError(f"--head-layers must be in 0..{layers} (the student's layers), got {args.head_layers}.")
    transfer = read_data(args, args.data, model_dir, student_model.config, labelled=False, flag="--data").batches
    val = (
        read_data(args, args.val, model_dir, student_model.config, labelled=True, flag="--val").batches
        if args.val
        else None
    )
    try:
        transfer = attach_teacher(transfer, teacher, progress=not args.quiet)  # the teacher runs once, here
    except ValueError as error:  # members that change from call to call (MC dropout)
        raise CommandError(f"--teacher {str(teacher_dir)!r}: {error}") from None
    taught = [batch.get("teacher_outputs", batch.get("teacher_gaussians")) for batch in transfer]  # distill checks
    members, examples = taught[0].shape[1], sum(len(outputs) for outputs in taught)  # which kind the student takes
    print(f"teacher: {members} members; their outputs computed on {examples} transfer inputs")
    try:
        result = distill(
            HydraEnsemble.fuse([student_model]),
            transfer,
            phase1=recipe,
            phase2=recipe,
            temperature=args.temperature,
            head_layers=args.head_layers,
            val_loader=val,
            checkpoint_dir=out.path / "checkpoints",
            progress=not args.quiet,
        )
    except ValueError as error:
        raise CommandError(str(error)) from None
    for name, student in (("kd", result.kd), ("hydra", result.hydra)):
        save_predictor(student, out.path / name, also=lambda folder: copy_preprocessor(model_dir, folder))
        print(
            f"{name}: {student.num_members} head(s), {count_parameters(student) / 1e6:.2f} M parameters, "
            f"kept epoch {student.kept_epoch} of {len(student.training_history)} -> {out.path / name}"
        )
    shutil.rmtree(out.path / "checkpoints", ignore_errors=True)
    out.finish(
        {"model_dir": "hydra", "members": members, "temperature": args.temperature, "head_layers": args.head_layers}
    )
    return 0


def _teacher_and_student(teacher_dir: Path, model_dir: Path) -> tuple[nn.Module, nn.Module]:
    """The teacher (an ensemble: its members' disagreement is what the student keeps) and the student's starting
    model, refused unless they classify the same classes."""
    teacher = classifier_at(teacher_dir, "--teacher")
    if num_members(teacher) == 1:
        raise CommandError(
            f"--teacher {str(teacher_dir)!r} is {describe_saved(teacher_dir)}: a one-member teacher has no model "
            "uncertainty to keep. Pass an ensemble: a Hydra Ensemble (hydra-ens fuse) or a deep ensemble."
        )
    student = load_model(model_dir)
    if class_names(teacher) != class_names(student):
        raise CommandError(
            f"the teacher predicts {class_names(teacher)} but --model {str(model_dir)!r} predicts "
            f"{class_names(student)}: the student must classify the same classes, in the same order."
        )
    return teacher, student


def _check_same_preprocessor(teacher_dir: Path, model_dir: Path) -> None:
    """The teacher reads the transfer data as --model's preprocessor makes it: refused where the two differ (another
    vocabulary, image size or normalisation would feed the teacher inputs it was not trained on, and its outputs
    would become the targets). A teacher directory without a preprocessor of its own is taken as it is."""
    try:
        (kind, mine), (theirs_kind, theirs) = load_preprocessor(model_dir), load_preprocessor(teacher_dir)
    except (OSError, ValueError):
        return
    if kind != theirs_kind or _preprocessing(mine) != _preprocessing(theirs):
        raise CommandError(
            f"--teacher {str(teacher_dir)!r} prepares its inputs otherwise than --model {str(model_dir)!r} (another "
            "vocabulary or image processing): the teacher would read inputs made for another model. Distil into a "
            "model of the teacher's base."
        )


def _preprocessing(preprocessor) -> object:
    """What decides the inputs: a tokenizer's vocabulary, an image processor's settings (less its class name)."""
    if hasattr(preprocessor, "get_vocab"):
        return preprocessor.get_vocab()
    ignored = {"image_processor_type", "processor_class"}
    return {k: v for k, v in preprocessor.to_dict().items() if k not in ignored}
