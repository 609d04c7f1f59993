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


def test_the_head_sweep_draws_each_budget_at_its_own_place(tmp_path, monkeypatch):
    """Budgets [1, 2, 3] with rows for 1 and 3 only: budget 3's value was drawn at 2 (x cut to the values' count)."""
    drawn = {}

    def keep(fig, path):
        drawn["lines"] = [(line.get_label(), list(line.get_xdata())) for line in fig.axes[0].get_lines()]
        return path

    monkeypatch.setattr(plots, "_save", keep)
    stat = {"id.acc": {"mean": 0.8}, "all.auroc": {"mean": 0.7}, "all.fpr95": {"mean": 0.5}}
    rows = {"Taylor, 1 pruned/layer, fine-tuned": stat, "Taylor, 3 pruned/layer, fine-tuned": stat}
    plots.sweep_figure({"rows": rows, "budgets": [1, 2, 3]}, tmp_path / "sweep.png")
    assert drawn["lines"] == [("Taylor, fine-tuned", [1, 3])]


def test_the_ood_figure_shows_the_score_the_report_uses(tmp_path, monkeypatch):
    """ood_scores.png showed 1 - MSP under evaluate --score energy, beside a table of energy AUROCs."""
    from hydra_ensembles.evaluation.ood import OOD_SCORES

    shown = {}
    monkeypatch.setattr(
        plots, "ood_histograms", lambda panels, path, name, title: shown.update(panels=panels, name=name)
    )
    g = torch.Generator().manual_seed(0)
    run = {"test": torch.randn(20, 2, 3, generator=g), "far": {"x": torch.randn(10, 2, 3, generator=g)}}
    for score, name in (("energy", "energy"), ("msp", "1 - MSP"), ("max_logit", "-max logit"), ("knn", "1 - MSP")):
        plots.logit_figures({"hydra": run}, torch.zeros(20, dtype=torch.long), tmp_path, "t", score)
        used = score if score in OOD_SCORES else "msp"
        assert shown["name"] == name and torch.equal(
            shown["panels"]["hydra"]["ID"], OOD_SCORES[used](run["test"].double())
        )


def test_a_constant_score_is_drawn_in_one_bin_without_warnings(tmp_path):
    """A one-member model's mutual information is 0 everywhere: 31 identical bin edges gave an empty panel and a
    division by zero."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.ood_histograms({"single": {"ID": torch.zeros(10), "far": torch.zeros(5)}}, tmp_path / "o.png", "MI")
    assert (tmp_path / "o.png").stat().st_size > 0
