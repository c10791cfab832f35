"""Reading a dataset (a local directory or an s3:// prefix), for training and for users: Arrow, numpy, pandas, Ray
Data and torch."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dataset_format.card import DatasetCard, read_card
from dataset_format.location import Location, locate, storage_errors
from dataset_format.schema import Col, column_to_numpy
from dataset_format.validation import open_parquet, validate, validated_tables

DatasetPath = str | os.PathLike | Location  # a local directory or an s3:// prefix


def size_on_disk(path: DatasetPath, card: DatasetCard | None = None) -> int:
    """Bytes of the dataset's Parquet files (those its card lists: pass `card` if it is read already)."""
    location = locate(path)
    return sum(location.size(f["path"]) for f in (card or read_card(location)).files)


def load_table(path: DatasetPath) -> pa.Table:
    """The whole dataset as one Arrow table, each file read once and validated on the way."""
    return _one_table(*validated_tables(path))


def read_table(path: DatasetPath, columns: tuple[str, ...] | None = None) -> pa.Table:
    """The whole dataset as one Arrow table (of `columns` only, if given), read without checks: for callers that
    validated it already (`orl train` does before training, so checking again would only add to its start-up)."""
    location = locate(path)
    card = read_card(location)
    with storage_errors(location):
        return _one_table(card, [pq.read_table(location.path(entry["path"]), filesystem=location.fs,
                                                  columns=columns and list(columns))
                                 for entry in card.files], columns)


def _one_table(card: DatasetCard, tables, columns: tuple[str, ...] | None = None) -> pa.Table:
    names = columns or card.schema().names  # files may order their columns differently
    return pa.concat_tables([table.select(names) for table in tables])


@dataclass(frozen=True)
class RowGroups:
    """Consecutive row groups of one of the dataset's files: what a streaming reader reads at once."""

    file: str
    """The file's name in the dataset."""
    groups: tuple[int, ...]
    rows: int
    bytes: int
    """Their size decoded, as Parquet's metadata gives it."""


def row_group_runs(path: DatasetPath, min_rows: int | None = None) -> list[RowGroups]:
    """The dataset's row groups in file order, gathered into runs of consecutive groups of one file with at least
    `min_rows` rows (a file's last run may have fewer; None: one group each). Only the files' footers are read."""
    location = locate(path)
    runs = []
    for entry in read_card(location).files:
        with open_parquet(location, entry["path"]) as parquet:
            metadata = parquet.metadata
        groups, rows, size = [], 0, 0
        for group in range(metadata.num_row_groups):
            groups.append(group)
            rows += metadata.row_group(group).num_rows
            size += metadata.row_group(group).total_byte_size
            if rows >= (min_rows or 1) or group == metadata.num_row_groups - 1:
                runs.append(RowGroups(entry["path"], tuple(groups), rows, size))
                groups, rows, size = [], 0, 0
    return runs


def read_row_groups(path: DatasetPath, run: RowGroups, columns: tuple[str, ...] | None = None) -> pa.Table:
    """The rows of `run` (of `columns` only, if given), read without checks, as `read_table`. Group by group: pyarrow
    refuses to read a column of frames, each group's with its own dictionary, across groups at once."""
    location = locate(path)
    with open_parquet(location, run.file) as parquet:
        return pa.concat_tables([parquet.read_row_group(group, columns=columns and list(columns))
                                 for group in run.groups])


def load_arrays(path: DatasetPath) -> dict[str, np.ndarray]:
    """The whole validated dataset in memory as numpy arrays: obs is (N, d), actions (N,) or (N, k)."""
    table = load_table(path)
    return {name: column_to_numpy(table[name]) for name in table.column_names}


def load_pandas(path: DatasetPath):
    """A pandas DataFrame, one row per transition (obs cells are numpy arrays; an image's, its frames' bytes); the
    same as `pd.read_parquet(path)`, validated."""
    return load_table(path).to_pandas()


def load_ray(path: DatasetPath):
    """A streaming Ray Dataset over the files (Ray must be initialized or it starts a local one)."""
    import ray

    location = locate(path)
    card = validate(location)
    return ray.data.read_parquet([location.path(f["path"]) for f in card.files], filesystem=location.fs)


def torch_dataloader(path: DatasetPath, batch_size: int = 256, shuffle: bool = True, seed: int = 0):
    """A torch DataLoader of (obs, actions) float32/int64 tensors for behaviour cloning."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    arrays = load_arrays(path)  # may be read-only views of Arrow memory, so torch gets copies
    dataset = TensorDataset(torch.tensor(arrays[Col.OBS]), torch.tensor(arrays[Col.ACTIONS]))
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator)
