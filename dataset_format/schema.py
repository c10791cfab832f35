"""Column names, spaces and the exact Arrow schema of a dataset; numpy <-> Arrow conversions.

This module is the only place that names columns. Columns use RLlib's names (`ray.rllib.core.columns.Columns`),
so stock RLlib reads a dataset as-is:

    eps_id  int64                          global episode index (also its seed index)
    t       int32                          step within the episode, 0-based
    obs     fixed_size_list<T>[d]          observation before the step, flattened: T is float32 for a Box of floats,
                                           else the Box's own dtype; the card has its shape.
            | fixed_size_list<dictionary<int32, binary>>[f]
                                           an image (a uint8 Box of 2 or more dimensions, since schema version 3):
                                           its f frames (`frame_count`), each a dictionary-encoded value of its bytes,
                                           so that a row group holds each distinct frame once
            | int64                        a Discrete observation (FrozenLake's cell, Taxi's state)
    actions int64 (Discrete) | fixed_size_list<float32>[k] (Box)
    rewards float32
    new_obs fixed_size_list<T>[d]          observation after the step
    terminateds, truncateds  bool
    action_logp float32                    log-prob of the action under the behaviour policy, where known
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pyarrow as pa

from common.errors import UserError

SCHEMA_VERSION = 3
"""Version 3 stores an image as its frames, dictionary-encoded; versions 2 (one binary value per image) and 1 (lists
of bytes) read still. Other columns are the same in all three."""


class Col:
    """Column names; equal to RLlib's `Columns` constants (a test checks it)."""

    EPS_ID = "eps_id"
    T = "t"
    OBS = "obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    NEW_OBS = "new_obs"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    ACTION_LOGP = "action_logp"


def _encode_bound(values: np.ndarray) -> list | float | str:
    """A Box bound for the card: one value per element, or the value alone where a space of several elements has
    one for all (an image's 0 and 255, not 28,224 of each). JSON has no infinity: unbounded dimensions are written
    as the strings "inf"/"-inf"."""
    flat = np.asarray(values).ravel()
    encoded = [float(v) if math.isfinite(v) else str(float(v)) for v in (flat[:1] if len(set(flat)) == 1 else flat)]
    return encoded[0] if len(flat) > 1 and len(encoded) == 1 else encoded


def require_storable(observation_space: gym.Space, action_space: gym.Space, what: str) -> None:
    """Refuses, in one line naming `what` and the space, spaces a dataset cannot hold: observations and actions
    must be a Box or a Discrete space starting at 0 (a Dict or Tuple observation is flattened into a Box by
    gymnasium's FlattenObservation wrapper)."""
    if not (isinstance(observation_space, gym.spaces.Box) or _discrete_from_0(observation_space)):
        raise UserError(f"{what}: observation space {observation_space} cannot be stored: datasets hold Box "
                        "observations or Discrete ones starting at 0; add the wrapper FlattenObservation to the env "
                        "spec (`wrappers: [FlattenObservation]`), which flattens Dict and Tuple ones into a Box")
    if not (isinstance(action_space, gym.spaces.Box) or _discrete_from_0(action_space)):
        raise UserError(f"{what}: action space {action_space} cannot be stored: datasets hold Box actions or "
                        "Discrete ones starting at 0 (MultiDiscrete: wrap the env to act on one Discrete space)")


def _discrete_from_0(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Discrete) and space.start == 0


def space_to_dict(space: gym.Space) -> dict:
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n)}
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": _encode_bound(space.low),
            "high": _encode_bound(space.high),
        }
    raise UserError(f"space {space} is not supported: only Box and Discrete spaces are")


def space_from_dict(data: dict) -> gym.Space:
    if data["type"] == "Discrete":
        return gym.spaces.Discrete(data["n"])
    shape = tuple(data["shape"])

    def bound(encoded) -> np.ndarray:
        values = [float(v) for v in encoded] if isinstance(encoded, list) else float(encoded)
        return np.broadcast_to(np.array(values, dtype=data["dtype"]), shape).copy()

    low, high = bound(data["low"]), bound(data["high"])
    return gym.spaces.Box(low, high, shape, dtype=data["dtype"])


def flat_dim(space: gym.spaces.Box) -> int:
    return int(np.prod(space.shape))


def observation_value_type(space: gym.spaces.Box) -> pa.DataType:
    """Floats are stored as float32, what learners read (MuJoCo's float64 would double the bytes for nothing they
    use); integers, pixels above all, at their own dtype."""
    return pa.float32() if np.issubdtype(space.dtype, np.floating) else pa.from_numpy_dtype(space.dtype)


