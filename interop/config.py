"""Typed configuration of imports (the `imports` section of params.yaml)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from common.envs import EnvSpec

FORMATS = ("minari", "csv", "parquet")
SPACE_TYPES = ("Discrete", "Box")


@dataclass(frozen=True)
class SpaceConfig:
    """A space declared in params.yaml, for data that no supported environment describes."""

    type: str
    """Discrete or Box."""
    n: int = 0
    """Discrete: the number of actions, 0 to n-1."""
    low: list[float] = field(default_factory=list)
    """Box: each dimension's lower bound (`-.inf` for none); the space is a flat vector of this length."""
    high: list[float] = field(default_factory=list)
    """Box: each dimension's upper bound (`.inf` for none)."""

    def __post_init__(self):
        if self.type not in SPACE_TYPES:
            raise ValueError(f"type '{self.type}' is unknown; use Discrete or Box")
        if self.type == "Discrete" and self.n <= 0:
            raise ValueError(f"a Discrete space needs n > 0, got {self.n}")
        if self.type == "Box":
            if not self.low or len(self.low) != len(self.high):
                raise ValueError(f"a Box space needs `low` and `high` of one equal, non-zero length, got "
                                 f"{len(self.low)} and {len(self.high)} values")
            if any(lo > hi or math.isnan(lo) or math.isnan(hi) for lo, hi in zip(self.low, self.high)):
                raise ValueError(f"a Box space needs low <= high in every dimension, got low {self.low}, "
                                 f"high {self.high}")

    def space(self) -> gym.Space:
        if self.type == "Discrete":
            return gym.spaces.Discrete(self.n)
        return gym.spaces.Box(np.array(self.low, dtype=np.float32), np.array(self.high, dtype=np.float32),
                              dtype=np.float32)


@dataclass(frozen=True)
class ColumnMapping:
    """Which columns of a log hold what. A column may hold one number per row or, in Parquet, a list of them."""

    episode: str
    """The episode id (any type). An episode's rows must be consecutive, in step order."""
    step: str
    """The step number within an episode, counting up by 1 (from any start)."""
    obs: list[str]
    """The observation's columns, in order; their values side by side make `obs`."""
    actions: list[str]
    """The action's column (Discrete: one column of integers) or columns (Box), in order."""
    rewards: str
    """The reward of the step."""
    terminated: str = ""
    """True (or 1) on an episode's last step when it ended in a terminal state."""
    truncated: str = ""
    """True (or 1) on an episode's last step when it was cut short. Empty: an episode whose last row is not
    `terminated` counts as truncated (the log stops there)."""
    new_obs: list[str] = field(default_factory=list)
    """The observation after the step, if the log has it. Empty: the next row's `obs` in the same episode, and
    at an episode's last step its own `obs` (learners do not bootstrap from a terminal step; after a truncated
    one this is an approximation)."""
    action_logp: str = ""
    """The log-probability of the action under the policy that logged it, where known (for off-policy
    evaluation)."""

    def __post_init__(self):
        if not self.obs or not self.actions:
            raise ValueError("`obs` and `actions` each need at least one column")


@dataclass(frozen=True)
class ImportConfig:
    """Data made elsewhere, imported as one of our datasets (dvc.yaml's import stage, `orl datasets import`)."""

    format: str
    """minari | csv | parquet."""
    source: str
    """minari: a Minari dataset's directory (the one holding `data/`), or an id in the local Minari store
    (MINARI_DATASETS_PATH); csv, parquet: a file, or a directory whose files (*.csv or *.parquet) are read in
    name order. dvc.yaml tracks it as the stage's dependency, so give a path there."""
    env: EnvSpec | None = None
    """The environment the data comes from, which evaluates policies trained on it (its spaces must be the
    data's): a Gymnasium id or a spec (common/envs.py's `EnvSpec`). None: the data has no simulator; the spaces
    come from the Minari dataset or the two below, and the stages that run the environment (evaluate, reference)
    skip it."""
    observation_space: SpaceConfig | None = None
    """csv, parquet without `env`: the observation space."""
    action_space: SpaceConfig | None = None
    """csv, parquet without `env`: the action space."""
    columns: ColumnMapping | None = None
    """csv, parquet: which columns hold what."""
    behavior_policy: str = ""
    """A description of the policy that logged the data, kept in the card (Minari's `algorithm_name` when
    empty)."""

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"format '{self.format}' is unknown; use one of {', '.join(FORMATS)}")
        if not self.source:
            raise ValueError("source is empty; name the file, directory or Minari dataset to import")
        if self.env is not None:
            object.__setattr__(self, "env", EnvSpec.of(self.env))
        declared = (self.observation_space, self.action_space)
        if self.format == "minari":
            if self.columns is not None or declared != (None, None):
                raise ValueError("a Minari dataset brings its own spaces and columns; remove `columns`, "
                                 "`observation_space` and `action_space`")
            return
        if self.columns is None:
            raise ValueError(f"format {self.format} needs `columns`, the mapping of the log's columns")
        if self.env and declared != (None, None):
            raise ValueError(f"the spaces come from env {self.env.label}; remove `observation_space` and "
                             "`action_space`")
        if not self.env and None in declared:
            raise ValueError("without env, declare both `observation_space` and `action_space`")
        if self.observation_space is not None and self.observation_space.type != "Box":
            raise ValueError("observation_space must be a Box: observations are vectors")
