"""The offline algorithms, one registry entry each: its params, its RLlib config and the batches its learner reads.

`rllib_config` builds what every algorithm shares (the dataset, spaces, network, learners, seed) around the
entry's own config. params.yaml's `algos` section is parsed into the entry's params class
(training/config.py's `AlgosConfig`, whose keys are this registry's).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

import dataset_format as dataset
from common.errors import UserError
from common.observations import MODEL_INPUT_KEY, ModelInput, is_image, is_mapped, model_space
from training.algorithms.batch_columns import (
    cloning_batch,
    cloning_batch_in_unit_actions,
    one_step,
    with_n_step,
    with_returns,
    with_unit_actions,
)
from training.algorithms.train_batches import BatchPlan, TransitionsData
from training.config import (
    BOUNDED_MEAN_GAUSSIAN,
    DETERMINISTIC,
    GAUSSIAN,
    SQUASHED_GAUSSIAN,
    BCParams,
    ConservativeDQNParams,
    CQLParams,
    DQNParams,
    IQLParams,
    LearnerParams,
    MARWILParams,
)


@dataclass(frozen=True)
class OfflineAlgorithm:
    params: type[LearnerParams]
    """The dataclass its `algos.NAME` section of params.yaml is parsed into."""
    rllib_config: Callable[[LearnerParams], object]
    """Its own RLlib AlgorithmConfig from its params (training settings, learner and module classes)."""
    batches: Callable[[LearnerParams, gym.Space], BatchPlan]
    """How its learner's batches are made from dataset rows, given its params and the action space."""
    action_spaces: tuple[type[gym.Space], ...]
    """The action spaces it trains on."""
    curve_loss: str
    """The learner statistic its learning curve follows."""
    policy_is_distribution: bool
    """Its policy is a distribution over actions to sample (else it acts on the argmax of Q-values or, for CQL,
    the mean of SAC's squashed Gaussian)."""


def _bc_config(params: BCParams):
    from training.algorithms.offline_marwil import (
        OfflineBCConfig,
        SquashedGaussianBCCatalog,
        TanhDeterministicBCCatalog,
    )

    box_catalog = {SQUASHED_GAUSSIAN: SquashedGaussianBCCatalog, DETERMINISTIC: TanhDeterministicBCCatalog}
    return OfflineBCConfig().training(lr=params.lr, box_catalog=box_catalog.get(params.action_distribution))


def _marwil_config(params: MARWILParams):
    from training.algorithms.offline_marwil import OfflineMARWILConfig

    return OfflineMARWILConfig().training(lr=params.lr, beta=params.beta, vf_coeff=params.vf_coeff, gamma=params.gamma,
                                          moving_average_sqd_adv_norm_update_rate=params.advantage_norm_rate)


def _dqn_config(params: DQNParams):
    from training.algorithms.offline_dqn import OfflineDQNConfig

    return OfflineDQNConfig().training(
        lr=params.lr, gamma=params.gamma, double_q=params.double_q, dueling=params.dueling,
        cql_alpha=params.cql_alpha, target_network_update_freq=params.target_update_every, n_step=params.n_step,
    )


def _cql_config(params: CQLParams):
    from training.algorithms.offline_cql import LAGRANGIAN_LR, LAGRANGIAN_THRESHOLD, OfflineCQLConfig

    # SAC-based CQL has one learning rate per network (and refuses a global `lr`).
    return OfflineCQLConfig().training(
        lr=None, actor_lr=params.actor_lr, critic_lr=params.lr, alpha_lr=params.temperature_lr,
        gamma=params.gamma, tau=params.tau, min_q_weight=params.min_q_weight, num_actions=params.num_actions,
        bc_iters=0,  # no behaviour-cloning warm-up, as in d3rlpy's CQL
        deterministic_backup=True, target_action=params.target_action,  # targets without the entropy term
        next_actions_penalized_at=params.next_actions_penalized_at, critic_layer_norm=params.critic_layer_norm,
    ).learners(learner_config_dict={LAGRANGIAN_THRESHOLD: params.lagrangian_threshold,
                                    LAGRANGIAN_LR: params.lagrangian_lr})


def _iql_config(params: IQLParams):
    from training.algorithms.offline_iql import OfflineIQLConfig

    return OfflineIQLConfig().training(
        lr=None, actor_lr=params.actor_lr, critic_lr=params.lr, value_lr=params.lr, gamma=params.gamma,
        tau=params.tau, expectile=params.expectile, advantage_beta=params.beta,
        bounded_mean_gaussian=params.action_distribution == BOUNDED_MEAN_GAUSSIAN,
    )


