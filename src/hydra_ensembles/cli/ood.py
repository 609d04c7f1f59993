"""Feature-space OOD detectors: fit MDS, RMDS, KNN and ViM on a classifier's training features, save them with it.

They read each member's penultimate features (what its final linear classifier reads) and are fit once, on the
labelled training data: class means and one shared covariance (MDS; RMDS adds the class-blind background
Gaussian), the normalised training features themselves (KNN), the principal subspace and its scale (ViM). An
ensemble gets one detector per member, on that member's own features. Writes <out>/model: the classifier with its
detectors; `predict` and `evaluate` take <out> as --model with --score mds, rmds, knn or vim (the members' scores
averaged) or mds_concat, rmds_concat, knn_concat, vim_concat (one detector on the members' features side by
side). Definitions and conventions: docs/ood_scores.md.
"""

from __future__ import annotations

import argparse

from ..evaluation.ood import OOD_SCORES
from ..predictors import describe_saved, fit_feature_scores, model_config, save_predictor
from ..predictors.classifier import copy_tower_preprocessors
from ..predictors.feature_ood import FEATURE_SCORES
from ..predictors.feature_scored import FEATURE_SCORE_NAMES
from .common import (
    CommandError,
    add_data_options,
    add_device_argument,
    classifier_at,
    data_settings,
    on_device,
    read_data,
    resolve_device,
)
from .step import add_output_options, check_model_dir, fingerprint_path, start_step

EXAMPLE = """hydra-ens ood --model hydra --data train.csv --out hydra-ood
hydra-ens predict --model hydra-ood --inputs new.txt --calibration val.csv --score vim
hydra-ens evaluate --model hydra=hydra-ood --data test.csv --far reviews.txt --score mds --out report"""

SCORE_NAMES = sorted(OOD_SCORES) + FEATURE_SCORE_NAMES  # what predict and evaluate --score take


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help="a saved HF classifier, Hydra Ensemble or deep ensemble (calibrated or not)"
    )
    parser.add_argument("--data", required=True, help="labelled training data to fit the detectors on")
    parser.add_argument("--scores", default=",".join(FEATURE_SCORES), help="the detectors to fit, comma-separated")
    parser.add_argument("--k", type=int, default=50, help="KNN: the neighbour whose distance is the score")
    parser.add_argument(
        "--vim-dim",
        type=int,
        help="ViM: the principal subspace's dimension; left out: 1000 for >= 2048 features, 512 for >= 768, else half",
    )
    add_output_options(parser)
    add_data_options(parser)
    add_device_argument(parser)


def run(args: argparse.Namespace) -> int:
    scores = [name.strip() for name in args.scores.split(",") if name.strip()]
    unknown = sorted(set(scores) - set(FEATURE_SCORES))
    if unknown or not scores:
        raise CommandError(f"--scores {args.scores!r}: choose among {', '.join(FEATURE_SCORES)} (comma-separated).")
    device = resolve_device(args.device)
    model_dir = check_model_dir(args.model)
    settings = {
        "model": fingerprint_path(model_dir, "--model"),
        "data": fingerprint_path(args.data, "--data"),
        "scores": scores,
        "k": args.k,
        "vim_dim": args.vim_dim,
        **data_settings(args),
    }
    out = start_step(args, "ood", settings, "model")
    if out is None:
        return 0
    model = on_device(classifier_at(model_dir), device)
    train = read_data(args, args.data, model_dir, model_config(model), labelled=True, flag="--data").batches
    scored = fit_feature_scores(model, train, scores, k=args.k, vim_dim=args.vim_dim, progress=not args.quiet)
    target = out.path / "model"
    save_predictor(scored, target, also=lambda folder: copy_tower_preprocessors(model_dir, folder))
    out.finish({"model_dir": "model", "scores": scores, "examples": scored.examples} | _fitted(scored))
    members = len(next(iter(scored.detectors.values())).members)
    print(f"fitted {', '.join(scores)} on the features of {scored.examples} training inputs, {members} member(s)")
    print(f"wrote {target}: {describe_saved(target)}")
    print(f"use it: hydra-ens predict --model {out.path} --score {scores[0]} ... (or {scores[0]}_concat)")
    return 0


def _fitted(scored) -> dict:
    """What was chosen from the data: KNN's k (at most the training inputs), ViM's principal dimension."""
    fitted = {}
    if "knn" in scored.detectors:
        fitted["k"] = int(scored.detectors["knn"].members[0].k)
    if "vim" in scored.detectors:
        vim = scored.detectors["vim"].members[0]
        fitted["vim_dim"] = vim.null_basis.shape[0] - vim.null_basis.shape[1]
    return fitted
