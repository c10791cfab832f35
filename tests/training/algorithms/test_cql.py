"""CQL (RLlib's, SAC-based) on a continuous-action dataset: trains with no env runners, sees the dataset's
actions rescaled to its tanh policy's [-1, 1], and its checkpoint acts within the env's bounds; with a Lagrangian
threshold it learns its conservative weight, which a resumed run restores; its target critics value the next state at
a sampled action or at the policy's mean; its target critics follow its critics by tau at every update; its entropy
temperature learns at a rate of its own."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from ray.rllib.algorithms.sac.sac_learner import ACTION_DIST_INPUTS_NEXT
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns

import dataset_format as dataset
from common.errors import UserError
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from tests.conftest import built_algorithm
from training.algorithms.offline_cql import (
    CONSERVATIVE_GAP,
    CONSERVATIVE_WEIGHT,
    LOG_CONSERVATIVE_WEIGHTS,
    LOG_ENTROPY_TEMPERATURES,
)
from training.algorithms.registry import rllib_config
from training.algorithms.rllib_internals import local_learner
from training.config import CURRENT, MEAN, NEXT, SAMPLED, CQLParams, DQNParams

BUDGET = dict(iterations=3, updates_per_iteration=10, batch_size=128, hidden_layers=[32, 32])


def test_cql_trains_offline_and_acts_within_the_bounds(pendulum_dataset, tmp_path):
    card = dataset.read_card(pendulum_dataset)
    with built_algorithm("cql", CQLParams(**BUDGET), pendulum_dataset) as algorithm:
        assert algorithm.env_runner_group is None
        module = local_learner(algorithm).module[DEFAULT_MODULE_ID]
        q_layers = [m for m in (*module.qf_encoder.modules(), *module.qf.modules()) if isinstance(m, torch.nn.Linear)]
        # Q(s, a) as in the CQL paper and d3rlpy: one MLP over Pendulum's 3 obs and 1 action, not RLlib's streams.
        assert [(layer.in_features, layer.out_features) for layer in q_layers] == [(4, 32), (32, 32), (32, 1)]
        batch = algorithm.offline_data.sample(num_samples=128, num_shards=0)["default_policy"]
        data_actions = dataset.load_arrays(pendulum_dataset)[Col.ACTIONS]
        assert np.abs(data_actions).max() > 1.5  # Pendulum's torque bound is 2
        assert np.abs(batch[Col.ACTIONS]).max() <= 1.0  # what the squashed policy can represent
        for _ in range(BUDGET["iterations"]):
            stats = algorithm.train()["learners"]["default_policy"]
        assert np.isfinite(stats["qf_loss"]) and np.isfinite(stats["policy_loss"])
        algorithm.save_to_path(tmp_path / "cql")
    del algorithm
    gc.collect()

    policy = ModulePolicy(load_rl_module(tmp_path / "cql"), card.spaces[1], greedy=True)
    assert policy.squashed
    obs = dataset.load_arrays(pendulum_dataset)[Col.OBS][:64]
    actions, _ = policy.act(obs, [np.random.default_rng(i) for i in range(64)], envs=None)
    assert actions.shape == (64, 1) and np.all(np.abs(actions) <= 2.0)


@pytest.mark.parametrize("states", [CURRENT, NEXT])
def test_the_penalty_values_the_next_states_policy_actions_at_the_chosen_states(pendulum_dataset, states):
    # At the current states by default, as the CQL paper's code, CORL and d3rlpy do; RLlib 2.60 at the next states.
    assert CQLParams().next_actions_penalized_at == CURRENT
    params = CQLParams(**BUDGET, next_actions_penalized_at=states)
    with built_algorithm("cql", params, pendulum_dataset) as algorithm:
        module = local_learner(algorithm).module[DEFAULT_MODULE_ID]
        batch = _module_batch(algorithm, 16)
        with torch.no_grad():
            fwd_out = module.forward_train(batch)
            actions = fwd_out["actions_next_repeat"]
            repeats = actions.shape[0] // 16

            def q(observations, actions=actions):
                return module.compute_q_values({Columns.OBS: observations.repeat_interleave(repeats, dim=0),
                                                Columns.ACTIONS: actions}).view(16, repeats, 1)

            penalized = torch.min(fwd_out["q_next_repeat"], fwd_out["q_twin_next_repeat"])
            assert torch.allclose(penalized, q(batch[Columns.OBS])) == (states == CURRENT)
            assert torch.allclose(penalized, q(batch[Columns.NEXT_OBS])) == (states == NEXT)
            # The uniform and the current policy's actions are valued at the current states either way.
            current = torch.min(fwd_out["q_curr_repeat"], fwd_out["q_twin_curr_repeat"])
            assert torch.allclose(current, q(batch[Columns.OBS], fwd_out["actions_curr_repeat"]))


def test_the_penalty_samples_uniform_actions_in_the_policys_bounds_not_the_envs(pendulum_dataset):
    # Pendulum's torque bound is 2; the critics see actions rescaled to [-1, 1], and the learner subtracts the
    # log-density of a uniform over [-1, 1] from their values (RLlib 2.60's CQL learner).
    with built_algorithm("cql", CQLParams(**BUDGET), pendulum_dataset) as algorithm:
        module = local_learner(algorithm).module[DEFAULT_MODULE_ID]
        assert module.action_space.high.max() == 2.0
        with torch.no_grad():
            uniform = module.forward_train(_module_batch(algorithm, 128))["actions_rand_repeat"]
    assert uniform.abs().max() <= 1.0 and uniform.min() < -0.9 and uniform.max() > 0.9


@pytest.mark.parametrize("target_action", [SAMPLED, MEAN])
def test_the_target_critics_value_the_next_state_at_the_chosen_action(pendulum_dataset, target_action):
    with built_algorithm("cql", CQLParams(**BUDGET, target_action=target_action), pendulum_dataset) as algorithm:
        module = local_learner(algorithm).module[DEFAULT_MODULE_ID]
        batch = _module_batch(algorithm, 16)
        with torch.no_grad():
            fwd_out = module.forward_train(batch)
            mean, _ = fwd_out[ACTION_DIST_INPUTS_NEXT].chunk(2, dim=-1)
            at_mean = module.forward_target({Columns.OBS: batch[Columns.NEXT_OBS], Columns.ACTIONS: torch.tanh(mean)})
        assert torch.allclose(fwd_out["q_target_next"], at_mean) == (target_action == MEAN)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_critic_layer_norm_normalizes_the_critics_layers_alone(pendulum_dataset, tmp_path, layer_norm):
    with built_algorithm("cql", CQLParams(**BUDGET, critic_layer_norm=layer_norm), pendulum_dataset) as algorithm:
        algorithm.train()
        algorithm.save_to_path(tmp_path / "cql")
    del algorithm
    gc.collect()

    module = load_rl_module(tmp_path / "cql")  # a restored module rebuilds its critics the same way
    for critic in (module.qf_encoder, module.qf_twin_encoder):
        norms = [m for m in critic.modules() if isinstance(m, torch.nn.LayerNorm)]
        assert [norm.normalized_shape for norm in norms] == ([(32,), (32,)] if layer_norm else [])
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in module.pi_encoder.modules())


def _module_batch(algorithm, rows: int) -> dict:
    """`rows` rows of the train batches, as the float tensors the module's `forward_train` takes."""
    sample = algorithm.offline_data.sample(num_samples=rows, num_shards=0)["default_policy"]
    return {key: torch.as_tensor(sample[key], dtype=torch.float32)
            for key in (Columns.OBS, Columns.ACTIONS, Columns.NEXT_OBS, Columns.REWARDS)}


