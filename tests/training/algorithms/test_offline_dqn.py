"""Offline DQN on RLlib's new API stack: learns CartPole from data with no env runners; checkpoints reload and
act; the conservative penalty lowers Q-values of actions the data does not take."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import dataset_format as dataset
from collectors.collect import collect
from collectors.config import CollectConfig, DatasetConfig, PolicyConfig
from collectors.rollout import EpisodeRunner
from common.trained_policy import load_rl_module
from dataset_format import Col, episode_stats
from tests.conftest import CARTPOLE_EXPERT, built_algorithm, mixture, train_columns
from training.algorithms.rllib_internals import local_learner
from training.config import DQNParams

BUDGET = dict(iterations=40, updates_per_iteration=50, batch_size=256, hidden_layers=[64, 64], lr=1e-3,
              target_update_every=100)


@pytest.fixture(scope="module")
def medium_dataset(ray_local, tmp_path_factory):
    """The expert with probability 0.5, else a random action: both actions are covered."""
    path = tmp_path_factory.mktemp("dqn") / "cartpole-medium"
    spec = DatasetConfig(env="CartPole-v1", episodes=100, seed=2, policy=mixture(CARTPOLE_EXPERT, 0.5))
    collect("cartpole-medium", spec, CollectConfig(episodes_per_task=50), path)
    return path


def train_and_save(dataset_dir, params: DQNParams, checkpoint):
    with built_algorithm("dqn", params, dataset_dir) as algorithm:
        assert algorithm.env_runner_group is None  # offline: no env runner processes, local or remote
        for _ in range(params.iterations):
            stats = algorithm.train()["learners"]["default_policy"]
        algorithm.save_to_path(checkpoint)
    del algorithm
    gc.collect()
    return stats


def greedy_returns(checkpoint, episodes=10):
    runner = EpisodeRunner("CartPole-v1", PolicyConfig(kind="model", model=str(checkpoint), greedy=True),
                           seed=1_000_000, num_envs=episodes)
    table = runner.run(list(range(episodes)))
    return episode_stats(table)[0]


@pytest.mark.slow  # trains to a score, then runs its episodes
def test_offline_dqn_learns_cartpole_from_medium_data(medium_dataset, tmp_path):
    stats = train_and_save(medium_dataset, DQNParams(**BUDGET), tmp_path / "dqn")
    assert np.isfinite(stats["qf_loss"])
    returns = greedy_returns(tmp_path / "dqn")
    assert returns.mean() >= 100, returns  # well above random and below the expert


def test_conservative_penalty_lowers_q_of_unseen_actions(expert_dataset, tmp_path):
    arrays = dataset.load_arrays(expert_dataset)
    obs = torch.as_tensor(arrays[Col.OBS][::10])
    taken = torch.as_tensor(arrays[Col.ACTIONS][::10])
    gaps = {}
    for alpha in (0.0, 1.0):
        params = DQNParams(**{**BUDGET, "iterations": 6}, cql_alpha=alpha)
        stats = train_and_save(expert_dataset, params, tmp_path / f"alpha-{alpha}")
        assert ("cql_penalty" in stats) == (alpha > 0)
        module = load_rl_module(tmp_path / f"alpha-{alpha}")
        with torch.no_grad():
            q = module.compute_q_values({"obs": obs})["qf_preds"]
        q_taken = q.gather(1, taken[:, None]).squeeze(1)
        q_unseen = q.gather(1, (1 - taken)[:, None]).squeeze(1)  # the expert never takes these in these states
        gaps[alpha] = float((q_taken - q_unseen).mean())
    assert gaps[1.0] > gaps[0.0] + 0.5, gaps


def test_target_sync_count_survives_a_checkpoint(expert_dataset, tmp_path):
    """A resumed run syncs its target network on the same schedule as one never interrupted."""
    params = DQNParams(**{**BUDGET, "iterations": 2, "updates_per_iteration": 30})
    train_and_save(expert_dataset, params, tmp_path / "dqn")
    with built_algorithm("dqn", params, expert_dataset) as algorithm:
        algorithm.learner_group.restore_from_path(tmp_path / "dqn" / "learner_group")  # as `orl train` resumes
        assert local_learner(algorithm)._gradient_updates == 60


def test_dueling_q_values_equal_rllibs(expert_dataset):
    """Our dueling heads centre advantages with a plain mean where RLlib's is nan-aware: same Q-values."""
    from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import DefaultDQNTorchRLModule

    obs = {"obs": torch.as_tensor(dataset.load_arrays(expert_dataset)[Col.OBS][:64])}
    with built_algorithm("dqn", DQNParams(**BUDGET), expert_dataset) as algorithm:
        module = local_learner(algorithm).module["default_policy"]
        assert module.uses_dueling
        heads = {"af": module.af, "vf": module.vf}
        ours = module._qf_forward_helper(obs, module.encoder, heads)["qf_preds"]
        rllibs = DefaultDQNTorchRLModule._qf_forward_helper(module, obs, module.encoder, heads)["qf_preds"]
    torch.testing.assert_close(ours, rllibs)


@pytest.mark.parametrize("double_q", [True, False])
def test_td_loss_equals_rllibs(expert_dataset, double_q):
    """Our offline TD loss is RLlib's DQN loss with uniform importance weights, on the same batch."""
    from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner

    params = DQNParams(**BUDGET, double_q=double_q, n_step=3)
    with built_algorithm("dqn", params, expert_dataset) as algorithm:
        algorithm.train()  # the target network drifts from the online one
        learner = local_learner(algorithm)
        batch = train_columns(algorithm, 256)
        config = learner.config.get_config_for_module("default_policy")
        fwd_out = learner.module["default_policy"].forward_train(batch)
        ours = learner.compute_loss_for_module(module_id="default_policy", config=config, batch=batch,
                                               fwd_out=fwd_out)
        rllibs = DQNTorchLearner.compute_loss_for_module(
            learner, module_id="default_policy", config=config,
            batch={**batch, "weights": torch.ones_like(batch["rewards"])}, fwd_out=fwd_out)
    torch.testing.assert_close(ours, rllibs)
