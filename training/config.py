"""Typed configuration of training and evaluation (the `train`, `algos`, `online_policies` and `evaluate` sections
of params.yaml).

These are the public knobs; `training/algorithms/registry.py` maps them onto RLlib's configs.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from common.checks import require_conv_filters, require_layer_sizes, require_one_of, require_positive
from common.envs import EnvSpec

ACTIVATIONS = ("relu", "tanh", "silu")
GAUSSIAN, SQUASHED_GAUSSIAN, BOUNDED_MEAN_GAUSSIAN = "gaussian", "squashed_gaussian", "bounded_mean_gaussian"
DETERMINISTIC = "deterministic"
ACTION_DISTRIBUTIONS = (GAUSSIAN, SQUASHED_GAUSSIAN, DETERMINISTIC)
IQL_ACTION_DISTRIBUTIONS = (SQUASHED_GAUSSIAN, BOUNDED_MEAN_GAUSSIAN)
SAMPLED, MEAN = "sampled", "mean"
CQL_TARGET_ACTIONS = (SAMPLED, MEAN)
CURRENT, NEXT = "current", "next"
CQL_PENALTY_STATES = (CURRENT, NEXT)


def _require_discount(gamma: float) -> None:
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")


@dataclass(frozen=True)
class LearnerParams:
    """What every offline learner takes."""

    lr: float = 1e-3
    """Adam learning rate."""
    batch_size: int = 512
    """Transitions per gradient update."""
    iterations: int = 30
    """Training iterations; metrics are logged once per iteration."""
    updates_per_iteration: int = 20
    """Gradient updates per iteration."""
    hidden_layers: list[int] = field(default_factory=lambda: [256, 256])
    """Sizes of the policy network's hidden layers: over vectors the whole network; over images those after the
    CNN, in each head (the Nature DQN's is [512])."""
    activation: str = "relu"
    """Hidden-layer activation: relu, tanh or silu."""
    conv_filters: list[list[int]] = field(default_factory=lambda: [[32, 8, 4], [64, 4, 2], [64, 3, 1]])
    """For image observations: the CNN encoder's layers, each [channels, kernel, stride] (RLlib's `conv_filters`,
    with `activation`); the default is the Nature DQN's, for 84x84 frames. `hidden_layers` follow it."""
    shuffle_buffer: int = 1_000_000
    """For datasets that stream (see `memory_cache_mib`): transitions held in the buffer that batches are
    drawn from at random, each row group read joining it. Larger mixes rows from more of the files into each
    batch; the first update waits until the buffer is full (or the data ends). Fewer where the buffer (twice, as
    it is joined) would hold more than `memory_cache_mib`, counting an observation and a next observation per
    row as stored: 17 float32 numbers each (HalfCheetah) fit 987,000 rows in 256 MiB, 4-frame 84x84 stacks
    2,377."""
    memory_cache_mib: int = 256
    """Datasets up to this size on disk (256 MiB by default; images count one observation per transition, in
    memory, not on disk) are read and mapped to train batches once and held as tensors on the learner's device
    (a GPU's own memory, where it trains on one), each pass a fresh shuffle of all rows. Larger ones stream from
    Parquet at each pass through `shuffle_buffer`, each learner reading its files itself: memory stays flat, but
    each pass reads the files again. 0 always streams."""
    stream_read_ahead_mib: int = 64
    """For datasets that stream: memory for the row groups a learner reads and maps ahead of its updates, beside
    its shuffle buffer (at least one run of row groups). With the buffer, it bounds a learner's memory whatever the
    dataset's size; 256 let the learner grow by a quarter from 1M to 10M transitions, for no gain in speed
    (benchmarks/throughput.md, "Scale out")."""
    num_learners: int = 0
    """0 trains in the `orl train` process itself: the fastest on one machine. n >= 1 starts n learner actors
    (1 CPU each) that each take `batch_size` rows per update and average their gradients (torch DDP): for a
    cluster, where each learner has its own node or GPU. Each reads its own share of the dataset's files, held in
    memory or streamed."""
    num_gpus_per_learner: float = 0
    """GPUs for each learner (RLlib's `num_gpus_per_learner`): with `num_learners` 0, any value above 0 trains on
    this machine's first GPU; with n learners, each actor takes this share of a GPU on its node. 0 (the default)
    trains on the CPU. A dataset held in memory moves to the GPU once, and each batch is gathered there; a streamed
    one's batches are made on the CPU and moved to the GPU per update."""
    per_dataset: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Other values of these keys for some datasets, by dataset name, e.g. `{lunarlander-medium: {beta: 0.1}}`:
    good values differ between environments (IQL's beta, benchmarks/quality.md). DVC tracks the whole section, so
    a change here re-runs this algorithm on every dataset."""

    def __post_init__(self):
        require_positive(self, "lr", "batch_size", "iterations", "updates_per_iteration", "shuffle_buffer",
                         "stream_read_ahead_mib")
        for name in ("memory_cache_mib", "num_learners", "num_gpus_per_learner"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        require_layer_sizes(self.hidden_layers)
        require_conv_filters(self.conv_filters)
        require_one_of(self, "activation", ACTIVATIONS)
        for name in self.per_dataset:
            try:
                self.for_dataset(name)
            except ValueError as err:
                raise ValueError(f"per_dataset.{name}: {err}") from None

    def hyper_parameters(self) -> dict[str, Any]:
        """The values a learner trains with, keyed by name; call on `for_dataset`'s result, whose overrides are in
        place."""
        return {key: value for key, value in dataclasses.asdict(self).items() if key != "per_dataset"}

    def for_dataset(self, name: str) -> LearnerParams:
        """The hyper-parameters to train on dataset `name`: these, with its `per_dataset` values in place."""
        values = self.per_dataset.get(name, {})
        hints = typing.get_type_hints(type(self))
        keys = [f.name for f in dataclasses.fields(self) if f.name != "per_dataset"]
        for key, value in values.items():
            if key not in keys:
                raise ValueError(f"unknown key '{key}'; known keys: {', '.join(keys)}")
            if not _is_a(hints[key], value):
                raise ValueError(f"{key} must be {_type_name(hints[key])}, got {value!r}")
        return dataclasses.replace(self, per_dataset={}, **{key: _declared(hints[key], value)
                                                             for key, value in values.items()})


def _is_a(tp, value) -> bool:
    """`value` is of type `tp` (an int passes for a float, a bool for nothing else), list elements included."""
    if typing.get_origin(tp) is types.UnionType:  # `X | None`
        return any(_is_a(arg, value) for arg in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return isinstance(value, list) and all(_is_a(typing.get_args(tp)[0], item) for item in value)
    return type(value) is tp or (tp is float and type(value) is int)


def _declared(tp, value):
    """An int given for a float field, as a float."""
    return float(value) if type(value) is int and float in (tp, *typing.get_args(tp)) else value


def _type_name(tp) -> str:
    """'a float', 'an int', 'a list of int', 'a float or None'."""
    if typing.get_origin(tp) is types.UnionType:
        return " or ".join(_type_name(arg) if arg is not type(None) else "None" for arg in typing.get_args(tp))
    name = f"list of {typing.get_args(tp)[0].__name__}" if typing.get_origin(tp) is list else tp.__name__
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


@dataclass(frozen=True)
class BCParams(LearnerParams):
    """Behaviour cloning: maximise the log-likelihood of the dataset's actions."""

    action_distribution: str = SQUASHED_GAUSSIAN
    """For continuous (Box) actions, the policy's distribution: `squashed_gaussian`, SAC's tanh-squashed Gaussian
    (IQL's and CQL's actor), fitted to the actions rescaled to [-1, 1] and kept 1 % inside it; `gaussian`, RLlib's
    diagonal Gaussian, acting on its mean clipped to the bounds, which scored below it wherever the data's actions
    crowd the bounds (benchmarks/quality.md, "BC's action distribution"); or `deterministic`, d3rlpy's and CORL's BC:
    the action tanh(mu), fitted by squared error to the actions rescaled to [-1, 1], whatever their spread at a
    state. Discrete actions are always categorical."""

    def __post_init__(self):
        super().__post_init__()
        require_one_of(self, "action_distribution", ACTION_DISTRIBUTIONS)


@dataclass(frozen=True)
class MARWILParams(LearnerParams):
    """MARWIL: behaviour cloning weighted by exp(beta * advantage), with a learned value function."""

    beta: float = 1.0
    """Advantage temperature in [0, 1]; 0 is plain behaviour cloning."""
    vf_coeff: float = 1.0
    """Weight of the value-function loss."""
    gamma: float = 0.99
    """Discount of the returns that advantages are measured from."""
    advantage_norm_rate: float = 0.01
    """Update rate of the running mean of squared advantages that advantages are divided by (MARWIL's c^2).
    RLlib's default, 1e-8, leaves it at its start value (100) for good, so weights grow as exp(beta * A / 10)
    whatever the rewards' scale."""
    returns_read_rows: int = 65_536
    """Rows read at once to compute discounted returns-to-go. An episode cut at the end of such a read is bootstrapped
    there with the current value function, as at the env's time limit; above episode lengths, few are. Streamed, a
    read holds this many rows: lower it for large observations (65,536 4-frame 84x84 stacks are 3.7 GB)."""

    def __post_init__(self):
        super().__post_init__()
        require_positive(self, "returns_read_rows")
        if not 0.0 < self.advantage_norm_rate <= 1.0:
            raise ValueError(f"advantage_norm_rate must be in (0, 1], got {self.advantage_norm_rate}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {self.beta}")
        _require_discount(self.gamma)


@dataclass(frozen=True)
class DQNParams(LearnerParams):
    """Offline DQN (double Q, dueling heads, target network) with an optional conservative penalty."""

    gamma: float = 0.99
    """Discount."""
    target_update_every: int = 100
    """Gradient updates between target-network syncs."""
    double_q: bool = True
    """Pick the next action with the online network and value it with the target network."""
    dueling: bool = True
    """Separate value and advantage heads."""
    n_step: int = 1
    """Rewards summed in the TD target before it bootstraps: r_t + ... + gamma^(n-1) r_(t+n-1) + gamma^n Q(s_(t+n)),
    over fewer steps where the episode ends sooner. More steps carry reward back faster, with the bias of
    the behaviour policy's actions in them."""
    cql_alpha: float = 0.0
    """Weight of CQL's logsumexp penalty, which pushes down Q-values of actions the data does not take; 0 is
    plain DQN."""

    def __post_init__(self):
        super().__post_init__()
        require_positive(self, "target_update_every", "n_step")
        _require_discount(self.gamma)
        if self.cql_alpha < 0:
            raise ValueError(f"cql_alpha must be >= 0, got {self.cql_alpha}")


@dataclass(frozen=True)
class ConservativeDQNParams(DQNParams):
    """Offline DQN with CQL's penalty on the actions the data does not take (discrete CQL)."""

    cql_alpha: float = 1.0


@dataclass(frozen=True)
class CQLParams(LearnerParams):
    """CQL for continuous actions (RLlib's, built on SAC); `lr` is the critics' learning rate."""

    actor_lr: float = 1e-4
    """Learning rate of the policy (actor)."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 0.005
    """Polyak rate at which target critics follow the critics, per gradient update."""
    min_q_weight: float = 5.0
    """Weight of the conservative penalty on Q-values of actions sampled away from the data."""
    num_actions: int = 10
    """Actions sampled per state to estimate the penalty's logsumexp."""
    lagrangian_threshold: float | None = None
    """None keeps the penalty's weight at `min_q_weight`. A number scales it by a multiplier learned by dual gradient
    descent (the CQL paper's Lagrangian form; d3rlpy's CQL does so by default, with 10): the multiplier grows while
    the penalty's gap, the logsumexp of Q over sampled actions less Q on the data's actions, is above this
    threshold, and shrinks while it is below. Where the gap never reaches the threshold the multiplier only shrinks,
    annealing the penalty away: on three MuJoCo datasets of four at 10, ours and d3rlpy's alike (benchmarks/mujoco.md,
    "The walk taken apart")."""
    lagrangian_lr: float = 1e-4
    """Learning rate of the multiplier's log (d3rlpy's `alpha_learning_rate`)."""
    temperature_lr: float = 1e-4
    """Learning rate of the log of SAC's entropy temperature, which the policy's loss weighs its entropy by (RLlib's
    `alpha_lr`, 3e-4 there): by default `actor_lr`'s default, as the CQL paper's code, CORL and d3rlpy learn it."""
    target_action: str = MEAN
    """The next state's action at which the target critics are evaluated, with no entropy term either way: the
    policy's `mean` (d3rlpy's default, its `soft_q_backup=False`), or `sampled` from the policy (RLlib's, the CQL
    paper's code and CORL's). The mean with the temperature's rate above is d3rlpy's pair: where CQL on MuJoCo fell
    without it, it is level with d3rlpy's CQL (benchmarks/mujoco.md, "Level with d3rlpy's CQL")."""
    next_actions_penalized_at: str = CURRENT
    """Where the penalty values the actions the policy samples at the next states: at the `current` states, beside
    the uniform and the current policy's actions there (the CQL paper's code, CORL's and d3rlpy's), or at the `next`
    states (RLlib 2.60's), which pushes down the values the backup reads. With the weight fixed, `next` walked on
    hopper-medium at one seed of three where `current` fell, and fell on hopper-medium-replay (benchmarks/mujoco.md,
    "The walk at the next states does not hold")."""
    critic_layer_norm: bool = False
    """Layer-normalize each hidden layer of the critics (not the policy's), which bounds how far Q can climb on its
    own bootstrapped values (Ball et al. 2023; Yue et al. 2023): on pendulum-medium's narrow data the critics diverge
    without it (benchmarks/quality.md, "Our CQL")."""

    def __post_init__(self):
        super().__post_init__()
        require_positive(self, "actor_lr", "tau", "num_actions", "lagrangian_lr", "temperature_lr")
        require_one_of(self, "target_action", CQL_TARGET_ACTIONS)
        require_one_of(self, "next_actions_penalized_at", CQL_PENALTY_STATES)
        _require_discount(self.gamma)
        if self.min_q_weight < 0:
            raise ValueError(f"min_q_weight must be >= 0, got {self.min_q_weight}")
        if self.lagrangian_threshold is not None and self.min_q_weight == 0:
            raise ValueError("lagrangian_threshold scales the penalty of min_q_weight, which is 0; set one of them")


@dataclass(frozen=True)
class IQLParams(LearnerParams):
    """Implicit Q-learning (Kostrikov et al., 2021) for discrete and continuous actions: Q-learning on the
    dataset's actions only, to a value function fitted as an upper expectile of Q, and a policy that clones the
    data's actions weighted by exp(beta * advantage). `lr` is the Q- and value networks' learning rate."""

    actor_lr: float = 3e-4
    """Learning rate of the policy."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 0.005
    """Polyak rate at which target critics follow the critics, per gradient update."""
    expectile: float = 0.7
    """The expectile of Q(s, a) over the data's actions that V(s) fits, in (0.5, 1): higher is closer to the best
    action seen in the data (1 would be its max, Q-learning's overestimation included); 0.5 is the mean, SARSA."""
    beta: float = 1.0
    """Inverse temperature of the policy's advantage weights exp(beta * (Q - V)), capped at 100: 0 is behaviour
    cloning; higher favours the data's best actions more, and the noise in Q - V too (the paper's 3 suits its
    rescaled rewards; see the `advantage_weight_ess` metric and benchmarks/quality.md, "IQL: budget and beta")."""
    action_distribution: str = SQUASHED_GAUSSIAN
    """For continuous (Box) actions, the policy's distribution over the actions rescaled to [-1, 1]:
    `squashed_gaussian`, SAC's tanh-squashed Gaussian with a deviation that depends on the state; or
    `bounded_mean_gaussian`, the IQL paper's and d3rlpy's: a Gaussian with a tanh-bounded mean and one learned
    deviation per action dimension (common/action_distributions.py). Discrete actions are always categorical."""

    def __post_init__(self):
        super().__post_init__()
        require_positive(self, "actor_lr", "tau")
        require_one_of(self, "action_distribution", IQL_ACTION_DISTRIBUTIONS)
        _require_discount(self.gamma)
        if not 0.5 <= self.expectile < 1.0:
            raise ValueError(f"expectile must be in [0.5, 1), got {self.expectile}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.tau > 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")


@dataclass(frozen=True)
class AlgosConfig:
    """Hyper-parameters per algorithm; the keys are the names `orl train --algo` takes."""

    bc: BCParams = field(default_factory=BCParams)
    marwil: MARWILParams = field(default_factory=MARWILParams)
    dqn: DQNParams = field(default_factory=DQNParams)
    cql_dqn: ConservativeDQNParams = field(default_factory=ConservativeDQNParams)
    cql: CQLParams = field(default_factory=CQLParams)
    iql: IQLParams = field(default_factory=IQLParams)

    def get(self, algo: str) -> LearnerParams:
        return getattr(self, self.require_known(algo))

    @classmethod
    def names(cls) -> list[str]:
        return list(cls.__dataclass_fields__)

    @classmethod
    def require_known(cls, algo: str) -> str:
        if algo not in cls.names():
            raise ValueError(f"unknown algorithm '{algo}': use one of {', '.join(cls.names())}")
        return algo


@dataclass(frozen=True)
class RunConfig:
    """One training run: an algorithm and the dataset it learns from."""

    algo: str
    """The algorithm (a key of `algos`)."""
    dataset: str
    """The dataset (a key of `datasets`, `policy_datasets` or `imports`)."""

    def __post_init__(self):
        AlgosConfig.require_known(self.algo)


@dataclass(frozen=True)
class TrainConfig:
    """Which policies the pipeline trains, and the settings all runs share."""

    runs: dict[str, RunConfig] = field(default_factory=dict)
    """Training runs by name: each becomes runs/NAME (dvc.yaml's train@NAME, evaluate@NAME and ope@NAME stages).
    Name them ALGO-DATASET, as `orl train` does by default."""
    seed: int = 0
    """Seed of network initialisation and batch sampling."""
    checkpoint_every: int = 10
    """Iterations between resume checkpoints: a killed `orl train` re-run with the same inputs continues."""

    def __post_init__(self):
        require_positive(self, "checkpoint_every")


@dataclass(frozen=True)
class OnlinePolicyConfig:
    """A behaviour policy trained online with RLlib's PPO and stopped part of the way, as D4RL's "medium"
    policies are: collecting with its sampled actions gives data whose most likely actions are not an expert's."""

    env: EnvSpec
    """The environment: a Gymnasium id (LunarLander-v3) or a spec (common/envs.py's `EnvSpec`)."""
    target_score: float
    """Normalized score (0 random, 100 expert, on the evaluation seeds' references) at which training stops: of
    the mean return of the latest `score_episodes` training episodes (which sample their actions), or of
    `held_out_episodes` when set."""
    max_env_steps: int
    """Environment steps after which training gives up if the target is not reached (an error, no policy)."""
    seed: int
    """Seed of network initialisation, minibatch shuffling and the environments."""
    score_episodes: int = 100
    """Training episodes whose mean return is compared with the target: those of the fewest latest iterations
    that hold at least this many."""
    held_out_episodes: int = 0
    """When > 0, the policy runs this many episodes after each iteration, sampling its actions as
    collection will, and their mean return is the score compared with the target instead. The training
    episodes' mean lags behind a policy that improves fast (the mean still holds episodes of the policies
    before)."""
    held_out_seed: int = 2_000_000
    """Seed of the held-out episodes (see rollout's `episode_seeds`); keep it apart from collection and
    evaluation seeds."""
    lr: float = 3e-4
    """Adam learning rate."""
    batch_size: int = 4000
    """Environment steps sampled per PPO iteration."""
    minibatch_size: int = 128
    """Transitions per gradient update."""
    epochs: int = 10
    """Passes over each iteration's samples."""
    hidden_layers: list[int] = field(default_factory=lambda: [64, 64])
    """Sizes of the policy and value networks' hidden layers."""
    conv_filters: list[list[int]] = field(default_factory=lambda: [[32, 8, 4], [64, 4, 2], [64, 3, 1]])
    """For image observations: the CNN encoder's layers, each [channels, kernel, stride], as the offline learners'
    `conv_filters`; the default is the Nature DQN's, for 84x84 frames."""
    env_runners: int = 1
    """Ray actors sampling episodes (1 CPU each); the learner trains in the `orl` process. Raise on a cluster."""
    envs_per_env_runner: int = 4
    """Environments each actor steps at once."""
    normalize_observations: bool = False
    """For vector observations: the network sees each dimension shifted and scaled by its mean and standard
    deviation over random play (`training.online.NORMALIZING_STEPS` steps, seeded by `seed`), frozen before training
    and kept in the checkpoint, so that collection and evaluation feed the policy what it learned on. PPO on raw
    MuJoCo observations, whose velocities span far wider than their positions, learns many times slower
    (benchmarks/mujoco.md)."""

    def __post_init__(self):
        object.__setattr__(self, "env", EnvSpec.of(self.env))
        require_positive(self, "max_env_steps", "score_episodes", "lr", "batch_size", "minibatch_size", "epochs",
                         "env_runners", "envs_per_env_runner")
        if self.held_out_episodes < 0:
            raise ValueError(f"held_out_episodes must be >= 0 (0 scores the training episodes), "
                             f"got {self.held_out_episodes}")
        if not self.target_score < 100:
            raise ValueError(f"target_score must be below 100 (the expert), got {self.target_score}")
        require_layer_sizes(self.hidden_layers)
        require_conv_filters(self.conv_filters)
