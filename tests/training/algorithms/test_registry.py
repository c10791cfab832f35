"""rllib_config: what a learner asks of the machine is checked before RLlib builds anything, and the networks it
asks RLlib for."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from common.errors import UserError
from pipelines.params import load_params
from tests.conftest import write_frame_stacks
from training.algorithms.registry import rllib_config
from training.config import BCParams


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpus_that_are_not_there_are_refused_in_one_line(mixture_dataset, ray_local):
    params = dataclasses.replace(load_params("params.yaml").algos.bc, num_gpus_per_learner=1)
    with pytest.raises(UserError, match=r"^algos\.bc\.num_gpus_per_learner is 1 \(num_learners 0\): training needs 1 "
                                        r"GPU, and torch sees 0 in this process; set it to 0 to train on the CPU$"):
        rllib_config("bc", params, mixture_dataset, seed=0)
    actors = dataclasses.replace(params, num_learners=2, num_gpus_per_learner=0.5)
    with pytest.raises(UserError, match=r"needs 1 GPU, and Ray's cluster has 0;"):
        rllib_config("bc", actors, mixture_dataset, seed=0)


def test_the_cpu_is_the_default_and_a_gpu_share_is_passed_to_rllib(mixture_dataset, monkeypatch):
    params = load_params("params.yaml").algos.bc
    assert params.num_gpus_per_learner == 0
    assert rllib_config("bc", params, mixture_dataset, seed=0).num_gpus_per_learner == 0
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # as on a machine with one GPU
    gpu = dataclasses.replace(params, num_gpus_per_learner=1)
    assert rllib_config("bc", gpu, mixture_dataset, seed=0).num_gpus_per_learner == 1


def test_a_negative_gpu_share_is_refused():
    with pytest.raises(ValueError, match="num_gpus_per_learner must be >= 0, got -1"):
        BCParams(num_gpus_per_learner=-1)


@pytest.mark.parametrize("algo, heads", [("bc", 1), ("dqn", 2)])  # DQN's dueling heads: advantages and value
def test_over_frames_each_head_has_the_hidden_layers_after_the_cnn(tmp_path, algo, heads):
    """As the Nature DQN's 512 units: RLlib's own heads would map every feature of the last convolution straight to
    the outputs."""
    frames = write_frame_stacks(tmp_path / "frames", frame_shape=(84, 84))
    params = dataclasses.replace(getattr(load_params("params.yaml").algos, algo), hidden_layers=[512])
    module = rllib_config(algo, params, frames, seed=0).get_rl_module_spec().build()
    linear = {name: tuple(m.weight.shape) for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
    features = 64 * 11 * 11  # the Nature DQN's convolutions over 84x84 with RLlib's "same" padding
    assert sum(shape == (512, features) for shape in linear.values()) == heads
    for name, shape in linear.items():
        assert shape in {(512, features), (1, 512), (3, 512)}, name


def test_a_stream_of_frames_shuffles_within_the_learners_memory_budget(tmp_path, mixture_dataset):
    """50,000 rows of 4-frame 84x84 stacks would hold 2.8 GB twice over (the buffer, and the chunk read ahead)."""
    frames = write_frame_stacks(tmp_path / "frames", frame_shape=(84, 84))
    params = load_params("params.yaml").algos.bc
    row = 2 * 4 * 84 * 84  # an observation and a next observation, uint8 as stored
    assert rllib_config("bc", params, frames, seed=0).iter_batches_kwargs["local_shuffle_buffer_size"] == \
        params.memory_cache_mib * 2**20 // (2 * row)
    tiny = dataclasses.replace(params, memory_cache_mib=0)
    assert rllib_config("bc", tiny, frames, seed=0).iter_batches_kwargs["local_shuffle_buffer_size"] == \
        params.batch_size
    vectors = rllib_config("bc", params, mixture_dataset, seed=0).iter_batches_kwargs
    assert vectors["local_shuffle_buffer_size"] == params.shuffle_buffer
