"""How far off-policy estimates can be trusted: each estimator against the true evaluation scores of the same
policies, per dataset and pooled.

- Spearman rank correlation: does the estimator order the policies as the environment does?
- Regret@1: (true score of the best policy - true score of the policy the estimator ranks first) / (the best's
  true score - the worst's), in [0, 1]: 0 when the estimator picks the best policy, 1 when it picks the worst;
  averaged over the policies that share the highest estimate, where several do.
- Mean absolute error, in the estimates' units.

Where every policy of a dataset has the same true score, nothing can be ranked: Spearman and regret@1 are None
("n/a (all equal)" in the table).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from evaluation.config import SELECT_BY
from evaluation.selection import Interval, agreed, rule_name, select_by_rule

KEPT_BEHAVIOUR = "behaviour policy"  # what the rule keeps where it refuses to pick a run


def spearman(estimates: list[float], truths: list[float]) -> float | None:
    """Pearson correlation of the ranks (ties share their mean rank); None where the truths are all equal, 0 where
    the estimates are (they rank nothing)."""
    a, b = pd.Series(estimates).rank().to_numpy(), pd.Series(truths).rank().to_numpy()
    if len(b) < 2 or b.std() == 0:
        return None
    return 0.0 if a.std() == 0 else float(np.corrcoef(a, b)[0, 1])


def regret_at_1(estimates: list[float], truths: list[float]) -> float | None:
    """In [0, 1]; None where the truths are all equal. Where several policies share the highest estimate (values
    held at a bound give such ties), the mean over them: the regret of a pick among them at random."""
    top = np.flatnonzero(np.asarray(estimates) == np.max(estimates))
    return _regret(float(np.mean(np.asarray(truths)[top])), truths)


def _regret(chosen: float, truths: list[float]) -> float | None:
    best, worst = max(truths), min(truths)
    return (best - chosen) / (best - worst) if best > worst else None


def with_rule_points(points: list[dict], together: tuple[str, ...] = SELECT_BY) -> list[dict]:
    """`points` (keys dataset, run, estimator, estimate, ci_low, ci_high, truth) and, where they hold estimates by
    every one of the estimators `together`, one more point per run so estimated, by the rule by them together
    (`fqe+model`): the interval `selection.agreed` makes of theirs, at the lowest estimate, as `orl select --by`
    reads them. It is then validated as an estimator of its own."""
    if len(together) < 2 or not set(together) <= {p["estimator"] for p in points}:
        return points
    runs: dict[tuple[str, str], dict[str, dict]] = {}
    for p in points:
        if p["estimator"] in together:
            runs.setdefault((p["dataset"], p["run"]), {})[p["estimator"]] = p
    rule = []
    for found in runs.values():
        if found.keys() == set(together):
            both = agreed([Interval(p["estimate"], p["ci_low"], p["ci_high"]) for p in found.values()])
            if both.finite:
                rule.append(found[together[0]] | {"estimator": rule_name(together), "estimate": both.value,
                                                  "ci_low": both.low, "ci_high": both.high})
    return points + rule


def validate_selection(points: list[dict], behaviours: dict[str, tuple[Interval, float]],
                       truths: dict[str, dict[str, float]]) -> dict:
    """`orl select`'s rule (`selection.select_by_rule`) on each dataset's evaluated runs, by each estimator of the
    points (`with_rule_points` adds the rule by several together): `points` as `validate` takes them, with each
    estimate's run and interval (keys run, ci_low, ci_high); `behaviours`, per dataset, the behaviour policy's
    interval and true score; `truths`, per dataset, the true score of every run estimated, with a number or
    without. Per rule and dataset: what the rule keeps (a run, or the behaviour policy where it refuses), its true
    score, the best true score among the runs and the behaviour policy, and the rule's regret,
    (best - kept) / (best - worst); then the median regret and the datasets where what it kept is worse than the
    behaviour policy."""
    summary = {}
    for rule in dict.fromkeys(p["estimator"] for p in points):
        mine = [p for p in points if p["estimator"] == rule]
        per_dataset = {}
        for name in sorted({p["dataset"] for p in mine} & behaviours.keys()):
            estimates = {p["run"]: Interval(p["estimate"], p["ci_low"], p["ci_high"])
                         for p in mine if p["dataset"] == name}
            behaviour, behaviour_truth = behaviours[name]
            pick = select_by_rule(estimates, behaviour)
            everything = truths[name] | {KEPT_BEHAVIOUR: behaviour_truth}
            kept = pick or KEPT_BEHAVIOUR
            best = max(everything, key=everything.get)
            per_dataset[name] = {"kept": kept, "kept_truth": everything[kept], "best": best,
                                 "best_truth": everything[best], "regret": _regret(everything[kept],
                                                                                   list(everything.values())),
                                 "worse_than_behaviour": everything[kept] < behaviour_truth}
        summary[rule] = {"median_regret": _median([d["regret"] for d in per_dataset.values()]),
                         "worse_than_behaviour": sum(d["worse_than_behaviour"] for d in per_dataset.values()),
                         "datasets": per_dataset}
    return summary


def selection_markdown(summary: dict) -> str:
    """One row per estimator and dataset, then the median row."""
    header = "| by | dataset | the rule keeps | its true score | the best (true score) | regret (0 best, 1 worst) |"
    return _table(header, summary,
                  lambda d: f"{d['kept']} | {d['kept_truth']:.1f} | {d['best']} ({d['best_truth']:.1f}) | "
                            f"{_cell(d['regret'])}",
                  lambda s: f"**median regret**; worse than the behaviour policy on {s['worse_than_behaviour']} of "
                            f"{len(s['datasets'])} | | | | **{_cell(s['median_regret'])}**")


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
            "median_regret_at_1": _median([d["regret_at_1"] for d in per_dataset.values()]),
            "mae": float(np.mean([abs(p["estimate"] - p["truth"]) for p in mine])),
            "datasets": per_dataset,
        }
    return summary


def markdown(summary: dict) -> str:
    """One row per estimator and dataset, then the pooled row."""
    return _table("| estimator | dataset | policies | Spearman | regret@1 (0 best, 1 worst) | MAE |", summary,
                  lambda d: f"{d['policies']} | {_cell(d['spearman'])} | {_cell(d['regret_at_1'])} | {d['mae']:.1f}",
                  lambda s: f"**pooled** (regret: median) | {s['policies']} | **{_cell(s['pooled_spearman'])}** | "
                            f"**{_cell(s['median_regret_at_1'])}** | **{s['mae']:.1f}**")


def _table(header: str, summary: dict, row, total) -> str:
    """A markdown table of a per-estimator summary: `row(dataset's entry)` after the estimator and dataset names,
    then, per estimator, `total(its summary)` after its name in bold."""
    lines = [header, "|---" * header.count(" | ") + "|---|"]
    for estimator, s in summary.items():
        lines += [f"| {estimator} | {name} | {row(d)} |" for name, d in s["datasets"].items()]
        lines.append(f"| **{estimator}** | {total(s)} |")
    return "\n".join(lines) + "\n"


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.median(known)) if known else None


def _cell(value: float | None) -> str:
    return "n/a (all equal)" if value is None else f"{value:.2f}"
