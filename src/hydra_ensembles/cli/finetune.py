"""Fine-tuning: a classifier (or a base encoder, which gets a new classification head from your labels), or every
member of a members directory in turn.

Recipes (paper 000, §C, §D.2): text = AdamW, linear warm-up then decay; image = SGD with momentum, cosine
schedule, label smoothing. With --val, the epoch with the best validation score is kept (--monitor: accuracy,
the paper's §C.2, ties to the lower NLL, for text; NLL for images) and training stops after --patience epochs
without improvement; the command says which epoch it kept and why. Flags override single fields. A checkpoint
is written after every epoch (and every 10 minutes within one) under <out>/checkpoints/: run the same command
again to resume.
Writes <out>/model/ (one model) or <out>/member0/, ... plus members.json (a members directory).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
import transformers

from ..data.files import class_ids, label_ids, read_source
from ..io import read_json_record, write_json_atomic
from ..predictors import copy_preprocessor, load_preprocessor, save_predictor
from ..predictors.classifier import has_classifier_class, head_hint
from ..pruning import load_model
from ..training import CHECKPOINT, IMAGE_RECIPE, TEXT_RECIPE, TrainConfig, finetune
from ..training.recipes import MONITORS, PRECISIONS
from .common import (
    CommandError,
    add_data_options,
    add_device_argument,
    check_one_model,
    data_settings,
    read_data,
    resolve_device,
)
from .members import member_dirs
from .step import MEMBERS_FILE, add_output_options, check_model_dir, fingerprint_path, start_step

EXAMPLE = """hydra-ens finetune --model base-encoder --data train.csv --val val.csv --epochs 4 --lr 3e-4 --out single
hydra-ens finetune --model members --data train.csv --epochs 1 --lr 1e-4 --freeze-embeddings --out members-tuned"""

RECIPES = {"text": TEXT_RECIPE, "image": IMAGE_RECIPE}


def recipe_defaults(field: str) -> str:
    """A recipe field's default for --help, per recipe: "(default: the recipe's: image 10, text 3)"."""
    values = ", ".join(f"{kind} {getattr(recipe, field)}" for kind, recipe in sorted(RECIPES.items()))
    return f"(default: the recipe's: {values})"


def patience(text: str) -> int:
    """--patience: epochs without improvement before stopping, >= 1; 0 (or "none"): every epoch runs."""
    if text.lower() == "none":
        return 0
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of epochs (0: no early stopping), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of epochs >= 0 (0: no early stopping), got {value}")
    return value


def recipe_from_flags(args: argparse.Namespace, kind: str, flags: dict, val_flag: str) -> TrainConfig:
    """`--recipe` (default: by `kind`, what the model reads) with the given flags' values (`flags`: field ->
    value, None where not given); --patience 0 turns early stopping off. Without validation data (`val_flag`,
    the flag that gives it, not given) nothing can be monitored: --monitor or --patience is then refused."""
    recipe = RECIPES[args.recipe or kind]
    given = {field: value for field, value in flags.items() if value is not None}
    validated = getattr(args, val_flag.removeprefix("--").replace("-", "_")) is not None
    unused = [f"--{field}" for field in ("monitor", "patience") if field in given]
    if unused and not validated:
        raise CommandError(f"{', '.join(unused)} choose(s) the kept epoch on validation data: add {val_flag} FILE.")
    if given.get("patience") == 0:
        given["patience"] = None
    recipe = recipe.with_(**given)
    return recipe if validated else recipe.with_(patience=None)  # early stopping needs validation data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="an HF checkpoint directory, or a members directory")
    parser.add_argument("--data", required=True, help="labelled training data")
    parser.add_argument("--val", help="labelled validation data: keeps the best epoch (see --monitor), stops early")
    parser.add_argument("--recipe", choices=sorted(RECIPES), help="default: by what the model reads (text or image)")
    parser.add_argument(
        "--monitor",
        choices=MONITORS,
        help="with --val, what picks the kept epoch: acc = highest accuracy (the paper's §C.2), acc_nll = highest "
        f"accuracy, ties to the lower NLL, nll = lowest NLL {recipe_defaults('monitor')}",
    )
    parser.add_argument(
        "--patience",
        type=patience,
        help="with --val, stop after this many epochs without improvement; 0: every epoch runs "
        + recipe_defaults("patience"),
    )
    parser.add_argument("--epochs", type=int, help=f"at most this many epochs {recipe_defaults('epochs')}")
    parser.add_argument("--lr", type=float, help=f"peak learning rate {recipe_defaults('lr')}")
    parser.add_argument("--freeze-embeddings", action="store_true", help="keep the embeddings fixed")
    parser.add_argument("--train-last", type=int, help="train only the last K blocks (and the head)")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="bf16: mixed precision (forward under bfloat16 autocast, float32 weights; ~2x faster on CPUs with "
        "AMX or AVX512-BF16 and on GPUs with bf16) (default: fp32)",
    )
    parser.add_argument("--seed", type=int, default=0, help="batch order and dropout seed; member i uses seed + i")
    add_output_options(parser)
    add_data_options(parser)
    add_device_argument(parser)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    source = Path(args.model)
    members = (source / MEMBERS_FILE).is_file()
    sources = member_dirs(source, "--model") if members else [check_model_dir(source)]
    check_one_model(sources[0], "finetune", takes="one model or a members directory")
    kind, _ = load_preprocessor(sources[0])
    flags = {name: getattr(args, name) for name in ("epochs", "lr", "train_last", "monitor", "patience", "precision")}
    recipe = recipe_from_flags(args, kind, flags, "--val")
    recipe = recipe.with_(freeze_embeddings=args.freeze_embeddings)
    settings = {
        "model": fingerprint_path(source, "--model"),
        "data": fingerprint_path(args.data, "--data"),
        "val": fingerprint_path(args.val, "--val") if args.val else None,
        "recipe": recipe.key() | {"seed": args.seed},
        **data_settings(args),
    }
    out = start_step(args, "finetune", settings)
    if out is None:
        return 0
    train_examples = read_source(
        args.data, kind, text_column=args.text_column, label_column=args.label_column, labelled=True, flag="--data"
    )
    histories = {}
    for index, model_dir in enumerate(sources):
        name = f"member{index}" if members else "model"
        target = out.path / name
        if (target / "config.json").is_file():  # written whole, with its preprocessor (one atomic save)
            print(f"{name}: already fine-tuned ({target})")
            histories[name] = read_json_record(out.path / "histories" / f"{name}.json")
            continue
        torch.manual_seed(args.seed + index)  # a new classification head: reproducible, and its own per member
        model = _classifier(model_dir, train_examples.labels).to(device)
        train = read_data(args, args.data, model_dir, model.config, labelled=True, flag="--data").batches
        val = (
            read_data(args, args.val, model_dir, model.config, labelled=True, flag="--val").batches
            if args.val
            else None
        )
        checkpoints = out.path / "checkpoints" / name
        if (checkpoints / CHECKPOINT).exists():
            print(f"{name}: resuming from {checkpoints}")
        _warn_unused_classes(name, model.config, train_examples.labels)
        epochs = f"{recipe.epochs} epoch{'s' if recipe.epochs != 1 else ''}"
        print(f"{name}: fine-tuning on {len(train_examples)} examples ({epochs}, lr {recipe.lr:g})")
        finetune(
            model,
            train,
            recipe.with_(seed=args.seed + index),
            val_loader=val,
            checkpoint_dir=checkpoints,
            progress=not args.quiet,
        )
        histories[name] = {"epochs": model.training_history, "kept_epoch": model.kept_epoch}
        for record in model.training_history:
            print("  " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()))
        print(f"  {kept_epoch_line(model.training_history, model.kept_epoch, recipe, val is not None)}")
        write_json_atomic(out.path / "histories" / f"{name}.json", histories[name])
        save_predictor(model, target, also=lambda folder, source=model_dir: copy_preprocessor(source, folder))
        shutil.rmtree(checkpoints, ignore_errors=True)
    if members:
        index = json.loads((source / MEMBERS_FILE).read_text())
        write_json_atomic(out.path / MEMBERS_FILE, index)
    shutil.rmtree(out.path / "checkpoints", ignore_errors=True)
    shutil.rmtree(out.path / "histories", ignore_errors=True)  # now in the record
    out.finish({"model_dir": None if members else "model", "history": histories})
    print(f"wrote {out.path}" + ("" if members else "/model"))
    return 0


