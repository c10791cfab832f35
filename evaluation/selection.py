"""The rule `orl select` picks a policy by, from off-policy estimates alone; the report validates it against the
true scores of runs that were evaluated in their env (docs/ope.md). Also the names ope.json gives the behaviour
policy and the policy estimated, which `orl ope` writes and the report reads."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

# The behaviour policy's value (the mean logged return of the episodes estimated on): its key in ope.json and its
# MLflow metric, `ope/behaviour`. The rule picks no policy that the data cannot tell from it.
BEHAVIOUR = "behaviour"


def policy_name(sampled: bool, temperature: float | None = None) -> str:
    """How the estimated policy acts, as ope.json's `policy` and the MLflow tag `ope.policy` name it: the report
    sets an estimate beside a true score only where `orl evaluate` ran the same policy."""
    return f"softmax at temperature {temperature:g}" if temperature is not None else "sampled" if sampled else "greedy"


@dataclass(frozen=True)
class Interval:
    """An estimate and its bootstrap interval."""

    value: float
    low: float
    high: float

    @property
    def finite(self) -> bool:
        return all(math.isfinite(x) for x in (self.value, self.low, self.high))


def agreed(intervals: list[Interval]) -> Interval:
    """Several estimators' intervals for one policy as the one interval a rule by all of them reads: from the lowest
    lower bound to the highest upper bound, at the lowest estimate. A policy is then picked only where every
    estimator's interval stands above the behaviour policy's, and told apart from another only where every
    estimator's interval stands clear of all of the other's. NaN where any estimator gave no number."""
    if not all(i.finite for i in intervals):
        return Interval(math.nan, math.nan, math.nan)
    return Interval(min(i.value for i in intervals), min(i.low for i in intervals), max(i.high for i in intervals))


def rule_name(estimators: Iterable[str]) -> str:
    """The rule by these estimators together, as the report and selection.json name it: `fqe+model`."""
    return "+".join(estimators)


def rank_by_lower_bound(estimates: dict[str, Interval]) -> list[str]:
    """The highest lower bound first (a policy is picked for what the data shows it surely does, not for an estimate
    it may owe to noise), then the highest estimate."""
    return sorted(estimates, key=lambda name: (-estimates[name].low, -estimates[name].value))


def stands_above(pick: Interval, other: Interval) -> bool:
    """Whether the data shows the pick doing better than the other: its lower bound above the other's interval."""
    return pick.low > other.high


def select_by_rule(estimates: dict[str, Interval], behaviour: Interval) -> str | None:
    """The candidate with the highest lower bound, where it stands above the behaviour policy; None (keep the
    behaviour policy) otherwise."""
    ranked = rank_by_lower_bound(estimates)
    return ranked[0] if ranked and stands_above(estimates[ranked[0]], behaviour) else None
