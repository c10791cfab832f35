"""Images as each dataset schema version stores them: lists of bytes (version 1), one binary value each (version 2),
dictionary-encoded frames (version 3). The same rows written, validated and read back each way in one run, each
step's time in each and the ratio of the last version named to the first.

The rows of `--dataset` (an image dataset of any version; with `--files`, of its first files) are held in memory,
then written as each version into a temporary directory with the writer's settings (zstd, row groups of about 32 MiB).
Then, on each copy: the checks every reader runs (`validate`), what training and `orl ope` hold in memory
(`read_frames`), and the `obs` column of every row group, read as a stream reads it and made a uint8 array.

    python -m benchmarks.frame_storage --dataset DATASET --files 3 --versions 2 3
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

import dataset_format as dataset
from common.errors import exit_on_user_error
from common.observations import ModelInput
from dataset_format import Col


VERSIONS = {1: "lists", 2: "bytes", 3: "frames"}


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def measure(arrays: list[dict], card: dataset.DatasetCard, path: Path) -> dict[str, float]:
    """Seconds of each step on a copy of the rows written as `card`'s schema version, and its bytes on disk."""
    schema = card.schema()
    tables = [dataset.transitions_table(columns, schema) for columns in arrays]
    empty = dataclasses.replace(card, files=[], transitions=0)
    seconds = {"write": timed(lambda: dataset.write_tables(tables, path, empty, file_bytes=2**28))}
    seconds["validate"] = timed(lambda: dataset.validate(path))
    channels_first = ModelInput.of(card.spaces[0]).channels_first
    seconds["read_frames"] = timed(lambda: dataset.read_frames(path, channels_first))
    seconds["stream obs"] = timed(lambda: [dataset.column_to_numpy(dataset.read_row_groups(path, run, (Col.OBS,))[
        Col.OBS]) for run in dataset.row_group_runs(path)])
    seconds["MB on disk"] = dataset.size_on_disk(path) / 1e6
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True, help="an image dataset")
    parser.add_argument("--files", type=int, help="its first FILES files only (held in memory as arrays: a Pong "
                        "transition's frames are 56 KB)")
    parser.add_argument("--versions", type=int, nargs="+", default=[2, dataset.SCHEMA_VERSION],
                        choices=range(1, dataset.SCHEMA_VERSION + 1))
    args = parser.parse_args()
    card = dataset.read_card(args.dataset)
    card = dataclasses.replace(card, files=card.files[:args.files])
    if not dataset.stored_as_bytes(card.spaces[0]):
        parser.error(f"{args.dataset} holds {card.spaces[0]}, not images (uint8 of 2 or more axes)")
    location = dataset.locate(args.dataset)
    arrays = [{name: dataset.column_to_numpy(column) for name, column in zip(table.column_names, table.columns)}
              for table in (pq.read_table(location.path(entry["path"])) for entry in card.files)]
    rows = sum(len(columns[Col.EPS_ID]) for columns in arrays)
    card = dataclasses.replace(card, episodes=sum(len(np.unique(columns[Col.EPS_ID])) for columns in arrays))
    with tempfile.TemporaryDirectory() as tmp:
        results = {version: measure(arrays, dataclasses.replace(card, schema_version=version),
                                    Path(tmp) / f"v{version}") for version in args.versions}
    first, last = args.versions[0], args.versions[-1]
    print(f"{args.dataset}: {rows:,} transitions, {len(card.files)} files")
    print(f"| step | {' | '.join(f'{VERSIONS[v]} (version {v})' for v in args.versions)} | "
          f"version {last} / version {first} |")
    print("|---|" + "---|" * (len(args.versions) + 1))
    for step in results[first]:
        unit = "" if step == "MB on disk" else " s"
        cells = [f"{results[version][step]:.2f}{unit}" for version in args.versions]
        print(f"| {step} | {' | '.join(cells)} | {results[last][step] / results[first][step]:.2f} |")


if __name__ == "__main__":
    exit_on_user_error(main)
