"""Typed configuration of evaluation (the `evaluate` section of params.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field

from collectors.config import PolicyConfig
from common.checks import require_conv_filters, require_layer_sizes, require_positive


@dataclass(frozen=True)
class EvaluateConfig:
    """How trained policies (and the random/expert references) are evaluated."""

    episodes: int = 20
    """Evaluation episodes per policy."""
    seed: int = 1_000_000
    """Evaluation seed; keep it apart from collection seeds so evaluation starts are unseen."""
    num_workers: int = 2
    """Ray actors running evaluation episodes in parallel (on a cluster, across its nodes); 0 runs them in the
    `orl` process itself, without starting Ray: quicker where the episodes are few and short."""
    sample_actions: bool = False
    """BC, MARWIL and IQL sample their actions, as a behaviour policy that samples its own did to make the data,
    instead of taking the most likely one (as d3rlpy and most papers evaluate). On data from such a policy the
    two readings differ most (benchmarks/quality.md). The Q-learners (DQN, CQL) always act
    greedily."""

    def __post_init__(self):
        require_positive(self, "episodes")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")


@dataclass(frozen=True)
class ReferenceConfig:
    """An environment's references for the normalized score, D4RL's: 100 * (R - floor) / (ceiling - floor). Each
    is a policy's mean return on the evaluation seeds (`orl reference` runs it), or a fixed return."""

    floor: PolicyConfig = field(default_factory=PolicyConfig)
    """The policy that scores 0: uniform random unless given."""
    ceiling: PolicyConfig | None = None
    """The policy that scores 100, e.g. an expert controller (`kind: callable`). Without it (or `ref_max`) there
    is no normalized score: evaluation, the report and MLflow show raw returns and say why."""
    ref_min: float | None = None
    """A fixed return that scores 0, instead of running `floor` (D4RL's REF_MIN_SCORE)."""
    ref_max: float | None = None
    """A fixed return that scores 100, instead of running `ceiling` (D4RL's REF_MAX_SCORE)."""

    def __post_init__(self):
        if self.ceiling is not None and self.ref_max is not None:
            raise ValueError("give the ceiling as a policy (`ceiling`) or a return (`ref_max`), not both")
        if None not in (self.ref_min, self.ref_max) and self.ref_max <= self.ref_min:
            raise ValueError(f"ref_max {self.ref_max} must exceed ref_min {self.ref_min}")


# Off-policy estimators, by the name `orl ope --estimators`, `orl select --by` and MLflow's `ope/NAME` use.
FQE, WPDIS, DR, MODEL = "fqe", "wpdis", "dr", "model"
ESTIMATORS = (FQE, WPDIS, DR, MODEL)
# What `orl select` picks by unless told: a run at the interval FQE and the model-based estimator agree on, since
# they err in different places (docs/ope.md, "How `orl select` picks").
SELECT_BY = (FQE, MODEL)


