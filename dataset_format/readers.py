"""Reading a dataset, for training and for users: Arrow, numpy, pandas, Ray Data and torch."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dataset_format.card import DatasetCard, read_card
from dataset_format.schema import Col, column_to_numpy
from dataset_format.validation import validate, validated_tables


def size_on_disk(path: str | os.PathLike) -> int:
    """Bytes of the dataset's Parquet files."""
    return sum((Path(path) / f["path"]).stat().st_size for f in read_card(path).files)


def load_table(path: str | os.PathLike) -> pa.Table:
    """The whole dataset as one Arrow table, each file read once and validated on the way."""
    return _one_table(*validated_tables(path))


def read_table(path: str | os.PathLike) -> pa.Table:
    """The whole dataset as one Arrow table, read without checks: for callers that validated it already
    (`orl train` does before training, so checking again would only add to its start-up)."""
    card = read_card(path)
    return _one_table(card, (pq.read_table(Path(path) / entry["path"]) for entry in card.files))


def _one_table(card: DatasetCard, tables) -> pa.Table:
    names = card.schema().names  # files may order their columns differently
    return pa.concat_tables([table.select(names) for table in tables])


def load_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The whole validated dataset in memory as numpy arrays: obs is (N, d), actions (N,) or (N, k)."""
    table = load_table(path)
    return {name: column_to_numpy(table[name]) for name in table.column_names}


def load_pandas(path: str | os.PathLike):
    """A pandas DataFrame, one row per transition (obs cells are numpy arrays); the same as
    `pd.read_parquet(path)`, validated."""
    return load_table(path).to_pandas()


def load_ray(path: str | os.PathLike):
    """A streaming Ray Dataset over the files (Ray must be initialized or it starts a local one)."""
    import ray

    card = validate(path)
    return ray.data.read_parquet([str(Path(path) / f["path"]) for f in card.files])


def torch_dataloader(path: str | os.PathLike, batch_size: int = 256, shuffle: bool = True, seed: int = 0):
    """A torch DataLoader of (obs, actions) float32/int64 tensors for behaviour cloning."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    arrays = load_arrays(path)  # may be read-only views of Arrow memory, so torch gets copies
    dataset = TensorDataset(torch.tensor(arrays[Col.OBS]), torch.tensor(arrays[Col.ACTIONS]))
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator)