def kept_epoch_line(history: list[dict], kept: int, recipe, validated: bool) -> str:
    """Which epoch's weights were kept, and why."""
    ran = len(history)
    if not validated:
        return f"kept epoch {kept} of {ran}: the last (no --val to choose on)"
    key, best = ("val_nll", "lowest") if recipe.monitor == "nll" else ("val_acc", "highest")
    value = history[kept - 1][key]
    ties = "ties go to the lower NLL" if recipe.monitor == "acc_nll" else "ties keep the earlier epoch"
    stopped = (
        f"; stopped early, at epoch {ran} of {recipe.epochs}, after {recipe.patience} epochs without an "
        f"improvement over {recipe.min_delta:g}"
        if ran < recipe.epochs
        else ""
    )
    return (
        f"kept epoch {kept} of {ran}: {best} validation {'accuracy' if key == 'val_acc' else 'NLL'} "
        f"({value:.4f}; --monitor {recipe.monitor}, {ties}){stopped}"
    )


def _warn_unused_classes(name: str, config: transformers.PretrainedConfig, labels: list[str]) -> None:
    """A classifier with classes the training data never shows learns never to predict them: say so."""
    try:
        used = set(label_ids(labels, class_ids(config), config.num_labels))
    except ValueError:
        return  # unknown labels: reading the data reports them
    unused = [str(config.id2label[i]) for i in range(config.num_labels) if i not in used]
    if unused:
        print(
            f"{name}: warning: the classifier has {config.num_labels} classes but the training data has no "
            f"example of {len(unused)} of them: {unused}. They will hardly ever be predicted; if the task has "
            "fewer classes, fine-tune the base encoder instead (it gets a new head over your labels)."
        )


def _classifier(model_dir: Path, labels: list[str]) -> transformers.PreTrainedModel:
    """The checkpoint as a classifier: as saved when it has a classification head, else with a new head over the
    classes in the training labels (sorted)."""
    config = transformers.AutoConfig.from_pretrained(model_dir)
    names = getattr(config, "architectures", None) or []
    if any(name.endswith(("ForSequenceClassification", "ForImageClassification")) for name in names):
        return load_model(model_dir).train()
    if not has_classifier_class(config):
        raise CommandError(f"--model {str(model_dir)!r} has no classifier, and {head_hint(config)}")
    classes = sorted(
        set(labels), key=lambda x: (not x.lstrip("-").isdigit(), int(x) if x.lstrip("-").isdigit() else 0, x)
    )
    print(f"new classification head over {len(classes)} classes: {classes}")
    kind, _ = load_preprocessor(model_dir)
    auto = (
        transformers.AutoModelForSequenceClassification
        if kind == "text"
        else transformers.AutoModelForImageClassification
    )
    try:
        return auto.from_pretrained(
            model_dir,
            num_labels=len(classes),
            id2label=dict(enumerate(classes)),
            label2id={c: i for i, c in enumerate(classes)},
        ).train()
    except ValueError as error:
        raise CommandError(f"--model {str(model_dir)!r}: cannot add a classification head: {error}") from None
