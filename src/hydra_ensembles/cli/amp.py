"""Adaptive MLP pruning (paper 002): shrink every MLP to the hidden size its block needs, then recover.

Neuron importance (Eq. 4) on --data (the pruning set; labels used by --loss cross_entropy only), then per block,
last to first, a binary search (--t-max steps) of the hidden size whose criterion rises by less than --delta-e;
the removed neurons are pruned structurally. With --recover-data, the pruned model is distilled from the
unpruned one (MSE on the last layer's [CLS] and token features, Eq. 8) for --epochs. Writes <out>/model/ (an HF
checkpoint with its kept neurons, which every later step takes as --model: scores, circuit, members, fuse).
"""

from __future__ import annotations

import argparse
import copy
import shutil

from ..adapters import get_adapter
from ..cost import count_parameters
from ..importance import adaptive_mlp_pruning
from ..importance.losses import loss_choices, needs_labels
from ..importance.neurons import check_search_args
from ..predictors import copy_preprocessor, save_predictor
from ..pruning import load_model
from ..training import AMP_RECOVERY, recover
from .common import (
    CommandError,
    add_data_options,
    add_device_argument,
    check_one_model,
    data_settings,
    read_data,
    resolve_device,
)
from .step import add_output_options, check_model_dir, fingerprint_path, start_step

EXAMPLE = """hydra-ens amp --model single --data val.csv --delta-e 0.01 --out amp
hydra-ens amp --model single --data val.csv --delta-e 0.01 --recover-data train.csv --epochs 3 --out amp-recovered
hydra-ens members --model amp --scores scores --out members            # then the usual steps on the AMP base"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="an HF checkpoint directory (a classifier or an encoder)")
    parser.add_argument("--data", required=True, help="the pruning set (paper 002: a small sample of training data)")
    parser.add_argument(
        "--delta-e", type=float, required=True, help="the criterion increase each block may cause (paper: 1e-4..0.1)"
    )
    parser.add_argument("--t-max", type=int, default=6, help="binary-search steps per block (the paper's: 6)")
    parser.add_argument(
        "--loss",
        choices=loss_choices(),
        default="entropy",
        help="criterion for importance and search: entropy of the predictions, label-free; similarity: "
        "Eq. 5-7 on the [CLS] token, label-free; auto: cross-entropy with labels)",
    )
    parser.add_argument("--temperature", type=float, default=1 / 15, help="tau of the encoders' similarity entropy")
    parser.add_argument("--recover-data", help="data to distil the pruned model from the unpruned one on (Eq. 8)")
    parser.add_argument(
        "--epochs", type=int, help=f"recovery epochs, with --recover-data (default {AMP_RECOVERY.epochs})"
    )
    parser.add_argument(
        "--lr",
        type=float,
        help=f"recovery learning rate (AdamW, cosine), with --recover-data (default {AMP_RECOVERY.lr:g})",
    )
    add_output_options(parser)
    add_data_options(parser)
    add_device_argument(parser)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    model_dir = check_model_dir(args.model)
    check_one_model(model_dir, "amp")
    if args.recover_data is None and (args.epochs is not None or args.lr is not None):
        raise CommandError("--epochs and --lr set the recovery, which --recover-data FILE runs: pass it, or drop them.")
    args.epochs = AMP_RECOVERY.epochs if args.epochs is None else args.epochs
    args.lr = AMP_RECOVERY.lr if args.lr is None else args.lr
    settings = {
        "model": fingerprint_path(model_dir, "--model"),
        "data": fingerprint_path(args.data, "--data"),
        "recover_data": fingerprint_path(args.recover_data, "--recover-data") if args.recover_data else None,
        **{k: getattr(args, k) for k in ("delta_e", "t_max", "loss", "temperature", "epochs", "lr")},
        **data_settings(args),
    }
    try:  # refused before the step starts, so a refused run leaves no unfinished --out
        check_search_args(args.delta_e, args.t_max, args.temperature)
        config = AMP_RECOVERY.with_(epochs=args.epochs, lr=args.lr)
    except ValueError as error:
        raise CommandError(f"{error} (--delta-e, --t-max, --temperature, --epochs, --lr)") from None
    out = start_step(args, "amp", settings, "model")
    if out is None:
        return 0
    model = load_model(model_dir).to(device)
    labelled = needs_labels(args.loss, get_adapter(model).is_classifier(model))
    data = read_data(args, args.data, model_dir, model.config, labelled=labelled, flag="--data")
    pruned, record = adaptive_mlp_pruning(
        model,
        data.batches,
        args.delta_e,
        t_max=args.t_max,
        loss=args.loss,
        temperature=args.temperature,
        progress=not args.quiet,
    )
    before, after = count_parameters(model), count_parameters(pruned)
    print(f"MLP hidden sizes per block: {record.sizes} (criterion {record.baseline:.4f} -> {record.entropies[-1]:.4f})")
    print(f"parameters: {before / 1e6:.2f} M -> {after / 1e6:.2f} M ({after / before:.1%})")
    history = None
    if args.recover_data:
        train = read_data(args, args.recover_data, model_dir, model.config, labelled=False, flag="--recover-data")
        recover(
            pruned,
            copy.deepcopy(model),
            train.batches,
            config,
            checkpoint_dir=out.path / "checkpoint",
            progress=not args.quiet,
        )
        history = pruned.training_history
        print(
            f"recovered: feature MSE {history[0]['loss']:.4f} in epoch 1, {history[-1]['loss']:.4f} in epoch "
            f"{len(history)}"
        )
    save_predictor(pruned, out.path / "model", also=lambda folder: copy_preprocessor(model_dir, folder))
    shutil.rmtree(out.path / "checkpoint", ignore_errors=True)
    out.finish(
        {
            "model_dir": "model",
            "sizes": record.sizes,
            "baseline": record.baseline,
            "entropies": record.entropies,
            "parameters": {"before": before, "after": after},
            "recovery": history,
        }
    )
    print(f"wrote {out.path}/model")
    return 0
