"""Stock RLlib reads a collected dataset as it is, with no conversion: a directory, or an s3:// URI."""

from __future__ import annotations

import gc
import math

import pytest

import dataset_format as dataset
from tests.conftest import upload


@pytest.mark.slow  # stock RLlib BC through Ray Data, from a directory and from a server
@pytest.mark.parametrize("where", ["directory", "s3"])
def test_stock_bc_trains_on_the_dataset(expert_dataset, ray_local, request, where):
    from ray.rllib.algorithms.bc import BCConfig

    path = str(expert_dataset) if where == "directory" else upload(expert_dataset, request.getfixturevalue("bucket"),
                                                                    "data/cartpole-expert")
    observation_space, action_space = dataset.read_card(path).spaces
    config = (
        BCConfig()
        .environment(observation_space=observation_space, action_space=action_space)
        .offline_data(input_=[path], dataset_num_iters_per_learner=2,
                      map_batches_kwargs={"concurrency": 1, "num_cpus": 1})  # 2-CPU machine, see FIELD_NOTES
        .learners(num_learners=0)
    )
    algo = config.build_algo()
    try:
        stats = algo.train()["learners"]["default_policy"]
        assert math.isfinite(stats["policy_loss"]) and stats["num_module_steps_trained"] > 0
    finally:
        algo.stop()
        del algo
        gc.collect()  # closes RLlib's dataset iterators while Ray is still up