@dataclass(frozen=True)
class OPEConfig:
    """Off-policy evaluation of trained policies from logged episodes alone (`orl ope`)."""

    gamma: float = 1.0
    """Discount of the estimated return. 1 estimates the undiscounted return that `orl evaluate` measures, so that
    estimates and evaluation scores share the normalized units."""
    held_out_fraction: float = 0.0
    """Share of the dataset's episodes, drawn by eps_id with `seed`, that the estimates are computed on while FQE is
    fitted on the others; 0 fits and estimates on every episode."""
    seed: int = 0
    """Seeds the episode split, the networks, their minibatches, and the bootstrap."""
    hidden_layers: list[int] = field(default_factory=lambda: [256, 256])
    """FQE's Q-network: sizes of the hidden layers (ReLU)."""
    conv_filters: list[list[int]] = field(default_factory=lambda: [[32, 8, 4], [64, 4, 2], [64, 3, 1]])
    """For image observations: the CNN before FQE's hidden layers, each layer [channels, kernel, stride] (ReLU,
    no padding), as the learners' `conv_filters`; the default is the Nature DQN's, for 84x84 frames."""
    lr: float = 0.001
    """FQE's Adam learning rate."""
    batch_size: int = 256
    """FQE's minibatch of transitions."""
    iterations: int | None = None
    """FQE's iterations: each fits the Q-network for `updates_per_iteration` steps towards targets from a frozen copy
    of itself, carrying values one step further back. Null: the longest episode's length, so the last step's
    rewards reach the first."""
    updates_per_iteration: int = 20
    """FQE's gradient steps per iteration."""
    fqe_heads: int = 5
    """Heads of FQE's Q-network over shared hidden layers, each fitted to its own resample of the episodes (Poisson(1)
    weights per episode, as bootstrapped DQN's heads): FQE's estimate is their mean, and its interval resamples the
    heads with the episodes, so that it includes the fit's own variance. 1: one fit, an interval of the episodes
    alone. Doubly robust corrects the heads' mean."""
    model_hidden_layers: list[int] = field(default_factory=lambda: [200, 200])
    """The model-based estimator's dynamics networks (`model`): sizes of the hidden layers (ReLU)."""
    model_ensemble: int = 5
    """Dynamics networks in the model-based estimator's ensemble, each fitted on its own resample of the
    transitions; its interval resamples them with the episodes, so it includes the fit's own variance."""
    model_updates: int = 2000
    """Gradient steps of each dynamics network (Adam at `lr`, minibatches of `batch_size`), at least; see
    `model_epochs`."""
    model_epochs: float = 5.0
    """Passes over the logged transitions each dynamics network makes, at least: on large datasets `model_updates`
    alone would see each transition once or less, and the model's dynamics drift (benchmarks/ope.md, "The model's
    hopper fell early")."""
    model_unroll_steps: int = 1
    """Steps ahead each dynamics network learns to predict from its own predictions: 1, one step at a time alone; K > 1,
    after that fit, `model_unroll_updates` more on K-step stretches of logged episodes, each step from the state the
    network predicted and the loss on every step's state against the logged one (a multi-step loss), so that the
    errors that compound over a rollout are fitted against (benchmarks/ope.md, "The walker the model let fall")."""
    model_unroll_updates: int = 2000
    """Gradient steps of each dynamics network on K-step stretches, where `model_unroll_steps` is K > 1."""
    model_halt_quantile: float = 1.0
    """A model rollout halts, counting for the rest the lowest return-to-go logged at that step, where its networks'
    predictions part more than on this share of the logged transitions (1: more than on any of them): the policy has
    led it where the data says nothing (evaluation/model_based.py)."""
    model_halt_margin: float | None = None
    """A model rollout also halts, as where its networks part, where a state it reaches lies outside the logged
    states' range by more than this share of the range, in any dimension: null, it is held within that range and goes
    on (a lander the model flew off the logged map then hovers at its edge, earning its penalties for the rest of the
    horizon; benchmarks/ope.md, "Rollouts that leave the map")."""
    bootstrap_samples: int = 200
    """Resamples of the episodes (with replacement) behind each confidence interval."""
    confidence: float = 0.95
    """Coverage of the bootstrap percentile intervals."""
    min_effective_episodes: float = 10.0
    """Weighted importance sampling (wpdis) whose final weights leave fewer effective episodes than this (Kish's
    effective sample size) gives no number but "unreliable": the weights collapsed, and its value is whatever the few
    surviving episodes say."""

    def __post_init__(self):
        require_positive(self, "gamma", "lr", "batch_size", "updates_per_iteration", "bootstrap_samples",
                         "min_effective_episodes", "model_ensemble", "model_updates", "model_epochs",
                         "model_unroll_steps", "model_unroll_updates",
                         "fqe_heads")
        if self.gamma > 1:
            raise ValueError(f"gamma must be <= 1, got {self.gamma}")
        if not 0 <= self.held_out_fraction < 1:
            raise ValueError(f"held_out_fraction must be in [0, 1), got {self.held_out_fraction}")
        if self.model_halt_margin is not None and self.model_halt_margin < 0:
            raise ValueError(f"model_halt_margin must be >= 0 or null, got {self.model_halt_margin}")
        if not 0 < self.model_halt_quantile <= 1:
            raise ValueError(f"model_halt_quantile must be in (0, 1], got {self.model_halt_quantile}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.iterations is not None:
            require_positive(self, "iterations")
        require_layer_sizes(self.hidden_layers)
        if not self.model_hidden_layers or min(self.model_hidden_layers) <= 0:
            raise ValueError(f"model_hidden_layers must be positive sizes, got {self.model_hidden_layers}")
        require_conv_filters(self.conv_filters)
