"""Maps our typed params onto RLlib (new API stack, torch) offline algorithm configs."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym

from collectors import dataset
from collectors.errors import UserError
from training.config import BCParams, CQLParams, DQNParams, LearnerParams, MARWILParams


def _common(config, params: LearnerParams, spaces: tuple[gym.Space, gym.Space], dataset_dir: Path, seed: int):
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    observation_space, action_space = spaces
    config = (
        config.environment(observation_space=observation_space, action_space=action_space)
        .offline_data(
            input_=[str(Path(dataset_dir).resolve())],
            dataset_num_iters_per_learner=params.updates_per_iteration,
            # Tasks, not RLlib's default 2 actors x 1 CPU, which starve the Parquet read task on 2 CPUs forever.
            map_batches_kwargs={"concurrency": params.map_tasks, "num_cpus": 1},
            # Small datasets are mapped once and held in memory; larger ones stream from Parquet at each pass,
            # so memory does not grow with them.
            materialize_mapped_data=dataset.size_on_disk(dataset_dir) <= params.memory_cache_mib * 2**20,
            # RLlib streams rows in file order: without a shuffle, each update sees consecutive steps of one
            # or two episodes, which stalls and can diverge Q-learning.
            iter_batches_kwargs={"local_shuffle_buffer_size": params.shuffle_buffer, "local_shuffle_seed": seed},
        )
        .learners(num_learners=params.num_learners)
        .training(train_batch_size_per_learner=params.batch_size)
        # MARWIL's value function keeps its own layers, as in RLlib's MARWIL defaults: its targets are returns
        # on the reward's scale, whose loss would swamp the policy's through a shared encoder.
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=list(params.hidden_layers),
                                                   fcnet_activation=params.activation, vf_share_layers=False))
        .debugging(seed=seed)
        # Turns off RLlib's two finiteness checks per gradient tensor: our learners make one per update
        # (training/lean_learner.py).
        .framework(torch_skip_nan_gradients=True)
        # One iteration is exactly `updates_per_iteration` updates (CQL would otherwise repeat them).
        .reporting(min_time_s_per_iteration=0, min_train_timesteps_per_iteration=0)
    )
    # Read by TransitionsData: RLlib's config has no setting for Ray Data's memory budget or block size.
    config.stream_read_ahead_bytes = params.stream_read_ahead_mib * 2**20
    config.stream_block_bytes = params.stream_block_mib * 2**20
    return config


def curve_loss(params: LearnerParams) -> str:
    """The learner statistic a learning curve follows: the critic's TD loss for Q-learning, else the policy's."""
    return "qf_loss" if isinstance(params, (DQNParams, CQLParams)) else "policy_loss"


def rllib_config(algo: str, params: LearnerParams, spaces, dataset_dir: Path, seed: int):
    """The RLlib AlgorithmConfig that trains `algo` offline on the dataset directory."""
    if isinstance(params, DQNParams):
        from training.offline_dqn import OfflineDQNConfig

        if not isinstance(spaces[1], gym.spaces.Discrete):
            raise UserError(f"{algo} needs discrete actions; this dataset's action space is {spaces[1]}")
        config = OfflineDQNConfig().training(
            lr=params.lr, gamma=params.gamma, double_q=params.double_q, dueling=params.dueling,
            cql_alpha=params.cql_alpha, target_network_update_freq=params.target_update_every, n_step=params.n_step,
        )
    elif isinstance(params, CQLParams):
        from training.offline_cql import OfflineCQLConfig

        if not isinstance(spaces[1], gym.spaces.Box):
            raise UserError(f"{algo} needs continuous (Box) actions; this dataset's action space is {spaces[1]}; "
                            "use cql_dqn for discrete actions")
        # SAC-based CQL has one learning rate per network (and refuses a global `lr`).
        config = OfflineCQLConfig().training(
            lr=None, actor_lr=params.actor_lr, critic_lr=params.lr, alpha_lr=params.lr, gamma=params.gamma,
            tau=params.tau, min_q_weight=params.min_q_weight, num_actions=params.num_actions,
            bc_iters=0,  # no behaviour-cloning warm-up, as in d3rlpy's CQL
        )
    elif isinstance(params, MARWILParams):
        from training.offline_marwil import OfflineMARWILConfig

        config = OfflineMARWILConfig().training(
            lr=params.lr, beta=params.beta, vf_coeff=params.vf_coeff, gamma=params.gamma,
            moving_average_sqd_adv_norm_update_rate=params.advantage_norm_rate,
            returns_read_rows=params.returns_read_rows,
        )
    elif isinstance(params, BCParams):
        from training.offline_marwil import OfflineBCConfig

        config = OfflineBCConfig().training(lr=params.lr)
    else:
        raise TypeError(f"no RLlib mapping for {type(params).__name__} ({algo})")
    return _common(config, params, spaces, dataset_dir, seed)
