"""Figures are written as PNG files."""

import torch

from hydra_ensembles.evaluation import plots


def test_figures_are_written(tmp_path):
    g = torch.Generator().manual_seed(0)
    probs = torch.randn(200, 4, generator=g).softmax(-1)
    labels = torch.randint(0, 4, (200,), generator=g)
    paths = [
        plots.reliability_diagram(
            {"single": (probs, labels), "hydra": (probs.sqrt().softmax(-1), labels)}, tmp_path / "reliability.png"
        ),
        plots.ood_histograms({"single": {"ID": torch.randn(50), "near": torch.randn(30) + 1}}, tmp_path / "ood.png"),
        plots.head_heatmap(
            {"taylor": torch.rand(3, 4), "circuit": torch.tensor([[1.0, float("nan")], [0, 2]])}, tmp_path / "heads.png"
        ),
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
