"""A saved BatchEnsemble works in `hydra-ens evaluate` and `predict` as any predictor: the command's member logits
and predictions are the library's on the same files."""

from __future__ import annotations

import json

import torch
from cli_support import hydra_ens, image_classifier, image_files  # noqa: F401 (fixtures)
from tolerances import CONTRACT

import hydra_ensembles as he
from hydra_ensembles.data.files import read_encoded
from hydra_ensembles.evaluation.compare import row_file
from hydra_ensembles.outputs import collect_member_logits
from hydra_ensembles.predictors import (
    batch_ensemble,
    copy_preprocessor,
    load_predictor,
    load_preprocessor,
    save_predictor,
)


def test_a_saved_batch_ensemble_is_evaluated_and_predicts_as_the_library(tmp_path, image_files, image_classifier):
    saved = tmp_path / "batch-ensemble"
    save_predictor(batch_ensemble(he.load_model(image_classifier), members=3, seed=0), saved)
    copy_preprocessor(image_classifier, saved)
    f = {k: str(v) for k, v in image_files.items()}
    out = tmp_path / "report"
    hydra_ens(
        "evaluate", "--model", f"be={saved}", "--data", f["test"], "--far", f"stripes={f['ood']}", "--out", str(out)
    )
    ensemble = load_predictor(saved)
    kind, processor = load_preprocessor(saved)
    test = read_encoded(f["test"], kind, processor, ensemble.base.config).batches
    expected = collect_member_logits(ensemble, test)
    assert expected.shape == (12, 3, 2) and (expected[:, 0] - expected[:, 1]).abs().max() > 1e-3
    recorded = torch.load(row_file(out / "logits", "be"))["test"]
    torch.testing.assert_close(recorded, expected, atol=CONTRACT, rtol=0)
    result = json.loads((out / "metrics.json").read_text())["results"]["be"]["metrics"]
    labels = torch.cat([b["labels"] for b in test])
    assert result["id"]["acc"] == he.metrics.accuracy(he.ensemble_probs(expected), labels)
    predicted = hydra_ens(
        "predict", "--model", str(saved), "--inputs", f["ood"], "--format", "jsonl", "--threshold", "0.5"
    )
    rows = [json.loads(line) for line in predicted.stdout.splitlines() if line.startswith("{")]
    ood = read_encoded(f["ood"], kind, processor, ensemble.base.config, labelled=False).batches
    probs = he.ensemble_probs(collect_member_logits(ensemble, ood))
    assert len(rows) == len(probs) == 6
    for row, p in zip(rows, probs, strict=True):
        assert row["prediction"] == ensemble.base.config.id2label[int(p.argmax())]
