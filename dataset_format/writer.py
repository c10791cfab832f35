"""Writing a dataset: Parquet files in the order the rows come, then the card, all or nothing."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from common.errors import refuse_to_overwrite
from dataset_format.card import CARD_FILE, DatasetCard, episode_stats, summarize
from dataset_format.schema import Col
from dataset_format.validation import validate

FILE_PREFIX = "episodes"
# Row groups of a fixed row count, not one per collector task: readers get groups worth reading, and a file's
# bytes do not depend on how the work was split.
ROW_GROUP_ROWS = 2**17


def _ordered_parquet_sink(path: Path, file_bytes: int):
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
            pq.write_table(block.to_arrow(), file, row_group_size=ROW_GROUP_ROWS, compression="zstd")

    return OrderedParquetSink(str(path), filename_provider=FileNames())


def write(transitions, path: str | os.PathLike, card: DatasetCard, file_bytes: int) -> DatasetCard:
    """Writes a Ray Dataset of transitions, in order, to Parquet files of about `file_bytes` of rows in memory
    each; then the card, completed with what the files hold (files, transitions, returns, episode lengths).

    The files go to a hidden staging directory beside `path`, are validated, and the directory is renamed
    into place, so `path` only ever holds a complete dataset. `path` must not exist.
    """
    path = Path(path)
    refuse_to_overwrite(path)
    staging = path.parent / f".{path.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    # The write tasks take no CPU: the collector actors hold the CPUs while files are written.
    transitions.write_datasink(_ordered_parquet_sink(staging, file_bytes), ray_remote_args={"num_cpus": 0})
    files = sorted(staging.glob("*.parquet"))
    # Per file, then joined: files are cut between episodes, and only per-episode numbers are kept.
    returns, lengths = map(np.concatenate, zip(*(episode_stats(pq.read_table(f, columns=[Col.EPS_ID, Col.REWARDS]))
                                                 for f in files)))
    card = dataclasses.replace(card, files=[{"path": f.name, "rows": pq.read_metadata(f).num_rows} for f in files],
                               transitions=int(lengths.sum()), returns=summarize(returns),
                               episode_length=summarize(lengths))
    (staging / CARD_FILE).write_text(card.to_json())
    validate(staging)
    os.rename(staging, path)
    return card
