"""Image observations read back with each distinct frame held once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataset_format as dataset
from common.errors import UserError
from dataset_format import Col
from tests.conftest import write_frame_stacks


def frame_columns(group: pq.RowGroupMetaData) -> list[pq.ColumnChunkMetaData]:
    """The metadata of a row group's `obs` and `new_obs` column chunks."""
    columns = [group.column(i) for i in range(group.num_columns)
               if group.column(i).path_in_schema.split(".")[0] in (Col.OBS, Col.NEW_OBS)]
    assert len(columns) == 2
    return columns


@pytest.mark.parametrize("channels_first", [True, False])
def test_frame_stacks_are_held_once_per_frame_and_rebuilt_as_stored(tmp_path, monkeypatch, channels_first):
    # Groups of 4 rows in one file of 3 episodes of 9: stacks cut across groups, each group's frames its own.
    monkeypatch.setattr(dataset.writer, "ROW_GROUP_BYTES", 4_000)
    path = write_frame_stacks(tmp_path / "stacks", channels_first, one_file=True)
    store, table = dataset.read_frames(path, channels_first)

    stored = dataset.load_arrays(path)
    card = dataset.read_card(path)
    shape = tuple(card.observation_space["shape"])
    for name in (Col.OBS, Col.NEW_OBS):
        ids = table[name].to_numpy()
        np.testing.assert_array_equal(store[ids], stored[name].reshape(-1, *shape))
    assert table.drop_columns([Col.OBS, Col.NEW_OBS]).equals(dataset.read_table(path).drop_columns(
        [Col.OBS, Col.NEW_OBS]))
    assert len(store.frames) == card.transitions + 1  # each episode's 9 frames after the one they all start from
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


def test_frames_are_stored_once_a_row_group_and_versions_1_and_2_still_read(tmp_path):
    """Schema version 3 stores an image as its frames, dictionary-encoded: a row group holds each distinct frame once a
    column. Datasets of version 2 (one binary value an image) and 1 (lists of bytes) read and validate as they did, to
    the same arrays."""
    paths = {version: write_frame_stacks(tmp_path / f"v{version}", schema_version=version) for version in (1, 2, 3)}
    files = {version: pq.ParquetFile(path / dataset.read_card(path).files[0]["path"])
             for version, path in paths.items()}
    assert files[3].schema_arrow.field(Col.OBS).type == pa.list_(pa.dictionary(pa.int32(), pa.binary()), 4)
    assert files[2].schema_arrow.field(Col.OBS).type == pa.binary(4 * 12 * 10)
    assert files[1].schema_arrow.field(Col.OBS).type == pa.list_(pa.uint8(), 4 * 12 * 10)
    # An episode (its own file and row group) of 9 steps over 10 frames: obs's stacks hold the first 9, new_obs's
    # the last 9 and the first, which pads their start.
    group = files[3].read_row_group(0)
    assert [len(group[name].chunk(0).flatten().dictionary) for name in (Col.OBS, Col.NEW_OBS)] == [9, 10]

    assert [dataset.validate(path).schema_version for path in paths.values()] == [1, 2, 3]
    arrays = {version: dataset.load_arrays(path) for version, path in paths.items()}
    stores = {version: dataset.read_frames(path, channels_first=True)[0] for version, path in paths.items()}
    for version in (1, 2):
        for name in arrays[3]:
            np.testing.assert_array_equal(arrays[version][name], arrays[3][name])
        np.testing.assert_array_equal(stores[version].frames, stores[3].frames)
        np.testing.assert_array_equal(stores[version].stacks, stores[3].stacks)


def test_a_group_of_rows_holds_only_the_frames_it_uses(tmp_path, monkeypatch):
    """Parquet writes a dictionary array's whole dictionary into each row group that holds a slice of it; the writer
    cuts it to the group's frames."""
    monkeypatch.setattr(dataset.writer, "ROW_GROUP_BYTES", 4_000)  # four rows to a group, as below
    path = write_frame_stacks(tmp_path / "stacks", episodes=1, length=12)
    parquet = pq.ParquetFile(path / dataset.read_card(path).files[0]["path"])
    # Rows 0-3 stack frames 0-3 (obs) and 0-4 (new_obs); rows 4-7 frames 1-7 and 2-8; rows 8-11 frames 5-11, 6-12.
    assert [[len(parquet.read_row_group(i)[name].chunk(0).flatten().dictionary) for name in (Col.OBS, Col.NEW_OBS)]
            for i in range(parquet.num_row_groups)] == [[4, 5], [7, 7], [7, 7]]
    dataset.validate(path)


