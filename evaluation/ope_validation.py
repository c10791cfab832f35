"""How far off-policy estimates can be trusted: each estimator against the true evaluation scores of the same
policies, per dataset and pooled.

- Spearman rank correlation: does the estimator order the policies as the environment does?
- Regret@1: (true score of the best policy - true score of the policy the estimator ranks first) / the best's
  score; 0 when the estimator picks the best policy.
- Mean absolute error, in the estimates' units.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def spearman(estimates: list[float], truths: list[float]) -> float:
    """Pearson correlation of the ranks (ties share their mean rank); NaN under two distinct values."""
    a, b = pd.Series(estimates).rank().to_numpy(), pd.Series(truths).rank().to_numpy()
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])


def regret_at_1(estimates: list[float], truths: list[float]) -> float:
    best, chosen = max(truths), truths[int(np.argmax(estimates))]
    return (best - chosen) / abs(best) if best else math.nan


def validate(points: list[dict]) -> dict:
    """`points`: one per (policy, estimator) with keys dataset, estimator, estimate and truth. Per estimator: each
    dataset's Spearman, regret@1, MAE and policy count; the pooled Spearman over every policy, the median regret@1
    over datasets and the overall MAE."""
    summary = {}
    for estimator in dict.fromkeys(p["estimator"] for p in points):
        mine = [p for p in points if p["estimator"] == estimator]
        per_dataset = {}
        for name in sorted({p["dataset"] for p in mine}):
            group = [p for p in mine if p["dataset"] == name]
            estimates, truths = [p["estimate"] for p in group], [p["truth"] for p in group]
            per_dataset[name] = {"policies": len(group), "spearman": spearman(estimates, truths),
                                 "regret_at_1": regret_at_1(estimates, truths),
                                 "mae": float(np.mean(np.abs(np.subtract(estimates, truths))))}
        summary[estimator] = {
            "policies": len(mine),
            "pooled_spearman": spearman([p["estimate"] for p in mine], [p["truth"] for p in mine]),
            "median_regret_at_1": float(np.nanmedian([d["regret_at_1"] for d in per_dataset.values()])),
            "mae": float(np.mean([abs(p["estimate"] - p["truth"]) for p in mine])),
            "datasets": per_dataset,
        }
    return summary


def markdown(summary: dict) -> str:
    """One row per estimator and dataset, then the pooled row."""
    lines = ["| estimator | dataset | policies | Spearman | regret@1 | MAE |", "|---|---|---|---|---|---|"]
    for estimator, s in summary.items():
        for name, d in s["datasets"].items():
            lines.append(f"| {estimator} | {name} | {d['policies']} | {d['spearman']:.2f} | {d['regret_at_1']:.2f} | "
                         f"{d['mae']:.1f} |")
        lines.append(f"| **{estimator}** | **pooled** (regret: median) | {s['policies']} | "
                     f"**{s['pooled_spearman']:.2f}** | **{s['median_regret_at_1']:.2f}** | **{s['mae']:.1f}** |")
    return "\n".join(lines) + "\n"
