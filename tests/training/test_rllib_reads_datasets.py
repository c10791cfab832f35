"""Stock RLlib reads a collected dataset directory as it is, with no conversion."""

from __future__ import annotations

import gc
import math

import dataset_format as dataset


def test_stock_bc_trains_on_the_dataset_directory(expert_dataset, ray_local):
    from ray.rllib.algorithms.bc import BCConfig

    observation_space, action_space = dataset.read_card(expert_dataset).spaces
    config = (
        BCConfig()
        .environment(observation_space=observation_space, action_space=action_space)
        .offline_data(input_=[str(expert_dataset)], dataset_num_iters_per_learner=2,
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
