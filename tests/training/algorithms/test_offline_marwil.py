"""MARWIL's advantage normalizer starts at the data's scale, not RLlib's fixed 100; BC's loss is RLlib's MARWIL
loss at beta = 0."""

from __future__ import annotations

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from pipelines.params import load_params
from tests.conftest import built_algorithm, train_columns
from training.algorithms.batch_columns import OBS, VALUE_TARGETS
from training.algorithms.rllib_internals import local_learner

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
        norm = learner.moving_avg_sqd_adv_norms_per_module[DEFAULT_MODULE_ID]
        torch.testing.assert_close(norm, expected)
        assert not torch.isclose(norm, torch.tensor(algorithm.config.moving_average_sqd_adv_norm_start), rtol=0.5)


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
