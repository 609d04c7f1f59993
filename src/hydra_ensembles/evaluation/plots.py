"""Figures saved next to the benchmark tables: reliability diagrams, OOD score histograms, head heatmaps,
risk-coverage curves, shift curves, cost against quality."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..metrics import augrc, aurc
from ..metrics.aurc import confidence_and_error, risk_coverage_points
from ..metrics.ece import bin_index
from ..uncertainty import decompose, ensemble_probs
from .ood import OOD_SCORES
from .tables import latency_ratio


@cache
def _pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display), imported when the first figure is drawn:
    most of a second that commands drawing nothing (and `hydra-ens --help`) need not pay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def reliability_diagram(
    curves: Mapping[str, tuple[Tensor, Tensor]], path: str | os.PathLike, bins: int = 15, title: str = "Reliability"
) -> Path:
    """Accuracy against confidence in `bins` equal-width bins, one panel per model: {name: (probs, labels)}."""
    fig, axes = _pyplot().subplots(1, len(curves), figsize=(3.2 * len(curves), 3.2), squeeze=False, sharey=True)
    edges = np.linspace(0, 1, bins + 1)
    for ax, (name, (probs, labels)) in zip(axes[0], curves.items()):
        confidence, prediction = probs.double().max(dim=1)
        correct = (prediction == labels).double().numpy()
        index = bin_index(confidence, bins).numpy()
        counts = np.bincount(index, minlength=bins)
        accuracy = np.bincount(index, weights=correct, minlength=bins) / np.maximum(counts, 1)
        mean_conf = np.bincount(index, weights=confidence.numpy(), minlength=bins) / np.maximum(counts, 1)
        filled = counts > 0
        ax.bar(
            edges[:-1][filled],
            accuracy[filled],
            width=1 / bins,
            align="edge",
            color="tab:blue",
            alpha=0.8,
            edgecolor="black",
            linewidth=0.5,
            label="accuracy",
        )
        ax.bar(
            edges[:-1][filled],
            (mean_conf - accuracy)[filled],
            bottom=accuracy[filled],
            width=1 / bins,
            align="edge",
            color="tab:red",
            alpha=0.3,
            label="gap to confidence",
        )
        ax.plot([0, 1], [0, 1], "--", color="gray", linewidth=1)
        ax.set(title=name, xlabel="confidence", xlim=(0, 1), ylim=(0, 1))
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].legend(loc="upper left", fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def ood_histograms(
    panels: Mapping[str, Mapping[str, Tensor]],
    path: str | os.PathLike,
    score_name: str = "1 - MSP",
    title: str = "OOD scores",
) -> Path:
    """Histograms of an OOD score ("higher = more OOD"), one panel per model: {model: {"ID": s, "near": s, ...}}."""
    fig, axes = _pyplot().subplots(1, len(panels), figsize=(3.6 * len(panels), 3.0), squeeze=False)
    for ax, (name, groups) in zip(axes[0], panels.items()):
        values = np.concatenate([g.double().numpy() for g in groups.values()])
        low, high = values.min(), values.max()
        if low == high:  # one value (a one-member model's MI): a unit-wide bin rather than 31 empty ones
            low, high = low - 0.5, high + 0.5
            ax.text(0.5, 0.9, "constant score", transform=ax.transAxes, ha="center", fontsize=8)
        edges = np.linspace(low, high, 31)
        for group, scores in groups.items():
            ax.hist(scores.double().numpy(), bins=edges, density=True, alpha=0.45, label=group)
        ax.set(title=name, xlabel=f"{score_name} score (higher = more OOD)")
    axes[0][0].set_ylabel("density")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def risk_coverage(
    curves: Mapping[str, tuple[Tensor, Tensor]], path: str | os.PathLike, title: str = "Risk-coverage"
) -> Path:
    """Selective risk (errors / accepted) and generalized risk (errors accepted / all) against coverage, in %, one
    line per model: {name: (probs (N, C), labels (N,))}. A point per distinct confidence threshold, joined by
    straight lines as the trapezoid areas AURC and AUGRC (`metrics.aurc`, `metrics.augrc`) read them; the areas are
    in the legend."""
    fig, (selective, generalized) = _pyplot().subplots(1, 2, figsize=(8.4, 3.4))
    for name, (probs, labels) in curves.items():
        confidence, error = confidence_and_error(probs, labels)
        coverage, errors, accepted = risk_coverage_points(confidence, error)
        risk, general = errors / accepted, errors / len(error)
        from_zero = 100 * np.r_[0.0, coverage]  # risk held flat to coverage 0; generalized risk 0 there
        selective.plot(from_zero, 100 * np.r_[risk[0], risk], label=f"{name} (AURC {100 * aurc(probs, labels):.2f})")
        generalized.plot(from_zero, 100 * np.r_[0.0, general], label=f"{name} (AUGRC {100 * augrc(probs, labels):.2f})")
    selective.set(xlabel="coverage (%)", ylabel="selective risk (%)", xlim=(0, 100), title="errors / accepted")
    generalized.set(xlabel="coverage (%)", ylabel="generalized risk (%)", xlim=(0, 100), title="errors accepted / all")
    for ax in (selective, generalized):
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def shift_curves(
    series: Mapping[str, Mapping[int, float]], path: str | os.PathLike, ylabel: str, title: str = "Shift"
) -> Path:
    """One metric against shift severity (0 = clean), one line per model: {model: {severity: value}} (the mean over
    the shifts, `shift.mean_over_shifts`)."""
    fig, ax = _pyplot().subplots(figsize=(4.4, 3.2))
    for name, points in series.items():
        severities = sorted(points)
        ax.plot(severities, [points[s] for s in severities], marker="o", label=name)
    ax.set(xlabel="severity (0 = clean)", ylabel=ylabel, xticks=sorted({s for p in series.values() for s in p}))
    ax.legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def head_heatmap(maps: Mapping[str, Tensor], path: str | os.PathLike, title: str = "Head importance") -> Path:
    """Layer x head heatmaps (like the paper's Fig. 7), one per map: {name: (L, H) scores}; NaN = pruned."""
    fig, axes = _pyplot().subplots(1, len(maps), figsize=(4.2 * len(maps), 3.2), squeeze=False)
    for ax, (name, scores) in zip(axes[0], maps.items()):
        data = np.ma.masked_invalid(scores.double().numpy())
        image = ax.imshow(data, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set(title=name, xlabel="head", ylabel="layer", xticks=range(scores.shape[1]), yticks=range(scores.shape[0]))
        ax.tick_params(labelsize=6)
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(title)
    return _save(fig, path)


def sweep_figure(summary: Mapping, path: str | os.PathLike) -> Path:
    """Paper Figures 5-6: accuracy, all-OOD AUROC and FPR95 (%) against heads pruned per layer, Taylor and
    CircAvg, zero-shot (dashed) and fine-tuned (solid), Single as a grey line. `summary`: `bench.suite.head_sweep`."""
    rows, budgets = summary["rows"], summary["budgets"]
    metrics = (("Accuracy", "id.acc"), ("AUROC, all OOD", "all.auroc"), ("FPR95, all OOD", "all.fpr95"))
    fig, axes = _pyplot().subplots(1, len(metrics), figsize=(4 * len(metrics), 3.2))
    for ax, (title, key) in zip(axes, metrics):
        if key in rows.get("Single", {}):
            ax.axhline(100 * rows["Single"][key]["mean"], color="grey", lw=1, label="Single")
        for method, color in (("Taylor", "tab:blue"), ("CircAvg", "tab:orange")):
            for stage, style in (("zero-shot", "--"), ("fine-tuned", "-")):
                named = {b: f"{method}, {b} pruned/layer, {stage}" for b in budgets}
                done = [b for b, name in named.items() if name in rows]  # each value at its own budget
                if done:
                    values = [100 * rows[named[b]][key]["mean"] for b in done]
                    ax.plot(done, values, style, color=color, marker="o", label=f"{method}, {stage}")
        ax.set(title=title, xlabel="heads pruned per layer", xticks=list(budgets))
    axes[0].legend(fontsize=7)
    return _save(fig, path)


def cost_curve(summary: Mapping, path: str | os.PathLike, title: str = "Cost and quality") -> Path:
    """Quality against cost, one point per row: test all-OOD AUROC (%) and test NLL against latency x Single
    (FLOPs x Single when the rows were not timed), Single's values as dashed lines. `summary`: a benchmark table's
    ("rows": {row: aggregated stats}, optional "latency": {row: `tables.latency_over_seeds` stats})."""
    rows, latency = summary["rows"], summary.get("latency") or {}
    single = rows["Single"]["flops_per_example"]["mean"]
    timed = all(row in latency for row in rows)
    cost = {
        row: latency_ratio(latency[row]) if timed else stats["flops_per_example"]["mean"] / single
        for row, stats in rows.items()
    }
    panels = (("AUROC, all OOD (%)", "all.auroc", 100), ("NLL", "id.nll", 1))
    fig, axes = _pyplot().subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    for ax, (label, key, scale) in zip(axes, panels):
        for row, stats in rows.items():
            if key in stats:
                value = scale * stats[key]["mean"]
                ax.scatter(cost[row], value, color="grey" if row == "Single" else "tab:blue", zorder=3)
                ax.annotate(row, (cost[row], value), fontsize=6, xytext=(3, 3), textcoords="offset points")
        if key in rows["Single"]:
            ax.axhline(scale * rows["Single"][key]["mean"], color="grey", ls="--", lw=1)
        ax.set(title=label, xlabel="latency x Single" if timed else "FLOPs x Single", ylabel=label)
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def _save(fig, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def logit_figures(logits: Mapping[str, dict], labels: Tensor, out_dir: Path, title: str, score: str = "msp") -> None:
    """reliability.png and ood_scores.png from each row's saved logits {"test", "near", "far", "ood"}; the OOD
    scores are `score`'s when it is a logit score (`OOD_SCORES`), else MSP's (a feature score needs the model)."""
    reliability_diagram(
        {row: (ensemble_probs(v["test"]), labels) for row, v in logits.items()},
        out_dir / "reliability.png",
        title=f"{title}: reliability (test)",
    )
    name = score if score in OOD_SCORES else "msp"
    scored = lambda member_logits: OOD_SCORES[name](member_logits.double())  # noqa: E731 (as the table scores)
    panels = {}
    for row, v in logits.items():
        panels[row] = {"ID": scored(v["test"])}
        for group in ("near", "far", "ood"):
            if v.get(group):
                panels[row][group if group != "ood" else "OOD"] = torch.cat([scored(x) for x in v[group].values()])
    shown = {"msp": "1 - MSP", "max_logit": "-max logit"}.get(name, name)  # what is plotted: higher = more OOD
    ood_histograms(panels, out_dir / "ood_scores.png", shown, title=f"{title}: OOD scores")


def uncertainty_maps(
    grid_logits: Mapping[str, Tensor],
    extent: float,
    points: tuple[Tensor, Tensor],
    path: str | os.PathLike,
) -> Path:
    """Paper 001's Fig. 2: total, expected data and model uncertainty (nats; `uncertainty.decompose`) over a square
    2-D input grid, one column per model, training points on top. grid_logits: {model: member logits
    (R*R, M, C) on an R x R grid over [-extent, extent]^2, rows y ascending}; points: inputs (N, 2), labels (N,)."""
    parts = ("total", "data", "model")
    fig, axes = _pyplot().subplots(3, len(grid_logits), figsize=(3.3 * len(grid_logits), 9.2), squeeze=False)
    x, y = points
    for col, (name, logits) in enumerate(grid_logits.items()):
        side = int(round(len(logits) ** 0.5))
        values = decompose(logits)
        for row, part in enumerate(parts):
            ax = axes[row][col]
            image = ax.imshow(
                values[part].view(side, side).numpy(),
                origin="lower",
                extent=(-extent, extent, -extent, extent),
                cmap="viridis",
                vmin=0.0,
                vmax=max(float(np.log(logits.shape[-1])) if part != "model" else 0.5, 1e-6),
            )
            ax.scatter(x[:, 0].numpy(), x[:, 1].numpy(), c=y.numpy(), s=2, cmap="Set1", alpha=0.5, linewidths=0)
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(name, fontsize=10)
            if col == 0:
                ax.set_ylabel(f"{part} uncertainty", fontsize=10)
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path
