"""Typed configuration of collection (the `collect` and `datasets` sections of params.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.checks import require_one_of, require_positive
from common.envs import EnvSpec

POLICY_KINDS = ("random", "callable", "mixture", "model")


@dataclass(frozen=True)
class PolicyConfig:
    """A behaviour policy."""

    kind: str = "random"
    """random (uniform over the action space) | callable (your controller, `callable`) | mixture (`base`, but a
    uniformly random action with probability `epsilon`) | model (a policy trained by `orl train`)."""
    callable: str = ""
    """For `callable`: `package.module:function`, taking a batch of observations (one row per environment) and
    returning a batch of actions, or (actions, log-probabilities) to fill the `action_logp` column
    (collectors/policies.py's `CallablePolicy`; examples/controllers.py has four)."""
    base: PolicyConfig | None = None
    """For `mixture`: the policy it mixes with random actions (any kind but `mixture`)."""
    epsilon: float = 0.0
    """For `mixture`: probability of a random action at each step, in [0, 1]."""
    model: str = ""
    """For `model`: a `orl train` checkpoint directory, or an MLflow model URI (models:/NAME@ALIAS, runs:/...)."""
    greedy: bool = False
    """For `model`: take the most likely action instead of sampling from the policy."""
    temperature: float | None = None
    """For `model` over Discrete actions, not greedy: sample from softmax(logits / temperature) instead of the
    policy's own distribution; the Q-values of DQN and CQL serve as logits (Boltzmann exploration around a greedy
    policy). Lower is closer to greedy."""
    action_noise: float = 0.0
    """For `callable` on continuous actions: standard deviation of Gaussian noise added to the controller's
    action, as a fraction of half the action range, then clipped to the bounds. The data then shows the
    controller correcting deviations from its own path, which a clone needs (DART; D4RL's expert data comes from
    a policy that samples its actions). 0 keeps the controller as it is."""
    random_episodes: float = 0.0
    """Fraction of episodes, drawn per episode, that the uniform random policy runs from start to end instead:
    D4RL-style mixed data (e.g. a medium policy's episodes plus random ones). In [0, 1]."""

    def __post_init__(self):
        require_one_of(self, "kind", POLICY_KINDS)
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"epsilon {self.epsilon} is out of range; use a value in [0, 1]")
        if self.action_noise < 0.0:
            raise ValueError(f"action_noise {self.action_noise} is negative; use 0 (none) or a positive std")
        if self.action_noise and self.kind != "callable":
            raise ValueError(f"action_noise applies to kind 'callable' (a mixture's `base`), not '{self.kind}'")
        if not 0.0 <= self.random_episodes <= 1.0:
            raise ValueError(f"random_episodes {self.random_episodes} is out of range; use a value in [0, 1]")
        if self.temperature is not None and (self.kind != "model" or self.greedy or self.temperature <= 0):
            raise ValueError(f"temperature {self.temperature} applies to kind 'model' sampling its actions (greedy: "
                             "false), and must be positive")
        if self.kind == "model" and not self.model:
            raise ValueError("kind 'model' needs `model`: a checkpoint directory or an MLflow model URI")
        if self.kind == "callable" and ":" not in self.callable:
            raise ValueError(f"kind 'callable' needs `callable: package.module:function`, got '{self.callable}'")
        if self.kind == "mixture" and (self.base is None or self.base.kind == "mixture"):
            raise ValueError("kind 'mixture' needs `base`, the policy it mixes with random actions (not a mixture)")


@dataclass(frozen=True)
class DatasetConfig:
    """One dataset to collect."""

    env: EnvSpec
    """The environment: a Gymnasium id (CartPole-v1), or a mapping with an entry point, kwargs, modules to import,
    wrappers and a time limit (common/envs.py's `EnvSpec`)."""
    episodes: int
    """Number of whole episodes to collect."""
    seed: int
    """Episode i is reset with a seed derived from (seed, i), and the policy's randomness likewise."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The behaviour policy."""

    def __post_init__(self):
        object.__setattr__(self, "env", EnvSpec.of(self.env))
        require_positive(self, "episodes")


@dataclass(frozen=True)
class CollectConfig:
    """How collection is spread over Ray actors and files. The rows are the same whatever these are, and so
    are the bytes of a dataset that fits in one file; files are cut between tasks, so `episodes_per_task` and
    `file_mib` set where a larger dataset's files split."""

    num_collectors: int = 2
    """Ray actors stepping environments in parallel (1 CPU each)."""
    envs_per_collector: int = 4
    """Environments per actor, stepped in lockstep so the policy acts on a batch of observations."""
    episodes_per_task: int = 100
    """Episodes in one unit of work handed to an actor. Memory holds a few tasks per collector, and each task
    costs Ray Data some scheduling: raise it for large collections of short episodes (benchmarks/throughput.md,
    "Collection")."""
    file_mib: float = 128.0
    """Size of a Parquet file, in MiB of rows in memory: tasks' rows are combined, in order, until they reach
    it, then the file is written while collection goes on. zstd stores them in less on disk."""

    def __post_init__(self):
        require_positive(self, "num_collectors", "envs_per_collector", "episodes_per_task", "file_mib")
