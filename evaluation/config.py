"""Typed configuration of evaluation (the `evaluate` section of params.yaml)."""

from __future__ import annotations

from dataclasses import dataclass

from common.checks import require_positive


@dataclass(frozen=True)
class EvaluateConfig:
    """How trained policies (and the random/expert references) are evaluated."""

    episodes: int = 20
    """Evaluation episodes per policy."""
    seed: int = 1_000_000
    """Evaluation seed; keep it apart from collection seeds so evaluation starts are unseen."""
    num_workers: int = 2
    """Ray actors running evaluation episodes in parallel."""
    sample_actions: bool = False
    """BC and MARWIL sample their actions, as a behaviour policy that samples its own did to make the data,
    instead of taking the most likely one (as d3rlpy and most papers evaluate). On data from such a policy the
    two readings differ most (benchmarks/README.md's quality table). The other learners always act greedily."""

    def __post_init__(self):
        require_positive(self, "episodes", "num_workers")
