"""Image observations held in memory once per distinct frame, for readers that hold a whole dataset.

A transition holds a 4-frame stack (Gymnasium's FrameStackObservation) in `obs`, and again, shifted by a frame, in
`new_obs`. On disk a row group holds each distinct frame once a column (schema version 3; earlier versions store
every stack whole, and zstd finds the repeats); read as arrays, a transition holds eight frames, and as the float32 a
network takes, 32 times one frame's uint8 bytes. `read_frames` reads the rows a row group at a time (about 32 MiB of
stacks, as collected) and keeps each distinct frame once: about one frame per transition, plus the stack's first
frames at each episode's start. Observations become ids into a `FrameStore`, which rebuilds them, batch by batch, as
the env gave them.

A frame is a plane of the image along its channel axis (the first or the last, `common/observations.ModelInput`'s
rule); images whose planes never repeat (RGB, say) are held at their own size, plus 4 bytes per plane of index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dataset_format.card import read_card
from dataset_format.location import locate, storage_errors
from dataset_format.readers import DatasetPath
from dataset_format.schema import Col, FrameColumn, FrameNumbering, column_to_numpy, is_frames_type
from dataset_format.validation import validate

OBSERVATION_COLUMNS = (Col.OBS, Col.NEW_OBS)


@dataclass(frozen=True)
class FrameStore:
    """Observations as ids: each one's frames, in order along the channel axis, are rows of `frames`."""

    frames: np.ndarray
    """(distinct frames, *frame shape), the dataset's dtype."""
    stacks: np.ndarray
    """(observations, channels) int32: the frames of each observation id."""
    channels_first: bool
    """The channel axis is the observation's first (else its last)."""

    def __getitem__(self, ids) -> np.ndarray:
        """The observations of `ids`, at the shape the dataset stores."""
        stacked = self.frames[self.stacks[np.asarray(ids)]]
        return stacked if self.channels_first else np.ascontiguousarray(np.moveaxis(stacked, 1, -1))

    @property
    def nbytes(self) -> int:
        return self.frames.nbytes + self.stacks.nbytes


@dataclass(frozen=True)
class StackedObservations:
    """A column of observations as ids into a FrameStore, read as an array of them: `obs[rows]` rebuilds those rows
    (a slice, or an array of row numbers), `len(obs)` counts them."""

    store: FrameStore
    ids: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, rows) -> np.ndarray:
        return self.store[self.ids[rows]]

    def take(self, rows: np.ndarray) -> StackedObservations:
        """These rows, still as ids."""
        return StackedObservations(self.store, self.ids[rows])


def load_frame_arrays(path: DatasetPath, channels_first: bool) -> dict[str, np.ndarray | StackedObservations]:
    """`load_arrays` for image observations: the whole validated dataset, `obs` and `new_obs` held once per distinct
    frame as StackedObservations."""
    validate(path)
    store, table = read_frames(path, channels_first)
    arrays = {name: column_to_numpy(table[name]) for name in table.column_names}
    return arrays | {name: StackedObservations(store, arrays[name]) for name in OBSERVATION_COLUMNS}


def read_frames(path: DatasetPath, channels_first: bool) -> tuple[FrameStore, pa.Table]:
    """The whole dataset (read without checks, as `read_table`) with `obs` and `new_obs` as int64 ids into the
    returned store. Row functions that only select or reorder rows (training's batch columns) work on the ids."""
    location = locate(path)
    card = read_card(location)
    space, names = card.spaces[0], card.schema().names
    shape = space.shape
    frame_shape = shape[1:] if channels_first else shape[:-1]
    frames, stacks, tables, next_id = FrameNumbering(), [], [], 0
    with storage_errors(location):
        for entry in card.files:
            parquet = pq.ParquetFile(location.path(entry["path"]), filesystem=location.fs)
            for group in range(parquet.num_row_groups):
                table = parquet.read_row_group(group).select(names)
                for name in OBSERVATION_COLUMNS:
                    stacks.append(_stack_ids(frames, table[name], shape, channels_first))
                    ids = pa.array(np.arange(next_id, next_id + len(table)), pa.int64())
                    table = table.set_column(table.schema.get_field_index(name), name, ids)
                    next_id += len(table)
                tables.append(table)
    store = FrameStore(frames.array(frame_shape, space.dtype), np.concatenate(stacks), channels_first)
    return store, pa.concat_tables(tables)


def _stack_ids(frames: FrameNumbering, column: pa.ChunkedArray, shape: tuple[int, ...],
               channels_first: bool) -> np.ndarray:
    """(rows, channels) numbers in `frames` of each observation's planes."""
    if channels_first and is_frames_type(column.type) and column.type.list_size == shape[0]:
        # Stored as these planes, each distinct one once: only those are numbered, not every observation's.
        return np.concatenate([FrameColumn.of_arrow(chunk).numbered(frames) for chunk in column.chunks])
    observations = column_to_numpy(column).reshape(len(column), *shape)
    return frames.ids(observations if channels_first else np.moveaxis(observations, -1, 1))

