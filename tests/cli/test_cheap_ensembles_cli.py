"""`hydra-ens evaluate` and `predict` take the cheap ensembles trained from scratch (Packed-Ensembles, MIMO) as
saved predictors, as they take any other."""

from __future__ import annotations

import json

import pytest
import transformers as T
from cli_support import hydra_ens, image_classifier, image_files  # noqa: F401 (fixtures)

from hydra_ensembles.predictors import copy_preprocessor, mimo, packed_ensemble, save_predictor

BUILDERS = {"packed": lambda model: packed_ensemble(model, members=3, alpha=2.0), "mimo": lambda model: mimo(model)}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_evaluate_and_predict_take_the_saved_ensemble(kind, tmp_path, image_files, image_classifier):
    f = {k: str(v) for k, v in image_files.items()}
    model = T.ViTForImageClassification.from_pretrained(image_classifier)
    saved = tmp_path / kind
    save_predictor(BUILDERS[kind](model), saved)
    copy_preprocessor(image_classifier, saved)
    hydra_ens(
        "evaluate",
        "--model",
        str(saved),
        "--data",
        f["test"],
        "--far",
        f"stripes={f['ood']}",
        "--out",
        str(tmp_path / "report"),
    )
    report = json.loads((tmp_path / "report" / "metrics.json").read_text())["results"][kind]
    assert set(report["metrics"]) == {"id", "ood", "far", "all"} and report["params"] > 0
    predicted = hydra_ens("predict", "--model", str(saved), "--inputs", f["ood"], "--threshold", "-0.5")
    assert "stripes0.png" in predicted.stdout
