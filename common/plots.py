"""PNG plots for people: learning curves, return distributions, score tables."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers or CI
import matplotlib.pyplot as plt


def learning_curves(curves: dict[str, list[dict]], metric: str, path: Path) -> Path:
    """One line per run: `metric` against training iteration."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rows in sorted(curves.items()):
        points = [(r["iteration"], r[metric]) for r in rows if metric in r]
        if points:
            ax.plot(*zip(*points), label=label)
    ax.set_xlabel("iteration")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} during training")
    ax.legend(fontsize=7)
    return _save(fig, path)


def return_distributions(returns: dict[str, list[float]], references: dict[str, float], path: Path) -> Path:
    """A box per policy of its evaluation episode returns, with reference lines (random, expert)."""
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(returns) + 2), 4))
    labels = sorted(returns)
    ax.boxplot([returns[k] for k in labels], tick_labels=labels, showmeans=True)
    for (name, value), style in zip(sorted(references.items()), ("--", ":")):
        ax.axhline(value, linestyle=style, color="grey", label=f"{name} ({value:.1f})")
    ax.set_ylabel("episode return")
    ax.set_title("evaluation returns")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    if references:
        ax.legend(fontsize=7)
    return _save(fig, path)


def scores(rows: list[dict], path: Path) -> Path:
    """Grouped bars: normalized score per dataset, one bar per algorithm (and the behaviour policy); none where a
    run has no score (its env has no ceiling reference)."""
    datasets = sorted({r["dataset"] for r in rows})
    algos = sorted({r["algo"] for r in rows})
    fig, ax = plt.subplots(figsize=(max(6, 2 * len(datasets)), 4))
    width = 0.8 / len(algos)
    for i, algo in enumerate(algos):
        scored = {r["dataset"]: r["normalized_score"] for r in rows if r["algo"] == algo}
        values = [math.nan if scored.get(d) is None else scored[d] for d in datasets]
        ax.bar([x + i * width for x in range(len(datasets))], values, width, label=algo)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(datasets))], datasets, fontsize=8)
    ax.axhline(100, linestyle="--", color="grey")
    ax.set_ylabel("normalized score (0 random, 100 expert)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def estimates_against_truth(points: list[dict], path: Path) -> Path:
    """One panel per estimator: each policy's estimate against its true score, coloured by dataset, with y = x."""
    estimators = list(dict.fromkeys(p["estimator"] for p in points))
    datasets = sorted({p["dataset"] for p in points})
    fig, axes = plt.subplots(1, len(estimators), figsize=(4 * len(estimators), 4), squeeze=False)
    styles = distinct_styles(datasets)
    for ax, estimator in zip(axes[0], estimators):
        mine = [p for p in points if p["estimator"] == estimator]
        for name in datasets:
            group = [p for p in mine if p["dataset"] == name]
            ax.scatter([p["truth"] for p in group], [p["estimate"] for p in group], label=name, s=18, **styles[name])
        truths = [p["truth"] for p in mine]
        ax.plot([min(truths), max(truths)], [min(truths), max(truths)], linestyle="--", color="grey")
        scale, options = estimate_scale(truths, [p["estimate"] for p in mine])
        ax.set_yscale(scale, **options)
        ax.set_title(estimator)
        ax.set_xlabel("true normalized score")
        ax.set_ylabel("estimate")
    axes[0][-1].legend(fontsize=7)
    return _save(fig, path)


def estimate_scale(truths: list[float], estimates: list[float]) -> tuple[str, dict]:
    """The estimate axis's scale (matplotlib's `set_yscale` arguments): linear, unless estimates run away from the
    truths by more than the truths' own span (a model's on LunarLander, to -1,346), which would squeeze every other
    point into a corner; then linear over the truths' scale and logarithmic beyond."""
    low, high = min(truths), max(truths)
    span = max(high - low, 1.0)
    if low - span <= min(estimates) and max(estimates) <= high + span:
        return "linear", {}
    return "symlog", {"linthresh": max(abs(low), abs(high), 1.0)}


def distinct_styles(names: list[str]) -> dict[str, dict[str, str]]:
    """A colour and a marker per name, no two alike for up to 50 names: matplotlib's ten default colours, then the
    ten again with the next marker (the colours alone repeat past ten datasets)."""
    markers = "o^sDv"
    return {name: {"color": f"C{i % 10}", "marker": markers[i // 10 % len(markers)]} for i, name in enumerate(names)}


def message(text: str, path: Path) -> Path:
    """A figure that only says why there is nothing to plot (a stage's plot output exists either way)."""
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
