"""MARWIL's advantage normalizer starts at the data's scale, not RLlib's fixed 100; BC's loss is RLlib's MARWIL
loss at beta = 0; BC's squashed Gaussian fits actions rescaled to [-1, 1] and acts within the env's bounds; its
deterministic policy fits them by squared error and acts on tanh(mu) whether sampling or not."""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

import dataset_format as dataset
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from pipelines.params import load_params
from tests.conftest import built_algorithm, train_columns
from training.algorithms.batch_columns import ACTIONS, OBS, VALUE_TARGETS
from training.algorithms.registry import SQUASHED_ACTION_MARGIN
from training.algorithms.rllib_internals import local_learner, squared_advantage_norms
from training.config import DETERMINISTIC, GAUSSIAN, SQUASHED_GAUSSIAN

ROWS = 256


def test_first_update_sets_the_squared_advantage_norm_from_its_batch(mixture_dataset, ray_local):
    with built_algorithm("marwil", load_params("params.yaml").algos.marwil, mixture_dataset) as algorithm:
        learner = local_learner(algorithm)
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        columns = train_columns(algorithm, ROWS)
        with torch.no_grad():  # what the initial value function leaves to explain (no episode hits the time limit)
            expected = (columns[VALUE_TARGETS] - module.compute_values({OBS: columns[OBS]})).square().mean()

        learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=ROWS),
                       timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 0})

        # One update moves the running mean towards its own batch's value, which it started at.
        norm = squared_advantage_norms(learner)[DEFAULT_MODULE_ID]
        torch.testing.assert_close(norm, expected)
        assert not torch.isclose(norm, torch.tensor(algorithm.config.moving_average_sqd_adv_norm_start), rtol=0.5)


def test_a_resumed_run_goes_on_from_the_squared_advantage_norm(mixture_dataset, ray_local, tmp_path):
    # As `orl train` resumes: the learner group saved, then restored into a newly built algorithm.
    params = dataclasses.replace(load_params("params.yaml").algos.marwil, iterations=1, updates_per_iteration=3)
    with built_algorithm("marwil", params, mixture_dataset) as algorithm:
        algorithm.train()
        learned = float(squared_advantage_norms(local_learner(algorithm))[DEFAULT_MODULE_ID])
        algorithm.learner_group.save_to_path(tmp_path / "learner_group")
    with built_algorithm("marwil", params, mixture_dataset) as algorithm:
        algorithm.learner_group.restore_from_path(tmp_path / "learner_group")
        norm = squared_advantage_norms(local_learner(algorithm))[DEFAULT_MODULE_ID]
        assert float(norm) == pytest.approx(learned, rel=1e-6)


@pytest.mark.parametrize("data", ["mixture_dataset", "pendulum_dataset"])  # discrete and continuous actions
def test_bc_loss_equals_rllibs_marwil_loss_at_beta_zero(data, request):
    from ray.rllib.algorithms.marwil.torch.marwil_torch_learner import MARWILTorchLearner

    with built_algorithm("bc", load_params("params.yaml").algos.bc, request.getfixturevalue(data)) as algorithm:
        algorithm.train()
        learner = local_learner(algorithm)
        batch = train_columns(algorithm, ROWS)
        config = learner.config.get_config_for_module(DEFAULT_MODULE_ID)
        assert config.beta == 0
        fwd_out = learner.module[DEFAULT_MODULE_ID].forward_train(batch)
        ours = learner.compute_loss_for_module(module_id=DEFAULT_MODULE_ID, config=config, batch=batch,
                                               fwd_out=fwd_out)
        rllibs = MARWILTorchLearner.compute_loss_for_module(learner, module_id=DEFAULT_MODULE_ID, config=config,
                                                            batch=batch, fwd_out=fwd_out)
    torch.testing.assert_close(ours, rllibs)


def test_bc_squashed_gaussian_fits_unit_actions_and_acts_within_the_bounds(pendulum_dataset, tmp_path):
    from ray.rllib.core.distribution.torch.torch_distribution import TorchSquashedGaussian

    card = dataset.read_card(pendulum_dataset)
    logged = dataset.load_arrays(pendulum_dataset)[Col.ACTIONS]
    params = dataclasses.replace(load_params("params.yaml").algos.bc, action_distribution=SQUASHED_GAUSSIAN,
                                 iterations=3, hidden_layers=[32, 32])
    with built_algorithm("bc", params, pendulum_dataset) as algorithm:
        learner = local_learner(algorithm)
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        assert module.get_train_action_dist_cls() is TorchSquashedGaussian
        batch = train_columns(algorithm, ROWS)
        # Pendulum's torque in [-2, 2], halved into [-1, 1] and kept 1 % inside it: the expert's full torques
        # sit at the margin, the rest are the data's own actions halved.
        unit = batch[ACTIONS].numpy()
        limit = 1.0 - SQUASHED_ACTION_MARGIN
        assert np.abs(unit).max() == pytest.approx(limit)
        inside = np.abs(unit) < limit
        assert inside.any() and (np.abs(2.0 * unit[inside][:, None] - logged.ravel()).min(axis=1) < 1e-5).all()

        def loss() -> float:
            with torch.no_grad():
                logits = module.forward_train(batch)["action_dist_inputs"]
                return -TorchSquashedGaussian.from_logits(logits).logp(batch[ACTIONS]).mean().item()

        before = loss()
        for _ in range(params.iterations):
            algorithm.train()
        assert loss() < before
        algorithm.save_to_path(tmp_path / "bc")
    del algorithm
    gc.collect()

    policy = ModulePolicy(load_rl_module(tmp_path / "bc"), card.spaces[1], greedy=True)
    actions, _ = policy.act(dataset.load_arrays(pendulum_dataset)[Col.OBS][:64], [], envs=None)
    assert policy.squashed and actions.shape == (64, 1) and np.abs(actions).max() <= 2.0


