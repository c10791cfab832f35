"""Training start-up and memory against dataset size: 1M vs 10M transitions, measured in one run.

For each size it collects (once, into --data-dir) a uniformly random CartPole dataset, reporting the files,
time and peak memory of collecting (summed PSS of this process and Ray's), then trains BC on it in a fresh
process and reports:
- start-up: seconds from building the algorithm to the end of its first iteration (including its first
  `updates_per_iteration` updates), with Ray already running;
- steady samples/s: the iterations after the first (a dataset that streams is read at this pace);
- peak RSS of the training process, and the peak summed PSS of it and every Ray process it started (PSS
  splits each shared page, such as the object store's, among the processes that map it).
The ratio 10M ÷ 1M shows whether memory grows with the dataset. With params.yaml's `memory_cache_mib` the 1M
dataset is held in memory and the 10M one streams; `--memory-cache-mib 0` makes both stream.

    python benchmarks/training_scale.py --sizes 1000000 10000000 --iterations 20
    python benchmarks/training_scale.py --sizes 1000000 10000000 --iterations 20 --memory-cache-mib 0
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq

import dataset_format as dataset
from collectors.config import CollectConfig, DatasetConfig, PolicyConfig
from common.errors import exit_on_user_error
from common.ray_runtime import start_ray
from pipelines.params import load_params

ROOT = Path(__file__).resolve().parent.parent

EPISODE_STEPS = 22  # a random CartPole episode, on average


@contextmanager
def peak_memory():
    """Yields a dict that holds, on exit, the peaks of this process's RSS ("rss") and of `process_tree_pss`
    ("tree_pss"), sampled every 0.2 s meanwhile. (ru_maxrss would count the memory of the parent that forked
    this process.)"""
    import psutil

    me = psutil.Process()
    peak, done = {"rss": 0, "tree_pss": 0}, threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak["rss"] = max(peak["rss"], me.memory_info().rss)
            peak["tree_pss"] = max(peak["tree_pss"], process_tree_pss())
            time.sleep(0.2)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()


def ensure_dataset(data_dir: Path, transitions: int, settings: CollectConfig) -> tuple[Path, dict | None]:
    """The dataset's path, and the seconds and peak memory of collecting it (None if it was there already)."""
    from collectors.collect import collect

    path = data_dir / f"cartpole-random-{transitions}"
    if path.exists():
        return path, None
    spec = DatasetConfig(env="CartPole-v1", episodes=transitions // EPISODE_STEPS, seed=0,
                         policy=PolicyConfig(kind="random"))
    started = time.perf_counter()
    with peak_memory() as peak:
        collect(path.name, spec, settings, path)
    return path, {"seconds": time.perf_counter() - started, "peak_pss": peak["tree_pss"]}


def process_tree_pss() -> int:
    """Bytes of memory of this process and all its descendants (Ray's raylet, workers, store), each shared
    page (the object store's, mapped by every process that reads or writes a block) split among its users.
    Summed RSS would count those pages once per process."""
    import psutil

    me = psutil.Process()
    total = 0
    for process in [me, *me.children(recursive=True)]:
        try:
            total += process.memory_full_info().pss
        except psutil.Error:  # exited meanwhile
            pass
    return total


def measure(dataset_dir: Path, iterations: int, params_file: str, overrides: dict) -> dict:
    """Runs in a fresh process: start-up, steady samples/s and peak memory of BC training on the dataset, with
    `overrides` of params.yaml's `algos.bc`."""
    from training.algorithms.registry import rllib_config

    params = load_params(params_file)
    start_ray(params.ray.num_cpus)
    bc = dataclasses.replace(params.algos.bc, **overrides)
    with peak_memory() as peak:
        started = time.perf_counter()
        algorithm = rllib_config("bc", bc, dataset_dir, seed=0).build_algo()
        algorithm.train()
        startup = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(iterations):
            algorithm.train()
        samples_per_s = iterations * bc.updates_per_iteration * bc.batch_size / (time.perf_counter() - started)
    algorithm.stop()
    del algorithm
    gc.collect()  # closes RLlib's dataset iterators while Ray is still up (else exit hangs re-starting Ray)
    return {"startup_s": startup, "samples_per_s": samples_per_s, "peak_rss": peak["rss"],
            "peak_tree_rss": peak["tree_pss"]}


def print_collection(collected: list[tuple[Path, dict | None]]) -> None:
    """The collection table: file layout, time and peak memory of each dataset this run collected."""
    rows = ["| transitions | files | file size (MiB) | row groups | collect (s) | steps/s | "
            "peak PSS with Ray processes (MiB) |", "|---|---|---|---|---|---|---|"]
    for path, result in collected:
        if result is None:
            continue
        card = dataset.read_card(path)
        sizes = [(path / f["path"]).stat().st_size / 2**20 for f in card.files]
        groups = sum(pq.read_metadata(path / f["path"]).num_row_groups for f in card.files)
        rows.append(f"| {card.transitions:,} | {len(sizes)} | {min(sizes):.0f}-{max(sizes):.0f} | {groups} | "
                    f"{result['seconds']:.0f} | {card.transitions / result['seconds']:,.0f} | "
                    f"{result['peak_pss'] / 2**20:.0f} |")
    if len(rows) > 2:
        print("\n".join(rows) + "\n", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/orl-scale"))
    parser.add_argument("--memory-cache-mib", type=int,
                        help="overrides params.yaml's memory_cache_mib (0: every size streams)")
    parser.add_argument("--episodes-per-task", type=int, default=2000,
                        help="collect.episodes_per_task for collecting; random CartPole episodes are short")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # internal: one measurement
    args = parser.parse_args()

    overrides = {} if args.memory_cache_mib is None else {"memory_cache_mib": args.memory_cache_mib}
    if args.measure:
        print(json.dumps(measure(args.measure, args.iterations, args.params, overrides)))
        return
    params = load_params(args.params)
    start_ray(params.ray.num_cpus)
    settings = dataclasses.replace(params.collect, episodes_per_task=args.episodes_per_task)
    collected = [ensure_dataset(args.data_dir, size, settings) for size in args.sizes]
    import ray

    ray.shutdown()  # each measurement starts its own Ray, in its own process
    paths = [path for path, _ in collected]
    print_collection(collected)
    rows = ["| transitions | files | on disk (MiB) | bytes/transition | start-up (s) | steady samples/s | "
            "peak RSS (MiB) | peak PSS with Ray processes (MiB) |", "|---|---|---|---|---|---|---|---|"]
    results = []
    for size, path in zip(args.sizes, paths):
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in overrides.items()]
        out = subprocess.run([sys.executable, __file__, "--measure", str(path), "--iterations", str(args.iterations),
                              "--params", args.params, *flags], capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(result)
        card, disk = dataset.read_card(path), dataset.size_on_disk(path)
        rows.append(f"| {card.transitions:,} | {len(card.files)} | {disk / 2**20:.0f} | "
                    f"{disk / card.transitions:.1f} | "
                    f"{result['startup_s']:.1f} | {result['samples_per_s']:,.0f} | {result['peak_rss'] / 2**20:.0f} | "
                    f"{result['peak_tree_rss'] / 2**20:.0f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    if len(results) > 1:
        rows.append(f"\nPeak RSS, largest ÷ smallest: {results[-1]['peak_rss'] / results[0]['peak_rss']:.2f} "
                    f"(with Ray processes: {results[-1]['peak_tree_rss'] / results[0]['peak_tree_rss']:.2f})")
    print("\n".join(rows))


if __name__ == "__main__":
    exit_on_user_error(main)
