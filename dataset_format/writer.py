"""Writing a dataset: Parquet files in the order the rows come, then the card, all or nothing.

A local dataset is written to a hidden staging directory, validated, and renamed into place. Object storage has no
rename: the files are written under the dataset's prefix, validated, and the card is written last, as the commit
marker; every reader refuses a prefix without one. A re-run clears what an interrupted write left there.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common.errors import UserError
from dataset_format.card import CARD_FILE, DatasetCard, episode_stats, summarize
from dataset_format.location import Location, locate
from dataset_format.schema import Col, FrameColumn, FrameNumbering, flat_dim, is_frames_type
from dataset_format.validation import files_checked_against

FILE_PREFIX = "episodes"
FILE_NAME = re.compile(rf"^{FILE_PREFIX}-\d{{5}}\.parquet$")
# Row groups of a fixed row count, not one per collector task: readers get groups worth reading, and a file's
# bytes do not depend on how the work was split. Rows of frames come fewer to a group: a group is decoded whole, and
# one of a task's 224 MB of Pong frames took several times the time and memory of 32 MiB groups to read
# (benchmarks/throughput.md, "Frames streamed").
ROW_GROUP_ROWS = 2**17
ROW_GROUP_BYTES = 32 * 2**20


def _ordered_parquet_sink(location: Location, file_bytes: int, group_rows: int):
    """A Ray Data sink that writes each bundle of about `file_bytes` of rows to one Parquet file, in the order
    the rows come. Ray's `write_parquet` goes through pyarrow's threaded dataset writer, which may reorder
    batches of rows (apache/arrow#26818): blocks of over 2**18 rows (tasks of 1,000 CartPole expert episodes)
    came out interleaved in 131,072-row pieces."""
    from ray.data.datasource import BlockBasedFileDatasink, FilenameProvider  # Ray is needed only to write

    class FileNames(FilenameProvider):
        # Ray's default names embed a random UUID, which would change the DVC hash of identical data.
        def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
            return f"{FILE_PREFIX}-{task_index:05d}.parquet"

    class OrderedParquetSink(BlockBasedFileDatasink):
        @property
        def min_bytes_per_write(self) -> int:
            return file_bytes

        def write_block_to_file(self, block, file) -> None:
            _write_parquet(block.to_arrow(), file, group_rows)

    # Object storage has no directories: creating one would leave an empty marker object under the prefix.
    return OrderedParquetSink(location.root, filesystem=location.fs, filename_provider=FileNames(),
                              try_create_dir=location.is_local)


def refuse_existing(path: str | os.PathLike | Location) -> Location:
    """Datasets are never overwritten: raises if one (or, locally, anything) is at `path`. On object storage,
    the files an interrupted write left under the prefix (no card) are removed; anything else there is refused."""
    location = locate(path)
    if location.is_local:
        if Path(location.root).exists():
            raise UserError(f"{location} already exists; remove it first (dvc repro does) or choose another output")
        return location
    location.require_bucket()
    names = location.files()
    if CARD_FILE in names:
        raise UserError(f"{location} already holds a dataset; remove it first or choose another prefix")
    others = [name for name in names if not FILE_NAME.match(name)]
    if others:
        raise UserError(f"{location} holds objects that are not a dataset's ({', '.join(others[:3])}); "
                        "choose an empty prefix")
    location.delete(names)
    return location


def write(transitions, path: str | os.PathLike | Location, card: DatasetCard, file_bytes: int) -> DatasetCard:
    """Writes a Ray Dataset of transitions, in order, to Parquet files of about `file_bytes` of rows in memory
    each; then the card, completed with what the files hold (files, transitions, returns, episode lengths).
    Nothing may be at `path` (see `refuse_existing`)."""
    def write_files(location: Location) -> None:
        # The write tasks take no CPU: the collector actors hold the CPUs while files are written.
        transitions.write_datasink(_ordered_parquet_sink(location, file_bytes, row_group_rows(card)),
                                   ray_remote_args={"num_cpus": 0})

    return _in_place(path, card, write_files)


def write_tables(tables: Iterable[pa.Table], path: str | os.PathLike | Location, card: DatasetCard,
                 file_bytes: int) -> DatasetCard:
    """`write` for Arrow tables made in this process (importers): each of whole episodes, in order. Tables are
    combined until they reach `file_bytes`, so files are cut between episodes."""
    def write_files(location: Location) -> None:
        pending, pending_bytes, index = [], 0, 0
        for table in tables:
            pending.append(table)
            pending_bytes += table.nbytes
            if pending_bytes >= file_bytes:
                _write_file(location, index, pending, row_group_rows(card))
                pending, pending_bytes, index = [], 0, index + 1
        if pending:
            _write_file(location, index, pending, row_group_rows(card))

    return _in_place(path, card, write_files)


def _write_file(location: Location, index: int, tables: list[pa.Table], group_rows: int) -> None:
    with location.fs.open_output_stream(location.path(f"{FILE_PREFIX}-{index:05d}.parquet")) as file:
        _write_parquet(pa.concat_tables(tables), file, group_rows)


def _write_parquet(table: pa.Table, file, group_rows: int) -> None:
    """One Parquet file (zstd) of `table`, in row groups of `group_rows`. Parquet writes a dictionary array's whole
    dictionary into each row group that holds a slice of it: a column of frames is cut, group by group, to the frames
    its rows use, so that a group holds each of its frames once and no others."""
    if not any(is_frames_type(field.type) for field in table.schema):
        pq.write_table(table, file, row_group_size=group_rows, compression="zstd")
        return
    with pq.ParquetWriter(file, table.schema, compression="zstd") as writer:
        for start in range(0, table.num_rows, group_rows):
            group = table.slice(start, group_rows)
            for index, field in enumerate(group.schema):
                if is_frames_type(field.type):
                    group = group.set_column(index, field, _used_frames(group[index]))
            writer.write_table(group, row_group_size=group_rows)


def _used_frames(column: pa.ChunkedArray) -> pa.Array:
    """A column of frames as one array whose dictionary holds the frames its rows use, each once: Parquet stores a
    dictionary with a repeated value (an episode's first frame, in each task's dictionary) as plain values."""
    numbering = FrameNumbering()
    chunks = [FrameColumn.of_arrow(chunk).used() for chunk in column.chunks]
    ids = np.concatenate([chunk.numbered(numbering) for chunk in chunks])
    return FrameColumn(numbering.array(chunks[0].frames.shape[1:], np.uint8), ids).to_arrow()


def row_group_rows(card: DatasetCard) -> int:
    """Rows per row group: ROW_GROUP_ROWS, or as many as hold ROW_GROUP_BYTES in memory where rows are larger.
    Every column has a fixed width (an image's is its bytes, as readers rebuild it from its frames), so the count
    follows from the card alone, the same in every file."""
    row_bits = 0
    for field in card.schema():
        if is_frames_type(field.type):
            row_bits += flat_dim(card.spaces[0]) * 8
            continue
        arrow_type, values = field.type, 1
        while pa.types.is_fixed_size_list(arrow_type):
            arrow_type, values = arrow_type.value_type, values * arrow_type.list_size
        row_bits += values * arrow_type.bit_width
    return max(1, min(ROW_GROUP_ROWS, ROW_GROUP_BYTES * 8 // row_bits))


def _in_place(path: str | os.PathLike | Location, card: DatasetCard,
            write_files: Callable[[Location], None]) -> DatasetCard:
    """`_files_then_card` where nobody reads yet: locally a staging directory, renamed into place at the end."""
    location = refuse_existing(path)
    if not location.is_local:
        return _files_then_card(location, card, write_files)
    final = Path(location.root)
    staging = final.parent / f".{final.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        card = _files_then_card(locate(staging), card, write_files)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # a bad input found on the way leaves nothing behind
        raise
    os.rename(staging, final)
    return card


def _files_then_card(location: Location, card: DatasetCard, write_files: Callable[[Location], None]) -> DatasetCard:
    """Runs `write_files`, completes the card with what the files hold, checks them against it and writes it: the
    commit marker. Each file is read once: its footer for the row count, then its rows, checked and counted into
    the episodes' returns and lengths on the way."""
    write_files(location)
    files = [{"path": name, "rows": _row_count(location, name)}
             for name in location.files() if FILE_NAME.match(name)]
    card = dataclasses.replace(card, files=files, transitions=sum(f["rows"] for f in files))
    _, tables = files_checked_against(location, card)
    episodes = _EpisodeStats()
    for table in tables:
        episodes.add(table)
    returns, lengths = episodes.whole()
    card = dataclasses.replace(card, returns=summarize(returns), episode_length=summarize(lengths))
    location.write_text(CARD_FILE, card.to_json())  # last: the commit marker
    return card


def _row_count(location: Location, name: str) -> int:
    with location.fs.open_input_file(location.path(name)) as handle:
        return pq.ParquetFile(handle).metadata.num_rows


class _EpisodeStats:
    """Returns and lengths of episodes from their rows in order, given a table at a time, where an episode may go
    on into the next table: each is counted once whole, by `episode_stats` over its rows in order."""

    def __init__(self):
        self.done: list[tuple[np.ndarray, np.ndarray]] = []
        self.open: pa.Table | None = None  # the rows of the last episode seen, which the next table may continue

    def add(self, table: pa.Table) -> None:
        rows = table.select([Col.EPS_ID, Col.REWARDS])
        if self.open is not None:
            rows = pa.concat_tables([self.open, rows])
        eps_id = rows[Col.EPS_ID].to_numpy()
        last_starts = int(np.searchsorted(eps_id, eps_id[-1]))  # eps_id ascends (validation checks)
        if last_starts:
            self.done.append(episode_stats(rows.slice(0, last_starts)))
        self.open = rows.slice(last_starts)

    def whole(self) -> tuple[np.ndarray, np.ndarray]:
        if self.open is not None:
            self.done.append(episode_stats(self.open))
            self.open = None
        returns, lengths = zip(*self.done)
        return np.concatenate(returns), np.concatenate(lengths)