def test_a_group_of_several_episodes_holds_each_frame_once(tmp_path):
    """Parquet stores a dictionary that repeats a value as plain values, each frame again: each episode's table (a
    collector's task) has its own dictionary, and all of them hold the frame the episodes start from."""
    path = write_frame_stacks(tmp_path / "stacks", episodes=3, length=9, one_file=True)
    parquet = pq.ParquetFile(path / dataset.read_card(path).files[0]["path"])
    assert parquet.num_row_groups == 1
    assert all("RLE_DICTIONARY" in column.encodings for column in frame_columns(parquet.metadata.row_group(0)))
    group = parquet.read_row_group(0)
    # obs: 3 episodes' first 9 frames, the first shared; new_obs: their 10, the first shared.
    assert [len(group[name].chunk(0).flatten().dictionary) for name in (Col.OBS, Col.NEW_OBS)] == [25, 28]
    dataset.validate(path)


def test_a_group_holds_its_frames_once_past_a_mib_of_them(tmp_path):
    """Parquet's own dictionary encoding gives up past 1 MiB of dictionary (`dictionary_pagesize_limit`); the frames'
    dictionaries, written as they are, hold 301 84x84 frames here."""
    path = write_frame_stacks(tmp_path / "stacks", episodes=1, length=300, frame_shape=(84, 84))
    group = pq.ParquetFile(path / dataset.read_card(path).files[0]["path"]).metadata.row_group(0)
    for column in frame_columns(group):
        assert "RLE_DICTIONARY" in column.encodings
        assert column.total_uncompressed_size < 1.1 * 301 * 84 * 84  # the episode's 301 frames, once


def test_a_run_of_row_groups_reads_across_groups_of_frames(tmp_path, monkeypatch):
    """What a stream reads at once: pyarrow reads a column of frames, each group's with its own dictionary, group by
    group only."""
    monkeypatch.setattr(dataset.writer, "ROW_GROUP_BYTES", 4_000)  # groups of 4 rows
    path = write_frame_stacks(tmp_path / "stacks", one_file=True)
    (run,) = dataset.row_group_runs(path, min_rows=10**6)  # the file's 7 groups at once
    assert len(run.groups) == 7
    np.testing.assert_array_equal(dataset.column_to_numpy(dataset.read_row_groups(path, run)[Col.OBS]),
                                  dataset.load_arrays(path)[Col.OBS])


def swap_a_frame(table: pa.Table, row: int, frame: np.ndarray) -> pa.Table:
    """The table with the newest frame of `obs` at `row` replaced."""
    images = dataset.column_to_numpy(table[Col.OBS]).copy()
    images[row, -frame.size:] = frame.ravel()
    field = table.schema.field(Col.OBS)
    stacks = dataset.FrameColumn.of_images(images, field.type.list_size).to_arrow()
    return table.set_column(table.schema.get_field_index(Col.OBS), field, stacks)


@pytest.mark.parametrize("row", [2, 4])  # inside a group of 4 rows; a group's first, against the group before
def test_validation_compares_frames_by_their_ids_within_and_across_groups(tmp_path, monkeypatch, row):
    """Validation compares each obs with the step before's new_obs by frame ids, one numbering a group."""
    monkeypatch.setattr(dataset.writer, "ROW_GROUP_BYTES", 4_000)  # groups of 4 rows
    path = write_frame_stacks(tmp_path / "stacks", episodes=1, length=12)
    dataset.validate(path)
    file = path / dataset.read_card(path).files[0]["path"]
    table = pq.read_table(file)
    # A frame of the same bytes as one the group holds elsewhere: only its position tells.
    elsewhere = dataset.column_to_numpy(table[Col.OBS])[0, :120]
    pq.write_table(swap_a_frame(table, row, elsewhere), file, row_group_size=4)
    with pytest.raises(UserError, match=f"{file.name}: column 'obs' at row {row} is not the previous step's new_obs"):
        dataset.validate(path)


def test_validation_names_frames_of_another_size(tmp_path):
    path = write_frame_stacks(tmp_path / "stacks", episodes=1, length=5)
    file = path / dataset.read_card(path).files[0]["path"]
    table = pq.read_table(file)
    smaller = dataset.FrameColumn.of_images(dataset.column_to_numpy(table[Col.NEW_OBS])[:, :-4], 4).to_arrow()
    pq.write_table(table.set_column(table.schema.get_field_index(Col.NEW_OBS), Col.NEW_OBS, smaller), file)
    with pytest.raises(UserError, match=r"column 'new_obs' at row 0 holds images of 476 bytes where the card's "
                                        r"\(4, 12, 10\) take 480"):
        dataset.validate(path)
