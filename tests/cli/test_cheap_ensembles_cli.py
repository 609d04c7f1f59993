"""`hydra-ens evaluate` and `predict` take the cheap ensembles trained from scratch (Packed-Ensembles, MIMO) as
saved predictors, as they take any other: the command's member logits and predictions are the library's on the
same files."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from cli_support import hydra_ens, image_classifier, image_files  # noqa: F401 (fixtures)
from tolerances import CONTRACT

import hydra_ensembles as he
from hydra_ensembles.data.files import read_encoded
from hydra_ensembles.evaluation.compare import row_file
from hydra_ensembles.outputs import collect_member_logits
from hydra_ensembles.predictors import (
    copy_preprocessor,
    load_predictor,
    load_preprocessor,
    mimo,
    model_config,
    packed_ensemble,
    save_predictor,
)

BUILDERS = {"packed": lambda model: packed_ensemble(model, members=3, alpha=2.0), "mimo": lambda model: mimo(model)}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_evaluate_and_predict_take_the_saved_ensemble(kind, tmp_path, image_files, image_classifier):
    f = {k: str(v) for k, v in image_files.items()}
    model = T.ViTForImageClassification.from_pretrained(image_classifier)
    saved = tmp_path / kind
    save_predictor(BUILDERS[kind](model), saved)
    copy_preprocessor(image_classifier, saved)
    out = tmp_path / "report"
    hydra_ens("evaluate", "--model", str(saved), "--data", f["test"], "--far", f"stripes={f['ood']}", "--out", str(out))
    ensemble, (preprocessing, processor) = load_predictor(saved), load_preprocessor(saved)
    config = model_config(ensemble)
    test = read_encoded(f["test"], preprocessing, processor, config).batches
    expected = collect_member_logits(ensemble, test)  # (N, M, C): its own members, not the base ViT's one
    assert expected.shape == (12, 3, 2) and (expected[:, 0] - expected[:, 1]).abs().max() > 1e-3
    torch.testing.assert_close(torch.load(row_file(out / "logits", kind))["test"], expected, atol=CONTRACT, rtol=0)
    report = json.loads((out / "metrics.json").read_text())["results"][kind]
    labels = torch.cat([b["labels"] for b in test])
    assert report["metrics"]["id"]["acc"] == he.metrics.accuracy(he.ensemble_probs(expected), labels)
    assert report["params"] == sum(p.numel() for p in ensemble.parameters())
    predicted = hydra_ens(
        "predict", "--model", str(saved), "--inputs", f["ood"], "--format", "jsonl", "--threshold", "0.5"
    )
    rows = [json.loads(line) for line in predicted.stdout.splitlines() if line.startswith("{")]
    ood = read_encoded(f["ood"], preprocessing, processor, config, labelled=False).batches
    probs = he.ensemble_probs(collect_member_logits(ensemble, ood))
    assert len(rows) == len(probs) == 6 and "stripes0.png" in rows[0]["input"] + rows[-1]["input"]
    for row, p in zip(rows, probs, strict=True):
        assert row["prediction"] == config.id2label[int(p.argmax())]
        assert row["probability"] == pytest.approx(p.max().item(), abs=5e-5 + CONTRACT)