# IQL (and BC's `squashed_gaussian`) clone the data's actions through the log-density of SAC's tanh-squashed
# Gaussian, which at the bounds themselves is that of a pre-squash action of atanh(1 - 1e-6) = 7.3, far beyond the
# rest: half of pendulum-medium's actions are at the torque bound. Kept 1 % inside, they are atanh(0.99) = 2.6. It
# removes that degenerate density; it did not lift IQL's score on pendulum-medium at beta 3 (benchmarks/quality.md,
# "IQL and the misses").
SQUASHED_ACTION_MARGIN = 0.01


def _unit_action_batches(params: LearnerParams, action_space, margin: float = 0.0) -> BatchPlan:
    """Transitions, with Box actions rescaled to the [-1, 1] of SAC's tanh policy (offline_cql.py)."""
    return BatchPlan(with_unit_actions, {"low": action_space.low, "high": action_space.high, "margin": margin})


def _iql_batches(params: IQLParams, action_space) -> BatchPlan:
    if isinstance(action_space, gym.spaces.Box):
        return _unit_action_batches(params, action_space, SQUASHED_ACTION_MARGIN)
    return BatchPlan(one_step)


def _bc_batches(params: BCParams, action_space) -> BatchPlan:
    if isinstance(action_space, gym.spaces.Box) and params.action_distribution != GAUSSIAN:
        # A squared error has no degenerate density at the bounds to keep the actions from.
        margin = SQUASHED_ACTION_MARGIN if params.action_distribution == SQUASHED_GAUSSIAN else 0.0
        return BatchPlan(cloning_batch_in_unit_actions,
                         {"low": action_space.low, "high": action_space.high, "margin": margin})
    return BatchPlan(cloning_batch)


def _n_step_batches(params: DQNParams, action_space) -> BatchPlan:
    return BatchPlan(with_n_step, {"n": params.n_step, "gamma": params.gamma})


_DQN = dict(rllib_config=_dqn_config, batches=_n_step_batches, action_spaces=(gym.spaces.Discrete,),
            curve_loss="qf_loss", policy_is_distribution=False)

ALGORITHMS: dict[str, OfflineAlgorithm] = {
    "bc": OfflineAlgorithm(BCParams, _bc_config, _bc_batches, (gym.spaces.Discrete, gym.spaces.Box),
                           curve_loss="policy_loss", policy_is_distribution=True),
    "marwil": OfflineAlgorithm(
        MARWILParams, _marwil_config,
        lambda params, action_space: BatchPlan(with_returns, {"gamma": params.gamma}, params.returns_read_rows),
        (gym.spaces.Discrete, gym.spaces.Box), curve_loss="policy_loss", policy_is_distribution=True),
    "dqn": OfflineAlgorithm(DQNParams, **_DQN),
    "cql_dqn": OfflineAlgorithm(ConservativeDQNParams, **_DQN),
    "cql": OfflineAlgorithm(CQLParams, _cql_config, _unit_action_batches, (gym.spaces.Box,), curve_loss="qf_loss",
                            policy_is_distribution=False),
    "iql": OfflineAlgorithm(IQLParams, _iql_config, _iql_batches, (gym.spaces.Discrete, gym.spaces.Box),
                            curve_loss="qf_loss", policy_is_distribution=True),
}


