"""MARWIL's advantage normalizer starts at the data's scale, not RLlib's fixed 100."""

from __future__ import annotations

import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from pipelines.params import load_params
from tests.conftest import built_algorithm, train_columns
from training.batch_columns import LOSS_MASK, OBS, VALUE_TARGETS

ROWS = 256


def test_first_update_sets_the_squared_advantage_norm_from_its_batch(mixture_dataset, ray_local):
    with built_algorithm("marwil", load_params("params.yaml").algos.marwil, mixture_dataset) as algorithm:
        learner = algorithm.learner_group._learner
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        columns = train_columns(algorithm, ROWS)
        assert columns[LOSS_MASK].all()  # the test data's episodes are whole
        with torch.no_grad():  # what the initial value function leaves to explain (no episode hits the time limit)
            expected = (columns[VALUE_TARGETS] - module.compute_values({OBS: columns[OBS]})).square().mean()

        learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=ROWS),
                       timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 0})

        # One update moves the running mean towards its own batch's value, which it started at.
        norm = learner.moving_avg_sqd_adv_norms_per_module[DEFAULT_MODULE_ID]
        torch.testing.assert_close(norm, expected)
        assert not torch.isclose(norm, torch.tensor(algorithm.config.moving_average_sqd_adv_norm_start), rtol=0.5)
