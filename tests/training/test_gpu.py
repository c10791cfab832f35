"""On a machine with a GPU: `num_gpus_per_learner` trains the CNN learners there, and their checkpoints act on a
machine without one. Skipped where torch sees no GPU (CI); run on one with `pytest tests/training/test_gpu.py`."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

import dataset_format as dataset
from common.trained_policy import ModulePolicy
from dataset_format import Col
from pipelines.params import load_params
from tests.conftest import REPO, write_frame_stacks
from training.algorithms.registry import rllib_config
from training.algorithms.rllib_internals import local_learner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU here")

# In a process that sees no GPU: the checkpoint's module, loaded as evaluation loads it, on the first rows' frames.
ON_THE_CPU = """
import json, sys
import torch
import dataset_format as dataset
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
import gymnasium as gym
assert not torch.cuda.is_available()
module = load_rl_module(sys.argv[1])
obs = dataset.load_arrays(sys.argv[2])[Col.OBS][:8]
print(json.dumps(ModulePolicy(module, gym.spaces.Discrete(3), greedy=True).distribution_inputs(obs).tolist()))
"""


@pytest.mark.parametrize("algo", ["bc", "dqn"])
def test_a_cnn_learner_trains_on_the_gpu_and_its_checkpoint_acts_without_one(algo, tmp_path, ray_local):
    frames = write_frame_stacks(tmp_path / "frames", frame_shape=(84, 84), episodes=4, length=40)
    params = dataclasses.replace(getattr(load_params(REPO / "params.yaml").algos, algo), num_gpus_per_learner=1,
                                 iterations=2, updates_per_iteration=3, batch_size=32)
    algorithm = rllib_config(algo, params, frames, seed=0).build_algo()
    try:
        module = local_learner(algorithm).module[DEFAULT_MODULE_ID]
        assert {p.device.type for p in module.parameters()} == {"cuda"}
        before = copy.deepcopy(module).cpu()
        for _ in range(params.iterations):
            algorithm.train()
        trained = copy.deepcopy(module).cpu()
        algorithm.save_to_path(tmp_path / "checkpoint")
    finally:
        algorithm.stop()

    obs = dataset.load_arrays(frames)[Col.OBS][:8]
    on_gpu, untrained = (ModulePolicy(m, gym.spaces.Discrete(3), greedy=True).distribution_inputs(obs)
                         for m in (trained, before))
    assert not np.allclose(on_gpu, untrained)  # the updates ran
    result = subprocess.run([sys.executable, "-c", ON_THE_CPU, str(tmp_path / "checkpoint"), str(frames)],
                            cwd=REPO, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    np.testing.assert_allclose(json.loads(result.stdout.splitlines()[-1]), on_gpu, rtol=1e-4, atol=1e-5)


def test_held_frames_are_gathered_on_the_gpu_into_the_batches_the_cpu_gives(tmp_path):
    """A dataset held in memory moves to the learner's GPU once, and each batch is gathered there: the same rows, in
    the same order, as on the CPU."""
    frames = write_frame_stacks(tmp_path / "frames", frame_shape=(84, 84), episodes=4, length=40)
    params = load_params(REPO / "params.yaml").algos.bc
    config = rllib_config("bc", params, frames, seed=0)
    on_cpu, on_gpu = (config.offline_data_class(config).sample(num_samples=0, return_iterator=True)[0]
                      .iter_torch_batches(batch_size=16, device=device) for device in ("cpu", "cuda"))
    assert on_gpu.frames.frames.device.type == "cuda"
    for cpu_batch, gpu_batch in zip(on_cpu, on_gpu, strict=True):
        assert {values.device.type for values in gpu_batch.values()} == {"cuda"}
        for name, values in cpu_batch.items():
            torch.testing.assert_close(gpu_batch[name].cpu(), values, rtol=0, atol=0)
