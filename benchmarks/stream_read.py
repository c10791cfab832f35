"""Reading a dataset as a training stream does, measured against pyarrow in one run.

Ray Data reads the dataset's Parquet files with the learners' stream settings (params.yaml's `stream_read_ahead_mib`
of object store, blocks of `stream_block_mib`, one map task), maps rows with BC's batch function (its columns,
images as stored), and hands batches of a shuffle buffer's rows to the caller, as `StreamedBatches` takes them: seconds to the first batch and to the last, and
the peak RSS of any Ray worker. pyarrow then reads the same files row group by row group in this process. Frames make
the difference large (benchmarks/README.md, "Frames streamed").

    python -m benchmarks.stream_read --dataset DATASET --buffer-rows 2377
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq

import dataset_format as dataset
from pipelines.params import load_params
from training.algorithms.batch_columns import cloning_batch

ROOT = Path(__file__).resolve().parent.parent


def peak_worker_rss(done: threading.Event, peak: list[int]) -> None:
    while not done.is_set():
        for process in psutil.process_iter(["cmdline"]):
            try:
                if any(part.startswith("ray::") for part in process.info["cmdline"] or []):
                    peak[0] = max(peak[0], process.memory_info().rss)
            except psutil.Error:
                pass
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--buffer-rows", type=int, default=50_000)
    args = parser.parse_args()
    import ray
    from ray.data import DataContext, TaskPoolStrategy

    bc = load_params(args.params).algos.bc
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    context = DataContext.get_current()
    limits = context.execution_options.resource_limits
    context.execution_options.resource_limits = limits.copy(object_store_memory=bc.stream_read_ahead_mib * 2**20)
    context.target_max_block_size = bc.stream_block_mib * 2**20
    peak, done = [0], threading.Event()
    threading.Thread(target=peak_worker_rss, args=(done, peak), daemon=True).start()
    started, first, rows = time.perf_counter(), None, 0
    stream = ray.data.read_parquet(str(args.dataset)).map_batches(
        cloning_batch, batch_format="pyarrow", compute=TaskPoolStrategy(size=1), num_cpus=1)
    for batch in stream.iter_torch_batches(batch_size=args.buffer_rows, prefetch_batches=1):
        first = first or time.perf_counter() - started
        rows += len(next(iter(batch.values())))
    ray_data = time.perf_counter() - started
    done.set()
    ray.shutdown()

    started = time.perf_counter()
    for entry in dataset.read_card(args.dataset).files:
        parquet = pq.ParquetFile(args.dataset / entry["path"])
        for group in range(parquet.num_row_groups):
            cloning_batch(parquet.read_row_group(group))
    plain = time.perf_counter() - started
    print(f"{rows:,} rows in {args.buffer_rows:,}-row batches: Ray Data's first batch after {first:.1f} s, the last "
          f"after {ray_data:.1f} s, peak worker RSS {peak[0] / 2**30:.2f} GiB; pyarrow by row group {plain:.1f} s "
          f"(Ray Data ÷ pyarrow: {ray_data / plain:.1f}x the time)")


if __name__ == "__main__":
    main()
