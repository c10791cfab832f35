"""IQL (RLlib's, extended to discrete actions) trains offline with no env runners on both action kinds, moves its
target critics at every gradient update, fits V as an upper expectile of Q, and its checkpoints act."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

import dataset_format as dataset
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from tests.conftest import built_algorithm, train_columns
from training.algorithms.rllib_internals import local_learner
from training.config import IQLParams

BUDGET = {"iterations": 2, "updates_per_iteration": 10, "batch_size": 128, "hidden_layers": [32, 32]}


def linear_shapes(*networks) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for net in networks for m in net.modules()
            if isinstance(m, torch.nn.Linear)]


@pytest.mark.parametrize("data", ["expert_dataset", "pendulum_dataset"])
def test_iql_trains_offline_on_both_action_kinds_and_acts(data, request, tmp_path):
    dataset_dir = request.getfixturevalue(data)
    card = dataset.read_card(dataset_dir)
    obs_dim = card.spaces[0].shape[0]
    discrete = data == "expert_dataset"
    with built_algorithm("iql", IQLParams(**BUDGET), dataset_dir) as algorithm:
        assert algorithm.env_runner_group is None
        module = local_learner(algorithm).module[DEFAULT_MODULE_ID]
        # Discrete: Q(s, .) for each of CartPole's 2 actions. Box: one MLP over Pendulum's 3 obs and 1 action.
        q_out = [(32, 32), (32, 2)] if discrete else [(32, 32), (32, 1)]
        assert linear_shapes(module.qf_encoder, module.qf) == [(obs_dim if discrete else obs_dim + 1, 32), *q_out]
        assert linear_shapes(module.vf_encoder, module.vf) == [(obs_dim, 32), (32, 32), (32, 1)]
        for _ in range(BUDGET["iterations"]):
            stats = algorithm.train()["learners"][DEFAULT_MODULE_ID]
        for name in ("qf_loss", "policy_loss", "value_loss"):
            assert np.isfinite(stats[name]), name
        assert 0.0 < stats["advantage_weight_ess"] <= 1.0
        updates = BUDGET["iterations"] * BUDGET["updates_per_iteration"]
        # Target critics move at every gradient update, not once per iteration.
        assert stats["num_target_updates"] == updates
        algorithm.save_to_path(tmp_path / "iql")
    del algorithm
    gc.collect()

    policy = ModulePolicy(load_rl_module(tmp_path / "iql"), card.spaces[1], greedy=True)
    obs = dataset.load_arrays(dataset_dir)[Col.OBS][:64]
    actions, _ = policy.act(obs, [np.random.default_rng(i) for i in range(64)], envs=None)
    if discrete:
        assert set(np.unique(actions)) <= {0, 1}
    else:  # the tanh policy's [-1, 1] mapped back to the env's bounds
        assert policy.squashed and actions.shape == (64, 1) and np.all(np.abs(actions) <= 2.0)


def test_value_function_fits_an_upper_expectile_of_q(mixture_dataset):
    """V(s) sits above the mean of Q over the data's actions, at the expectile, and Q learns from V(s'): on
    epsilon-mixed data the value of a state is nearer its better action's Q than the average action's."""
    params = IQLParams(**{**BUDGET, "iterations": 6, "updates_per_iteration": 50, "expectile": 0.9, "lr": 1e-3})
    with built_algorithm("iql", params, mixture_dataset) as algorithm:
        for _ in range(params.iterations):
            algorithm.train()
        module = local_learner(algorithm).module[DEFAULT_MODULE_ID]
        batch = train_columns(algorithm, 512)
        with torch.no_grad():
            out = module.forward_train(batch)
    above = (out["qf_target_preds"] < out["vf_preds"]).float().mean()
    # Asymmetric weights 0.9 / 0.1: the fitted V is exceeded by about a tenth to a third of the data's Q-values.
    assert float(above) > 0.5, float(above)
    assert float(out["qf_preds"].mean()) > 1.0  # CartPole's +1 per step has been propagated through V(s')


def test_iql_bounded_mean_gaussian_learns_one_deviation_and_acts_within_the_bounds(pendulum_dataset, tmp_path):
    from common.action_distributions import TorchBoundedMeanGaussian

    card = dataset.read_card(pendulum_dataset)
    obs = dataset.load_arrays(pendulum_dataset)[Col.OBS][:64]
    params = IQLParams(**BUDGET, action_distribution="bounded_mean_gaussian")
    with built_algorithm("iql", params, pendulum_dataset) as algorithm:
        module = local_learner(algorithm).module[DEFAULT_MODULE_ID].unwrapped()
        assert module.get_train_action_dist_cls() is TorchBoundedMeanGaussian
        log_std_before = module.pi.log_std.detach().clone()
        for _ in range(BUDGET["iterations"]):
            algorithm.train()
        assert not torch.equal(module.pi.log_std.detach(), log_std_before)  # a parameter the actor's loss trains
        with torch.no_grad():
            inputs = module.forward_inference({"obs": torch.tensor(obs)})["action_dist_inputs"]
        log_std = inputs.chunk(2, dim=-1)[1]
        assert torch.equal(log_std, log_std[:1].expand_as(log_std))  # the same deviation in every state
        algorithm.save_to_path(tmp_path / "iql")
    del algorithm
    gc.collect()

    module = load_rl_module(tmp_path / "iql")
    greedy = ModulePolicy(module, card.spaces[1], greedy=True)
    actions, _ = greedy.act(obs, [], envs=None)
    # The mode tanh(mu) in [-1, 1], rescaled to Pendulum's torque in [-2, 2].
    mu = inputs.chunk(2, dim=-1)[0].numpy()
    np.testing.assert_allclose(actions, 2.0 * np.tanh(mu), rtol=1e-5, atol=1e-6)
    sampled, _ = ModulePolicy(module, card.spaces[1], greedy=False).act(
        obs, [np.random.default_rng(i) for i in range(64)], envs=None)
    assert sampled.shape == (64, 1) and np.abs(sampled).max() <= 2.0 and not np.allclose(sampled, actions)