@pytest.mark.parametrize("threshold", [1e3, -1e3])
def test_the_conservative_weight_shrinks_below_the_threshold_and_grows_above(pendulum_dataset, threshold):
    # The gap (logsumexp of Q over sampled actions less Q on the data's) is a few units here: far below 1e3, far
    # above -1e3.
    params = CQLParams(**BUDGET, lagrangian_threshold=threshold, lagrangian_lr=0.01)
    with built_algorithm("cql", params, pendulum_dataset) as algorithm:
        stats = algorithm.train()["learners"]["default_policy"]
        assert abs(stats[CONSERVATIVE_GAP]) < 100
        weight = stats[CONSERVATIVE_WEIGHT]
        assert weight < 1 if threshold > 0 else weight > 1  # it starts at 1 and moves at each update


def test_the_target_critics_follow_the_critics_by_tau_at_every_update(pendulum_dataset, monkeypatch):
    params = CQLParams(**BUDGET, tau=0.05)
    with built_algorithm("cql", params, pendulum_dataset) as algorithm:
        learner = local_learner(algorithm)
        module = learner.module[DEFAULT_MODULE_ID]
        steps, apply_gradients = [], learner.apply_gradients

        def recorded(gradients):
            before = {name: tensor.clone() for name, tensor in module.state_dict().items()}
            apply_gradients(gradients)
            steps.append((before, {name: tensor.clone() for name, tensor in module.state_dict().items()}))

        monkeypatch.setattr(learner, "apply_gradients", recorded)
        algorithm.train()
    targets = [name for name in steps[0][0] if name.startswith("target_") and "clip_param" not in name]
    assert len(steps) == params.updates_per_iteration and len(targets) == 12  # 3 layers' weights and biases, twice
    assert all(torch.equal(steps[0][0][name], steps[0][0][name.removeprefix("target_")]) for name in targets)
    for before, after in steps:  # d3rlpy's soft sync: tau of the way to the critics just stepped
        for name in targets:
            online = after[name.removeprefix("target_")]
            assert not torch.equal(online, before[name.removeprefix("target_")]), name
            torch.testing.assert_close(after[name], before[name] + params.tau * (online - before[name]))