def test_bc_deterministic_fits_unit_actions_by_squared_error_and_acts_on_them(pendulum_dataset, tmp_path):
    from common.action_distributions import TorchTanhDeterministic

    card = dataset.read_card(pendulum_dataset)
    arrays = dataset.load_arrays(pendulum_dataset)
    params = dataclasses.replace(load_params("params.yaml").algos.bc, action_distribution=DETERMINISTIC,
                                 iterations=3, hidden_layers=[32, 32])
    with built_algorithm("bc", params, pendulum_dataset) as algorithm:
        learner = local_learner(algorithm)
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        assert module.get_train_action_dist_cls() is TorchTanhDeterministic
        batch = train_columns(algorithm, ROWS)
        # Pendulum's torque in [-2, 2], halved into [-1, 1] with no margin: the expert's full torques are +-1.
        unit = batch[ACTIONS].numpy()
        assert np.abs(unit).max() == 1.0
        assert (np.abs(2.0 * unit.ravel()[:, None] - arrays[Col.ACTIONS].ravel()).min(axis=1) < 1e-5).all()
        config = learner.config.get_config_for_module(DEFAULT_MODULE_ID)

        def loss() -> tuple[float, float]:
            """The learner's loss, and the squared error of tanh(mu) computed here."""
            with torch.no_grad():
                fwd_out = module.forward_train(batch)
                ours = learner.compute_loss_for_module(module_id=DEFAULT_MODULE_ID, config=config, batch=batch,
                                                       fwd_out=fwd_out)
                mu = fwd_out["action_dist_inputs"]
                assert mu.shape == batch[ACTIONS].shape  # no deviation among its outputs
                return ours.item(), (torch.tanh(mu) - batch[ACTIONS]).square().mean().item()

        before, expected = loss()
        assert before == pytest.approx(expected)
        for _ in range(params.iterations):
            algorithm.train()
        assert loss()[0] < before
        algorithm.save_to_path(tmp_path / "bc")
        with torch.no_grad():
            mu = module.forward_inference({OBS: torch.tensor(arrays[Col.OBS][:64])})["action_dist_inputs"].numpy()
    del algorithm
    gc.collect()

    module = load_rl_module(tmp_path / "bc")
    obs = arrays[Col.OBS][:64]
    greedy, _ = ModulePolicy(module, card.spaces[1], greedy=True).act(obs, [], envs=None)
    sampling = ModulePolicy(module, card.spaces[1], greedy=False)
    sampled, _ = sampling.act(obs, np.random.default_rng(0).spawn(64), envs=None)
    assert sampling.deterministic and np.array_equal(greedy, sampled)
    np.testing.assert_allclose(greedy, 2.0 * np.tanh(mu), rtol=1e-5, atol=1e-6)


def test_bc_gaussian_fits_the_logged_actions_as_they_are(pendulum_dataset):
    from ray.rllib.core.distribution.torch.torch_distribution import TorchDiagGaussian

    logged = dataset.load_arrays(pendulum_dataset)[Col.ACTIONS]
    params = dataclasses.replace(load_params("params.yaml").algos.bc, action_distribution=GAUSSIAN)
    with built_algorithm("bc", params, pendulum_dataset) as algorithm:
        module = local_learner(algorithm).module[DEFAULT_MODULE_ID].unwrapped()
        assert module.get_train_action_dist_cls() is TorchDiagGaussian
        actions = train_columns(algorithm, ROWS)[ACTIONS].numpy()
    assert np.isin(actions, logged).all() and np.abs(actions).max() == 2.0  # the torque bound itself


def test_bc_squashed_gaussian_leaves_discrete_actions_categorical(mixture_dataset):
    from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical

    params = dataclasses.replace(load_params("params.yaml").algos.bc, action_distribution=SQUASHED_GAUSSIAN)
    with built_algorithm("bc", params, mixture_dataset) as algorithm:
        module = local_learner(algorithm).module[DEFAULT_MODULE_ID].unwrapped()
        assert issubclass(module.get_train_action_dist_cls(), TorchCategorical)
        assert set(np.unique(train_columns(algorithm, ROWS)[ACTIONS].numpy())) <= {0, 1}
