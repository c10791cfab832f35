"""How networks see observations: vectors as float32, images channels-last in [0, 1], the layout read by one rule."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

from common.errors import UserError
from common.observations import MODEL_INPUT_KEY, ModelInput, is_image, is_mapped, model_space

FRAME_STACK = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)  # FrameStackObservation: frames on the first axis
RGB = gym.spaces.Box(0, 255, (64, 48, 3), np.uint8)  # channels-last already


def test_a_channels_first_stack_goes_in_channels_last_and_scaled():
    images = ModelInput.of(FRAME_STACK)
    assert images.channels_first and images.scale == pytest.approx(1 / 255)
    frames = np.random.default_rng(0).integers(0, 256, (2, 4, 84, 84), dtype=np.uint8)
    for given in (frames, frames.reshape(2, -1)):  # as the env gives them, or flat as a dataset stores them
        out = images(given)
        assert out.shape == (2, 84, 84, 4) and out.dtype == np.float32
        # Pixel (row 10, column 20) of frame 3 of the second stack is at [1, 10, 20, 3].
        assert out[1, 10, 20, 3] == pytest.approx(frames[1, 3, 10, 20] / 255)
    assert model_space(FRAME_STACK) == gym.spaces.Box(0.0, 1.0, (84, 84, 4), np.float32)


def test_a_channels_last_image_keeps_its_axes():
    images = ModelInput.of(RGB)
    assert not images.channels_first
    pixels = np.full((1, 64, 48, 3), 255, dtype=np.uint8)
    np.testing.assert_array_equal(images(pixels), np.ones((1, 64, 48, 3), dtype=np.float32))
    assert model_space(RGB).shape == (64, 48, 3)


def test_an_image_whose_first_and_last_axes_tie_is_refused():
    with pytest.raises(UserError, match=r"first and last axes are both 3 long.*ReshapeObservation"):
        ModelInput.of(gym.spaces.Box(0, 255, (3, 32, 3), np.uint8))


def test_vectors_go_in_as_float32_rows_and_keep_their_space():
    space = gym.spaces.Box(-1.0, 1.0, (5,), np.float64)
    assert not is_image(space) and model_space(space) is space
    out = ModelInput.of(space)(np.ones((3, 5), dtype=np.float64))
    assert out.dtype == np.float32 and out.shape == (3, 5)


def test_a_module_recording_its_input_map_gives_it_back():
    images = ModelInput.of(FRAME_STACK)
    module = SimpleNamespace(model_config={MODEL_INPUT_KEY: dataclasses.asdict(images)})
    assert ModelInput.of_module(module) == images
    assert ModelInput.of_module(SimpleNamespace(model_config={"fcnet_hiddens": [8]})) is None


def test_vectors_normalized_by_a_sample_and_recorded_as_lists_come_back_the_same():
    rng = np.random.default_rng(0)
    sample = np.c_[rng.normal(3.0, 10.0, 1000), rng.normal(-1.0, 0.1, 1000), np.full(1000, 7.0)]
    normalized = ModelInput.normalizing(sample)
    out = normalized(sample)
    assert out.dtype == np.float32 and out.shape == (1000, 3)
    np.testing.assert_allclose(out[:, :2].mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(out[:, :2].std(axis=0), 1.0, atol=1e-5)
    np.testing.assert_array_equal(out[:, 2], 0.0)  # constant in the sample: shifted, not scaled
    assert normalized.std[2] == 1.0
    space = gym.spaces.Box(-1.0, 1.0, (3,), np.float64)
    assert model_space(space, normalized) == gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    # A checkpoint may give its model config back with lists where the map had tuples.
    recorded = {key: list(value) if isinstance(value, tuple) else value
                for key, value in dataclasses.asdict(normalized).items()}
    assert ModelInput.of_module(SimpleNamespace(model_config={MODEL_INPUT_KEY: recorded})) == normalized


def test_a_discrete_observation_goes_in_one_hot():
    space = gym.spaces.Discrete(5)
    assert is_mapped(space) and not is_image(space)
    out = ModelInput.of(space)(np.array([0, 3, 4]))
    np.testing.assert_array_equal(out, np.eye(5, dtype=np.float32)[[0, 3, 4]])
    assert model_space(space) == gym.spaces.Box(0.0, 1.0, (5,), np.float32)


@pytest.mark.parametrize("shape", [(4, 12, 10), (12, 10, 3)])
def test_images_mapped_as_torch_tensors_equal_the_numpy_map_to_the_bit(shape):
    import torch

    layout = ModelInput.of(gym.spaces.Box(0, 255, shape, np.uint8))
    stored = np.random.default_rng(0).integers(0, 256, (5, int(np.prod(shape))), dtype=np.uint8)
    on_tensor = layout.on_tensor(torch.from_numpy(stored))
    assert on_tensor.dtype == torch.float32 and on_tensor.is_contiguous()
    np.testing.assert_array_equal(on_tensor.numpy(), layout(stored))