def test_the_entropy_temperature_learns_at_its_own_rate(pendulum_dataset):
    params = CQLParams(**BUDGET, temperature_lr=1e-5)
    with built_algorithm("cql", params, pendulum_dataset) as algorithm:
        stats = algorithm.train()["learners"]["default_policy"]
    assert stats["alpha_learning_rate"] == params.temperature_lr
    # Adam moves the log, from 0 (a temperature of 1), by about the learning rate at each update, not the critics'.
    assert 0 < abs(stats["log_alpha_value"]) <= 1.1 * params.temperature_lr * params.updates_per_iteration


def test_a_resumed_run_goes_on_from_the_learned_weight_and_temperature(pendulum_dataset, tmp_path):
    # As `orl train` resumes: the learner group saved, then restored into a newly built algorithm.
    params = CQLParams(**BUDGET, lagrangian_threshold=1e3, lagrangian_lr=0.01)
    with built_algorithm("cql", params, pendulum_dataset) as algorithm:
        algorithm.train()
        learned = {key: local_learner(algorithm).get_state()[key][DEFAULT_MODULE_ID]
                   for key in (LOG_CONSERVATIVE_WEIGHTS, LOG_ENTROPY_TEMPERATURES)}
        algorithm.learner_group.save_to_path(tmp_path / "learner_group")
    with built_algorithm("cql", params, pendulum_dataset) as algorithm:
        learner = local_learner(algorithm)
        started = {key: learner.get_state()[key][DEFAULT_MODULE_ID] for key in learned}
        assert all(started[key] != learned[key] for key in learned)  # both moved during the first run's updates
        algorithm.learner_group.restore_from_path(tmp_path / "learner_group")
        assert {key: learner.get_state()[key][DEFAULT_MODULE_ID] for key in learned} == learned


def test_algorithms_refuse_the_wrong_action_space(pendulum_dataset, expert_dataset):
    with pytest.raises(UserError, match="needs discrete actions"):
        rllib_config("dqn", DQNParams(), pendulum_dataset, seed=0)
    with pytest.raises(UserError, match="needs continuous"):
        rllib_config("cql", CQLParams(), expert_dataset, seed=0)