def stored_as_bytes(space: gym.Space) -> bool:
    """Images (uint8 Boxes of 2 or more dimensions) are stored as binary values, each frame one (version 3; version 2
    stored the whole image as one): Parquet stores a list column value by value, a level beside each, which made
    writing and reading frames 10-30x slower than the same bytes as one value (benchmarks/throughput.md, "Frames as
    bytes")."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) >= 2


def frame_count(space: gym.spaces.Box) -> int:
    """How many frames an image is stored as: its planes along the first axis where that is its channel axis
    (shorter than the last, as common/observations.ModelInput reads it: FrameStackObservation's stacks of frames),
    else one, the whole image. A frame-stacked dataset repeats each frame in up to 8 observations (4 in `obs`, 4 in
    `new_obs`); stored as frames, a row group holds it once per column."""
    shape = space.shape
    return shape[0] if len(shape) >= 3 and shape[0] < shape[-1] else 1


def is_frames_type(arrow_type: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(arrow_type) and pa.types.is_dictionary(arrow_type.value_type)


def arrow_schema(observation_space: gym.Space, action_space: gym.Space, with_logp: bool,
                 schema_version: int = SCHEMA_VERSION) -> pa.Schema:
    """The exact Arrow schema of a dataset with these spaces, as `schema_version` writes it."""
    if isinstance(observation_space, gym.spaces.Discrete):
        obs_type = pa.int64()
    elif stored_as_bytes(observation_space) and schema_version >= 3:
        obs_type = pa.list_(pa.dictionary(pa.int32(), pa.binary()), frame_count(observation_space))
    elif stored_as_bytes(observation_space) and schema_version == 2:
        obs_type = pa.binary(flat_dim(observation_space))
    else:
        obs_type = pa.list_(observation_value_type(observation_space), flat_dim(observation_space))
    if isinstance(action_space, gym.spaces.Discrete):
        action_type = pa.int64()
    else:
        action_type = pa.list_(pa.float32(), flat_dim(action_space))
    fields = [
        pa.field(Col.EPS_ID, pa.int64(), nullable=False),
        pa.field(Col.T, pa.int32(), nullable=False),
        pa.field(Col.OBS, obs_type, nullable=False),
        pa.field(Col.ACTIONS, action_type, nullable=False),
        pa.field(Col.REWARDS, pa.float32(), nullable=False),
        pa.field(Col.NEW_OBS, obs_type, nullable=False),
        pa.field(Col.TERMINATEDS, pa.bool_(), nullable=False),
        pa.field(Col.TRUNCATEDS, pa.bool_(), nullable=False),
    ]
    if with_logp:
        fields.append(pa.field(Col.ACTION_LOGP, pa.float32(), nullable=False))
    return pa.schema(fields)


@dataclass(frozen=True)
class FrameColumn:
    """A column of images held once per distinct frame: collectors record them so, and `transitions_table` stores
    them as they are, where a column of whole images is split into frames and numbered first."""

    frames: np.ndarray
    """(distinct frames, bytes per frame) uint8."""
    ids: np.ndarray
    """(rows, frames per image) int32: each image's frames, rows of `frames`."""

    @classmethod
    def of_images(cls, images: np.ndarray, count: int) -> FrameColumn:
        planes = np.ascontiguousarray(images, dtype=np.uint8).reshape(len(images), count, -1)
        numbering = FrameNumbering()
        ids = numbering.ids(planes)
        return cls(numbering.array(planes.shape[2:], np.uint8), ids)

    def to_arrow(self) -> pa.FixedSizeListArray:
        frames = np.ascontiguousarray(self.frames, dtype=np.uint8).reshape(len(self.frames), -1)
        if frames.size >= 2**31:  # a binary array's int32 offsets; a row group's frames are far fewer
            raise ValueError(f"{frames.size} bytes of distinct frames exceed one Arrow binary array's 2 GiB")
        offsets = np.arange(len(frames) + 1, dtype=np.int32) * np.int32(frames.shape[1])
        dictionary = pa.BinaryArray.from_buffers(pa.binary(), len(frames),
                                                 [None, pa.py_buffer(offsets), pa.py_buffer(frames)])
        indices = pa.array(np.ascontiguousarray(self.ids, dtype=np.int32).ravel())
        return pa.FixedSizeListArray.from_arrays(pa.DictionaryArray.from_arrays(indices, dictionary),
                                                 self.ids.shape[1])

    @classmethod
    def of_arrow(cls, array: pa.FixedSizeListArray) -> FrameColumn:
        """The rows of one array of a frames column (no copy of the frames)."""
        values = array.flatten()  # the rows' frames as a DictionaryArray, within the array's offset and length
        dictionary = values.dictionary
        ids = values.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        ids = ids.reshape(len(array), array.type.list_size)
        if len(dictionary) == 0:
            return cls(np.empty((0, 0), np.uint8), ids)
        offsets = np.frombuffer(dictionary.buffers()[1], np.int32, len(dictionary) + 1, dictionary.offset * 4)
        widths = np.diff(offsets)
        if (widths != widths[0]).any():
            raise ValueError(f"a column of frames holds frames of {widths.min()} to {widths.max()} bytes")
        data = np.frombuffer(dictionary.buffers()[2], np.uint8, offsets[-1] - offsets[0], offsets[0])
        return cls(data.reshape(len(dictionary), int(widths[0])), ids)

    def used(self) -> FrameColumn:
        """The same rows, their frames only: a slice of a column holds its whole dictionary."""
        used, inverse = np.unique(self.ids.ravel(), return_inverse=True)
        return FrameColumn(self.frames[used], inverse.reshape(self.ids.shape).astype(np.int32))

    def numbered(self, numbering: FrameNumbering) -> np.ndarray:
        """The rows' frame ids in `numbering`, which numbers the frames it has not seen yet."""
        return numbering.ids(self.frames[None])[0][self.ids]

    def images(self) -> np.ndarray:
        """(rows, bytes per image): every image's frames joined, as the image's flattened bytes."""
        return self.frames[self.ids].reshape(len(self.ids), self.ids.shape[1] * self.frames.shape[1])


class FrameNumbering:
    """Distinct frames by their bytes, each numbered once."""

    def __init__(self):
        self.numbers: dict[bytes, int] = {}

    def ids(self, planes: np.ndarray) -> np.ndarray:
        """(rows, channels) numbers of the planes of (rows, channels, *frame shape), new ones numbered next."""
        numbers = self.numbers
        flat = planes.reshape(-1, *planes.shape[2:])
        return np.fromiter((numbers.setdefault(plane.tobytes(), len(numbers)) for plane in flat), np.int32,
                           len(flat)).reshape(planes.shape[:2])

    def array(self, frame_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Every frame in number order (dicts keep insertion order); the bytes held so far are let go."""
        joined, self.numbers = b"".join(self.numbers), {}
        return np.frombuffer(joined, dtype).reshape(-1, *frame_shape)


def _tensor_column(values: np.ndarray | FrameColumn, arrow_type: pa.DataType) -> pa.Array:
    if is_frames_type(arrow_type):
        frames = values if isinstance(values, FrameColumn) else FrameColumn.of_images(values, arrow_type.list_size)
        return frames.to_arrow()
    if pa.types.is_fixed_size_binary(arrow_type):
        flat = np.ascontiguousarray(values, dtype=np.uint8)
        return pa.FixedSizeBinaryArray.from_buffers(arrow_type, len(flat), [None, pa.py_buffer(flat)])
    if pa.types.is_fixed_size_list(arrow_type):
        flat = np.ascontiguousarray(values, dtype=arrow_type.value_type.to_pandas_dtype()).reshape(len(values), -1)
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1])
    return pa.array(values, type=arrow_type)


def transitions_table(columns: dict[str, np.ndarray | FrameColumn], schema: pa.Schema) -> pa.Table:
    """Builds one Arrow table from numpy columns (one row per transition; images whole or as a FrameColumn), in
    schema order."""
    return pa.Table.from_arrays(
        [_tensor_column(columns[f.name], f.type) for f in schema], schema=schema
    )


def column_to_numpy(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A column as numpy; fixed-size-list, fixed-size-binary and frames (uint8) columns become 2-D arrays without
    per-row Python."""
    if is_frames_type(column.type):  # chunk by chunk: each has its own dictionary
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        images = [FrameColumn.of_arrow(chunk).images() for chunk in chunks]
        if len(images) == 1:
            return images[0]
        return np.concatenate(images) if images else np.empty((0, 0), np.uint8)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_fixed_size_binary(column.type):
        width = column.type.byte_width
        return np.frombuffer(column.buffers()[1], np.uint8, len(column) * width, column.offset * width).reshape(
            len(column), width)
    if pa.types.is_fixed_size_list(column.type):
        return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), column.type.list_size)
    return column.to_numpy(zero_copy_only=False)