def algorithm(name: str) -> OfflineAlgorithm:
    if name not in ALGORITHMS:
        raise UserError(f"unknown algorithm '{name}': use one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def rllib_config(algo: str, params: LearnerParams, dataset_path: str | Path | dataset.Location, seed: int,
                 card: dataset.DatasetCard | None = None):
    """The RLlib AlgorithmConfig that trains `algo` offline on the dataset (a directory or an s3:// prefix), whose
    card is read unless given."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    location = dataset.locate(dataset_path)
    card = card or dataset.read_card(location)
    entry, (observation_space, action_space) = algorithm(algo), card.spaces
    if not isinstance(action_space, entry.action_spaces):
        kinds = " or ".join("discrete" if kind is gym.spaces.Discrete else "continuous (Box)"
                            for kind in entry.action_spaces)
        hint = "; use cql_dqn for discrete actions" if algo == "cql" else ""
        raise UserError(f"{algo} needs {kinds} actions; this dataset's action space is {action_space}{hint}")
    plan = entry.batches(params, action_space)
    model_config = dataclasses.asdict(DefaultModelConfig(
        fcnet_hiddens=list(params.hidden_layers), fcnet_activation=params.activation, vf_share_layers=False))
    if is_image(observation_space):
        if isinstance(action_space, gym.spaces.Box):
            raise UserError(f"{algo} on image observations needs discrete actions here: the continuous learners' "
                            "Q-network takes vectors (ConcatQCatalog)")
        # Hidden layers between the CNN and each output, as the Nature DQN's 512 units and d3rlpy's pixel encoder:
        # RLlib's heads are otherwise one linear layer over every feature of the last convolution.
        model_config.update(conv_filters=params.conv_filters, conv_activation=params.activation,
                            head_fcnet_hiddens=list(params.hidden_layers), head_fcnet_activation=params.activation)
    if is_mapped(observation_space):
        # A CNN takes channels-last frames in [0, 1], an MLP a Discrete observation one-hot; the module keeps the map,
        # so a loaded policy maps raw observations the same way (common/observations.py).
        model_input = ModelInput.of(observation_space)
        plan = dataclasses.replace(plan, model_input=model_input)
        model_config[MODEL_INPUT_KEY] = dataclasses.asdict(model_input)
    return (
        entry.rllib_config(params)
        .environment(observation_space=model_space(observation_space), action_space=action_space)
        .offline_data(
            input_=[location.root],
            input_filesystem=location.fs,
            offline_data_class=TransitionsData.for_plan(plan, params.stream_read_ahead_mib * 2**20, location),
            dataset_num_iters_per_learner=params.updates_per_iteration,
            # Small datasets are mapped once and held in memory; larger ones stream from Parquet at each pass,
            # so memory does not grow with them (train_batches.py).
            materialize_mapped_data=_held_bytes(location, card) <= params.memory_cache_mib * 2**20,
            # Rows are stored in episode order: without a shuffle, each update would see consecutive steps of one
            # or two episodes, which stalls and can diverge Q-learning.
            iter_batches_kwargs={"local_shuffle_buffer_size": _shuffle_rows(params, card), "local_shuffle_seed": seed},
        )
        .learners(num_learners=params.num_learners, num_gpus_per_learner=require_gpus(algo, params))
        .training(train_batch_size_per_learner=params.batch_size)
        # MARWIL's value function keeps its own layers, as in RLlib's MARWIL defaults: its targets are returns
        # on the reward's scale, whose loss would swamp the policy's through a shared encoder.
        .rl_module(model_config=model_config)
        .debugging(seed=seed)
        # Turns off RLlib's two finiteness checks per gradient tensor: our learners make one per update
        # (lean_learner.py).
        .framework(torch_skip_nan_gradients=True)
        # One iteration is exactly `updates_per_iteration` updates (CQL would otherwise repeat them).
        .reporting(min_time_s_per_iteration=0, min_train_timesteps_per_iteration=0)
    )


def learner_metrics(result: dict) -> dict[str, float]:
    """The scalar learner statistics of one `Algorithm.train()` result."""
    stats = result["learners"]["default_policy"]
    return {k: float(v) for k, v in stats.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}


def require_gpus(algo: str, params: LearnerParams) -> float:
    """`num_gpus_per_learner`, once the GPUs it asks for are there: without them RLlib fails an assert in this
    process (no learner actors) or its learner actors wait forever for resources."""
    wanted = params.num_gpus_per_learner
    if wanted == 0:
        return wanted
    import ray
    import torch

    if params.num_learners == 0:
        need, have = 1, torch.cuda.device_count()
        where = f"torch sees {have} in this process"
    else:
        need, have = params.num_learners * wanted, ray.cluster_resources().get("GPU", 0)
        where = f"Ray's cluster has {have:g}"
    if have < need:
        raise UserError(f"algos.{algo}.num_gpus_per_learner is {wanted:g} (num_learners {params.num_learners}): "
                        f"training needs {need:g} GPU, and {where}; set it to 0 to train on the CPU")
    return wanted


def _shuffle_rows(params: LearnerParams, card: dataset.DatasetCard) -> int:
    """`shuffle_buffer`, fewer where the stream would hold more than the learner's memory budget
    (`memory_cache_mib`, at least a batch): the buffer and its parts as they are joined, each row with an observation
    and a next observation as stored. A million rows of 4-frame 84x84 stacks are 56 GB, twice over."""
    row_bytes = 2 * _observation_bytes(card.spaces[0])
    return max(params.batch_size, min(params.shuffle_buffer, params.memory_cache_mib * 2**20 // (2 * row_bytes)))


def _held_bytes(location: dataset.Location, card: dataset.DatasetCard) -> int:
    """About what holding the dataset in memory takes: its Parquet bytes, or for images one observation per
    transition (the frames of `obs` come again in `new_obs` and are held once), not their bytes on disk, where zstd
    makes repeated frames tens of times smaller. A frame stack takes about a quarter of that."""
    if is_image(card.spaces[0]):
        return card.transitions * _observation_bytes(card.spaces[0])
    return dataset.size_on_disk(location, card)


def _observation_bytes(space: gym.Space) -> int:
    """An observation's bytes as stored."""
    return space.dtype.itemsize * int(np.prod(space.shape))
