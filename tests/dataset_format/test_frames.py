"""Image observations read back with each distinct frame held once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataset_format as dataset
from dataset_format import Col
from tests.conftest import write_frame_stacks


@pytest.mark.parametrize("channels_first", [True, False])
def test_frame_stacks_are_held_once_per_frame_and_rebuilt_as_stored(tmp_path, monkeypatch, channels_first):
    monkeypatch.setattr(dataset.frames, "READ_ROWS", 4)  # episodes of 9 rows: stacks cut across reads
    path = write_frame_stacks(tmp_path / "stacks", channels_first)
    store, table = dataset.read_frames(path, channels_first)

    stored = dataset.load_arrays(path)
    card = dataset.read_card(path)
    shape = tuple(card.observation_space["shape"])
    for name in (Col.OBS, Col.NEW_OBS):
        ids = table[name].to_numpy()
        np.testing.assert_array_equal(store[ids], stored[name].reshape(-1, *shape))
    assert table.drop_columns([Col.OBS, Col.NEW_OBS]).equals(dataset.read_table(path).drop_columns(
        [Col.OBS, Col.NEW_OBS]))
    assert len(store.frames) == card.transitions + card.episodes  # each episode's 10 distinct frames, once
    held_as_arrays = stored[Col.OBS].nbytes + stored[Col.NEW_OBS].nbytes  # eight frames per transition
    assert store.nbytes < held_as_arrays / 4


def test_row_groups_of_frames_hold_about_32_mib_and_of_vectors_a_fixed_row_count(tmp_path, monkeypatch,
                                                                                 expert_dataset):
    """A row group is decoded whole: a collector task's frames in one group read several times slower."""
    # Four rows: each holds two 4-frame stacks of 12x10 (960 bytes) and 24 bytes of other columns.
    monkeypatch.setattr(dataset.writer, "ROW_GROUP_BYTES", 4_000)
    path = write_frame_stacks(tmp_path / "stacks", episodes=1, length=12)
    parquet = pq.ParquetFile(path / dataset.read_card(path).files[0]["path"])
    assert [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)] == [4, 4, 4]
    vectors = pq.ParquetFile(expert_dataset / dataset.read_card(expert_dataset).files[0]["path"])
    assert vectors.metadata.row_group(0).num_rows == min(vectors.metadata.num_rows, dataset.writer.ROW_GROUP_ROWS)


def test_frames_are_stored_as_bytes_and_version_1_datasets_of_lists_still_read(tmp_path):
    """Schema version 2 stores each image as one binary value; a version-1 dataset's images, lists of bytes, read and
    validate as they did, to the same arrays."""
    path = write_frame_stacks(tmp_path / "v2")
    old = write_frame_stacks(tmp_path / "v1", schema_version=1)
    files = {name: pq.ParquetFile(name / dataset.read_card(name).files[0]["path"]).schema_arrow for name in (path, old)}
    assert files[path].field(Col.OBS).type == pa.binary(4 * 12 * 10)
    assert files[old].field(Col.OBS).type == pa.list_(pa.uint8(), 4 * 12 * 10)

    assert dataset.validate(old).schema_version == 1 and dataset.validate(path).schema_version == 2
    new_arrays, old_arrays = dataset.load_arrays(path), dataset.load_arrays(old)
    for name in new_arrays:
        np.testing.assert_array_equal(new_arrays[name], old_arrays[name])
    new_store, _ = dataset.read_frames(path, channels_first=True)
    old_store, _ = dataset.read_frames(old, channels_first=True)
    np.testing.assert_array_equal(new_store.frames, old_store.frames)
