"""CI smoke test of `hydra-ens demo`: the real pipeline (BBC News, drug reviews, Reuters, circuits, both Hydra
Ensembles, report folder) on a tiny encoder and tiny splits; the second run reuses every cached model."""

from __future__ import annotations

import json

from cli_support import hydra_ens, text_encoder, text_files


def test_demo_pipeline_on_a_tiny_configuration(tmp_path, text_encoder):
    args = [
        "demo",
        "--size",
        "smoke",
        "--model",
        str(text_encoder),
        "--cache",
        str(tmp_path / "cache"),
        "--device",
        "cpu",
    ]
    first = hydra_ens(*args, "--out", str(tmp_path / "report"), timeout=900)
    assert " on cpu; rows: " in first.stdout
    for row in ("Single", "Hydra (Taylor)", "Hydra (Circ)"):
        assert f"] {row}" in first.stdout  # built and measured
    assert "Hydra (Circ)'s circuit: " in first.stdout and 'removals tied (tie rule "score"' in first.stdout
    report = tmp_path / "report"
    for name in ("README.md", "table.md", "table.json", "reliability.png", "ood_scores.png", "head_importance.png"):
        assert (report / name).stat().st_size > 0, name
    table = json.loads((report / "table.json").read_text())
    assert set(table["rows"]) == {"Single", "Hydra (Taylor)", "Hydra (Circ)"}
    assert set(table["per_seed"]["0"]["Single"]["metrics"]["ood"]) == {
        "bbc-entertainment",
        "bbc-tech",
        "drug-reviews",
        "amazon",
    }
    assert table["rows"]["Hydra (Taylor)"]["heads"] == "3x3"  # a third of each layer's 4 heads pruned, 3 members
    assert "| Hydra (Circ) |" in (report / "table.md").read_text()
    assert "How to read it" in (report / "README.md").read_text()

    second = hydra_ens(*args, "--out", str(tmp_path / "again"), timeout=300)
    assert "] Single" not in second.stdout and "Hydra (Circ)" in second.stdout  # nothing rebuilt, table printed
    again = json.loads((tmp_path / "again" / "table.json").read_text())
    assert again["per_seed"] == table["per_seed"]
