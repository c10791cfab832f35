"""How a policy network sees a dataset's observations, given the space they are stored in.

Vectors go in as they are, as float32. A Discrete observation (stored as its integer) goes in one-hot. Images (a
Box of three axes) go in channels-last, as RLlib's CNN encoders take them, and in [0, 1] when they are integers
(uint8 pixels, divided by 255). Gymnasium's FrameStackObservation
stacks frames on the first axis, so a (4, 84, 84) stack is channels-first: RLlib would read it as 4 rows of 84
columns of 84 channels and build a network that runs, but on the wrong axes (docs/environments.md). The layout
is read from the shape by one rule, with no guessing: the channel axis is the first or the last, whichever is
shorter, and a shape where they tie is refused.

Training maps its batches through `ModelInput`, and the module's checkpoint records it (`MODEL_INPUT_KEY` in its
model config), so a loaded policy turns raw observations from an env, a dataset or an MLflow request into its input
the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from common.errors import UserError

# The key of a module's model config that holds its `ModelInput`, as a dict (modules on vectors have none).
MODEL_INPUT_KEY = "orl_model_input"


@dataclass(frozen=True)
class ModelInput:
    """The map from stored observations (flat rows, or batches of the stored shape) to the network's input."""

    shape: tuple[int, ...]
    """The stored observation shape."""
    channels_first: bool = False
    """For images: the channel axis is the first (moved last for the network)."""
    scale: float = 1.0
    """Multiplies the values: 1/255 for integer images."""
    one_hot: int = 0
    """For a Discrete observation: its number of values, the width of the one-hot vector."""
    mean: tuple[float, ...] = ()
    """For vectors normalized (`orl train-online`'s `normalize_observations`): subtracted from each observation."""
    std: tuple[float, ...] = ()
    """With `mean`: each dimension, less its mean, is divided by this."""

    @classmethod
    def of_module(cls, module) -> ModelInput | None:
        """The map a trained RLModule's checkpoint records; None for a module on vectors taken as they are."""
        recorded = (module.model_config or {}).get(MODEL_INPUT_KEY)
        if not recorded:
            return None
        return cls(**{**recorded, **{key: tuple(recorded.get(key, ())) for key in ("shape", "mean", "std")}})

    @classmethod
    def normalizing(cls, observations: np.ndarray) -> ModelInput:
        """Vectors shifted and scaled by the mean and standard deviation of these (rows of) observations; a dimension
        they hold constant is left unscaled."""
        rows = np.asarray(observations, dtype=np.float64).reshape(len(observations), -1)
        std = rows.std(axis=0)
        return cls(tuple(np.shape(observations)[1:]), mean=tuple(rows.mean(axis=0).tolist()),
                   std=tuple(np.where(std > 1e-6, std, 1.0).tolist()))

    @classmethod
    def of(cls, space: gym.Space) -> ModelInput:
        if isinstance(space, gym.spaces.Discrete):
            return cls((), one_hot=int(space.n))
        if not is_image(space):
            return cls(tuple(space.shape))
        first, last = space.shape[0], space.shape[-1]
        if first == last:
            raise UserError(f"observation space {space}: its first and last axes are both {first} long, so which one "
                            "holds the channels is unclear; reshape it with a wrapper (e.g. ReshapeObservation)")
        integers = np.issubdtype(space.dtype, np.integer)
        return cls(tuple(space.shape), channels_first=first < last, scale=1 / 255 if integers else 1.0)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one row of the network's input."""
        if self.one_hot:
            return (self.one_hot,)
        return self.shape[1:] + self.shape[:1] if self.channels_first else self.shape

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """A batch of observations (flat rows or the stored shape) as the network's float32 input."""
        if self.one_hot:
            return np.eye(self.one_hot, dtype=np.float32)[np.asarray(obs).reshape(len(obs)).astype(np.int64)]
        batch = np.asarray(obs, dtype=np.float32).reshape(len(obs), *self.shape)
        if self.channels_first:
            batch = np.moveaxis(batch, 1, -1)
        if self.scale != 1.0:
            batch = batch * np.float32(self.scale)
        if self.mean:
            flat = batch.reshape(len(batch), -1)
            mean, std = np.asarray(self.mean, np.float32), np.asarray(self.std, np.float32)
            batch = ((flat - mean) / std).reshape(batch.shape)
        return np.ascontiguousarray(batch)

    def on_tensor(self, images):
        """`self(images)` for a torch tensor of stored images, computed where the tensor is: training copies frames
        to a GPU as uint8, a quarter of the bytes of the float32 input, and maps them there."""
        if len(self.shape) != 3:
            raise ValueError(f"on_tensor maps images; this input is {self}")
        batch = images.reshape(len(images), *self.shape).float()
        if self.channels_first:
            batch = batch.movedim(1, -1)
        if self.scale != 1.0:
            batch = batch * float(np.float32(self.scale))  # the float32 factor `__call__` multiplies by
        return batch.contiguous()


def model_space(space: gym.Space, model_input: ModelInput | None = None) -> gym.Space:
    """The observation space the network is built for: a vector space as it is, or unbounded where `model_input`
    normalizes it; a Discrete one's one-hot vector; an image's channels-last, in [0, 1] for integer pixels."""
    if model_input is not None and model_input.mean:
        return gym.spaces.Box(-np.inf, np.inf, space.shape, np.float32)
    if isinstance(space, gym.spaces.Discrete):
        return gym.spaces.Box(0.0, 1.0, (int(space.n),), np.float32)
    if not is_image(space):
        return space
    layout = ModelInput.of(space)
    low, high = (0.0, 1.0) if layout.scale != 1.0 else (-np.inf, np.inf)
    return gym.spaces.Box(low, high, layout.input_shape, np.float32)


def is_mapped(space: gym.Space) -> bool:
    """Whether the network takes observations of this space otherwise than as their stored rows."""
    return isinstance(space, gym.spaces.Discrete) or is_image(space)


def is_image(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3
