"""Taylor head importance: one score per attention head, higher = more useful (paper 000, §D.1.1).

Writes scores.safetensors ("scores": (layers, heads), NaN for heads already pruned), scores.json (every score,
and each layer's heads from least to most useful) and head_importance.png. Labelled data gives cross-entropy
scores; unlabelled data (or --loss entropy) the label-free entropy criterion. By default the scores are the
paper's sequential ones: each layer's least useful third is pruned before the next layer is scored.
"""

from __future__ import annotations

import argparse

import safetensors.torch

from ..adapters import get_adapter
from ..evaluation import plots
from ..importance import taylor_head_scores
from ..importance.losses import choose_loss, loss_choices, needs_labels
from ..io import replacing, write_json_atomic
from ..pruning import kept_heads
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
from .step import add_output_options, check_model_dir, fingerprint_path, start_step

EXAMPLE = """hydra-ens scores --model my-classifier --data val.csv --out scores   # sequential: a third per layer
hydra-ens scores --model my-classifier --data val.csv --sequential 0 --out scores-one-shot   # every layer at once"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a fine-tuned HF classifier directory")
    parser.add_argument("--data", required=True, help="calibration data: CSV / JSONL / .txt, or an image folder")
    parser.add_argument(
        "--loss",
        choices=loss_choices(),
        default="auto",
        help="auto: cross-entropy when the data has labels, entropy otherwise; similarity: Eq. 5-7 of paper 002 "
        "on the [CLS] token (label-free)",
    )
    parser.add_argument(
        "--sequential",
        type=_budget,
        metavar="K",
        help="prune-and-recompute (paper §D.1.1): after scoring each layer, prune its K least useful heads before "
        "scoring the next; K is one number or one per layer, comma-separated (e.g. 4 or 2,2,4,4,6,6); 0: score "
        "every layer at once, nothing pruned (default: a third of each layer's heads, the budget `members` prunes)",
    )
    add_output_options(parser)
    add_data_options(parser)
    add_device_argument(parser)


def _budget(text: str) -> int | list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of heads or a comma-separated list, got {text!r}"
        ) from None
    return values[0] if len(values) == 1 else values


def sequential_budget(given: int | list[int] | None, model) -> int | list[int] | None:
    """The prune-and-recompute budget: --sequential as given; when not given, a third of each layer's kept heads
    (the paper's mode, at the budget `members` prunes by default; one number when every layer has the same);
    None (one-shot) for 0, or when no layer has three heads to take a third of."""
    if given is not None:
        return None if given == 0 else given
    thirds = [len(heads) // 3 for heads in kept_heads(model).values()]
    if not any(thirds):
        return None
    return thirds[0] if len(set(thirds)) == 1 else thirds


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    model_dir = check_model_dir(args.model)
    check_one_model(model_dir, "scores")
    settings = {
        "model": fingerprint_path(model_dir, "--model"),
        "data": fingerprint_path(args.data, "--data"),
        "loss": args.loss,
        "sequential": "a third" if args.sequential is None else args.sequential,  # not None: None was one-shot
        **data_settings(args),
    }
    out = start_step(args, "scores", settings, "scores.safetensors")
    if out is None:
        return 0
    model = on_device(classifier_at(model_dir), device)
    sequential = sequential_budget(args.sequential, model)
    labelled = needs_labels(args.loss)
    data = read_data(args, args.data, model_dir, model.config, labelled=labelled, flag="--data")
    classifier = get_adapter(model).is_classifier(model)
    loss = choose_loss(args.loss, classifier, data.batches)  # what "auto" means here, recorded and said
    if args.loss == "auto":
        why = (
            "labelled data"
            if loss == "cross_entropy"
            else "the model has no classifier"
            if not classifier
            else f"no label column {args.label_column!r} in --data: read as unlabelled (--label-column names it)"
        )
        print(f"--loss auto: {loss} ({why})")
    try:
        scores = taylor_head_scores(
            model, data.batches, loss=loss, sequential_budget=sequential, progress=not args.quiet
        )
    except ValueError as error:  # a budget the heads cannot meet, refused before any scoring: name the flag
        if "sequential_budget" not in str(error):
            raise
        raise CommandError(str(error).replace("sequential_budget", "--sequential")) from None
    with replacing(out.path / "scores.safetensors") as tmp:  # `members --scores` reads whatever is there
        safetensors.torch.save_file({"scores": scores.contiguous()}, tmp)
    plots.head_heatmap({"Taylor score": scores}, out.path / "head_importance.png", title="Taylor head importance")
    ranked = {
        str(layer): sorted((h for h in range(scores.shape[1]) if not row[h].isnan()), key=lambda h: row[h].item())
        for layer, row in enumerate(scores)
    }
    write_json_atomic(
        out.path / "scores.json",
        {
            "scores": [[None if v != v else v for v in row] for row in scores.tolist()],  # NaN (pruned) -> null
            "least_useful_first": ranked,
            "loss": loss,
            "sequential": sequential,
            "examples": len(data.examples),
        },
    )
    out.finish(
        {"shape": list(scores.shape), "loss": loss, "least_useful_first": ranked, "examples": len(data.examples)}
    )
    mode = f", sequential: {sequential} pruned per layer before the next is scored" if sequential else ", one-shot"
    shape = f"{scores.shape[0]} layers x {scores.shape[1]} heads"
    print(f"scored {shape} on {len(data.examples)} examples{mode} -> {out.path}")
    for layer, heads in ranked.items():
        print(f"  layer {layer}: least useful first {heads}")
    return 0
