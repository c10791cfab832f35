"""Reading a dataset as a training stream does, measured against pyarrow in one run.

`StreamedBatches` (training/algorithms/train_batches.py) makes one pass over the dataset as BC's learner streams it:
its row groups in a fresh order, BC's columns read and mapped by the reading thread, a shuffle buffer of
`--buffer-rows`, batches of params.yaml's `batch_size` cut from it and made the network's input (float32 frames),
nothing trained. Printed: seconds to the first batch and to the last, this process's peak RSS, and the pass's time
against pyarrow reading the same row groups and columns, one after another, with nothing else.

    python -m benchmarks.stream_read --dataset DATASET --buffer-rows 2377
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time
from pathlib import Path

import psutil

import dataset_format as dataset
from common.errors import exit_on_user_error
from pipelines.params import load_params

ROOT = Path(__file__).resolve().parent.parent


def peak_rss(done: threading.Event, peak: list[int]) -> None:
    while not done.is_set():
        peak[0] = max(peak[0], psutil.Process().memory_info().rss)
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--buffer-rows", type=int, default=50_000)
    args = parser.parse_args()
    from training.algorithms.registry import rllib_config

    bc = dataclasses.replace(load_params(args.params).algos.bc, memory_cache_mib=0)
    config = rllib_config("bc", bc, args.dataset, seed=0)
    [stream] = config.offline_data_class(config).sample(num_samples=0, return_iterator=True, num_shards=0)
    peak, done = [0], threading.Event()
    threading.Thread(target=peak_rss, args=(done, peak), daemon=True).start()
    started, first, rows = time.perf_counter(), None, 0
    for batch in stream.iter_torch_batches(batch_size=bc.batch_size, local_shuffle_buffer_size=args.buffer_rows):
        first = first or time.perf_counter() - started
        rows += len(next(iter(batch.values())))
    streamed = time.perf_counter() - started
    done.set()

    started = time.perf_counter()
    for run in dataset.row_group_runs(args.dataset):
        stream.plan.train_batch(dataset.read_row_groups(args.dataset, run, stream.plan.columns))
    plain = time.perf_counter() - started
    print(f"{rows:,} rows in batches of {bc.batch_size} from a {args.buffer_rows:,}-row buffer: first batch after "
          f"{first:.1f} s, the last after {streamed:.1f} s ({rows / streamed:,.0f} rows/s), peak RSS "
          f"{peak[0] / 2**30:.2f} GiB; pyarrow alone {plain:.1f} s (stream ÷ pyarrow: {streamed / plain:.2f}x the time)")


if __name__ == "__main__":
    exit_on_user_error(main)
