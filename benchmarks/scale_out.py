"""Scale beyond one node and beyond memory, measured in one run.

1. Collection on a Ray cluster of 1 and then 2 nodes on loopback (1 CPU each, `common/loopback_cluster.py`), one
   collector per node, through `orl collect` with RAY_ADDRESS: transitions/s of the command, end to end, and the
   ratio 2 nodes ÷ 1; the two datasets must be byte-identical. With --s3, the same dataset is collected again on
   the 2-node cluster straight to an S3-compatible store.
2. Training BC and MARWIL with one learner actor, on each size, with the dataset held in memory (`memory_cache_mib`
   above its size) and streamed from Parquet (`memory_cache_mib: 32`, below either size on disk, with the shuffle
   buffer it allows: 524,288 rows of CartPole), each in a fresh process on a local Ray:
   start-up (building the algorithm to the end of its first iteration), the first iteration alone, steady
   samples/s (the iterations after the first), peak RSS of the driver and of the learner; ratios streamed ÷ in
   memory and 10M ÷ 1M. With --s3, BC also streams the largest dataset from the store.
3. Bytes per transition on disk.

Random CartPole episodes (22 steps on average), the cheapest data to make at this scale.

    moto_server -H 127.0.0.1 -p 9000 &     # any S3-compatible store; moto keeps objects in memory
    AWS_ENDPOINT_URL=http://127.0.0.1:9000 AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x \\
        python -m benchmarks.scale_out --sizes 1000000 10000000 --s3 s3://orl-bench/scale
    python -m benchmarks.scale_out --sizes 1000000 10000000 --datasets DIR_1M DIR_10M     # training only

(Run as a module from the repository root.)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import yaml

import dataset_format as dataset
from common.errors import exit_on_user_error
from common.loopback_cluster import RayCluster

ROOT = Path(__file__).resolve().parent.parent
ALGOS = ("bc", "marwil")
# memory_cache_mib for each mode: 0 would stream too, with a shuffle buffer of one batch.
HELD_IN_MEMORY, STREAMED = 1_000_000, 32
EPISODE_STEPS = 22  # a random CartPole episode, on average


def write_params(workdir: Path, sizes: list[int], episodes_per_task: int) -> None:
    """params-N.yaml for N = 1 and 2 collectors, with one random CartPole dataset `scale-SIZE` per size."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["datasets"].update({f"scale-{size}": {"env": "CartPole-v1", "episodes": size // EPISODE_STEPS, "seed": 0,
                                                  "policy": {"kind": "random"}} for size in sizes})
    for collectors in (1, 2):
        params["collect"].update(episodes_per_task=episodes_per_task, num_collectors=collectors)
        (workdir / f"params-{collectors}.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def orl_collect(workdir: Path, name: str, out: str, num_collectors: int, env: dict | None = None) -> float:
    """Seconds `orl collect` took, end to end (Ray connection and validation included)."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipelines.cli", "--params", f"params-{num_collectors}.yaml", "collect",
                    name, "--out", out], cwd=workdir, check=True, env={**os.environ, **(env or {})})
    return time.perf_counter() - started


def collect_all(workdir: Path, sizes: list[int], s3: str | None) -> tuple[dict[int, str], list[str]]:
    """The dataset of each size, and the collection table's rows."""
    paths, rows = {}, []
    *smaller, largest = sizes
    for size in smaller:  # on a local Ray
        paths[size] = str(workdir / f"scale-{size}")
        if not Path(paths[size]).exists():
            orl_collect(workdir, f"scale-{size}", paths[size], num_collectors=2)
    cluster = RayCluster(workdir / "cluster.log")
    try:
        seconds = {}
        for nodes in (1, 2):
            if nodes == 2:
                cluster.add_worker()
            out = workdir / f"scale-{largest}-{nodes}-node"
            seconds[nodes] = orl_collect(workdir, f"scale-{largest}", str(out), nodes, cluster.env)
            transitions = dataset.read_card(out).transitions
            rows.append(f"| {transitions:,} | {nodes} node(s), local disk | {seconds[nodes]:.0f} | "
                        f"{transitions / seconds[nodes]:,.0f} |")
            print(rows[-1], file=sys.stderr, flush=True)
        one, two = (workdir / f"scale-{largest}-{n}-node" for n in (1, 2))
        identical = all((one / f.name).read_bytes() == f.read_bytes() for f in two.iterdir())
        rows.append(f"\n2 nodes ÷ 1 node: {seconds[1] / seconds[2]:.2f}; the two datasets are "
                    f"{'byte-identical' if identical else 'DIFFERENT'}")
        paths[largest] = str(two)
        if s3:
            uri = f"{s3.rstrip('/')}/scale-{largest}"
            took = orl_collect(workdir, f"scale-{largest}", uri, 2, cluster.env)
            rows.insert(2, f"| {transitions:,} | 2 nodes, to {uri} | {took:.0f} | {transitions / took:,.0f} |")
            paths[f"s3-{largest}"] = uri
    finally:
        cluster.close()
    return paths, rows


def measure(location: str, algo: str, memory_cache_mib: int, iterations: int) -> dict:
    """In a fresh process: start-up, steady samples/s and peak RSS of the driver and the learner actor."""
    from common.ray_runtime import start_ray
    from pipelines.params import load_params
    from training.algorithms.registry import rllib_config
    from training.algorithms.train_batches import release_data_iterator

    params = load_params(str(ROOT / "params.yaml"))
    start_ray(params.ray.num_cpus)
    learner_params = dataclasses.replace(getattr(params.algos, algo), memory_cache_mib=memory_cache_mib,
                                         num_learners=1)
    started = time.perf_counter()
    algorithm = rllib_config(algo, learner_params, location, seed=0).build_algo()
    [learner_pid] = [r.get() for r in algorithm.learner_group.foreach_learner(lambda learner: os.getpid())]
    peak, done = {"driver": 0, "learner": 0}, threading.Event()

    def sample() -> None:
        processes = {"driver": psutil.Process(), "learner": psutil.Process(learner_pid)}
        while not done.is_set():
            for role, process in processes.items():
                peak[role] = max(peak[role], process.memory_info().rss)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    built = time.perf_counter()
    algorithm.train()
    startup, first_iteration = time.perf_counter() - started, time.perf_counter() - built
    started = time.perf_counter()
    for _ in range(iterations):
        algorithm.train()
    samples = iterations * learner_params.updates_per_iteration * learner_params.batch_size
    samples_per_s = samples / (time.perf_counter() - started)
    done.set()
    sampler.join()
    algorithm.learner_group.foreach_learner(release_data_iterator)
    algorithm.stop()
    del algorithm
    gc.collect()
    return {"startup_s": startup, "first_iteration_s": first_iteration, "samples_per_s": samples_per_s,
            "driver_rss": peak["driver"],
            "learner_rss": peak["learner"]}


def measure_in_fresh_process(location: str, algo: str, memory_cache_mib: int, iterations: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.scale_out", "--measure", location, "--algo", algo,
                          "--memory-cache-mib", str(memory_cache_mib), "--iterations", str(iterations)],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/orl-scale-out"))
    parser.add_argument("--episodes-per-task", type=int, default=2000,
                        help="collect.episodes_per_task; random CartPole episodes are short")
    parser.add_argument("--s3", help="s3://BUCKET/PREFIX to collect the largest dataset to and stream it from")
    parser.add_argument("--datasets", nargs="+", help="datasets to train on, one per size in the order of --sizes, "
                        "instead of collecting them (no collection table)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: one measurement, in a fresh process
    parser.add_argument("--algo", help=argparse.SUPPRESS)
    parser.add_argument("--memory-cache-mib", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.algo, args.memory_cache_mib, args.iterations)))
        return

    if args.datasets:
        if args.s3 or len(args.datasets) != len(args.sizes):
            parser.error("--datasets takes one dataset per size, and no --s3")
        paths = dict(zip(args.sizes, args.datasets))
    else:
        args.data_dir.mkdir(parents=True, exist_ok=True)
        write_params(args.data_dir, args.sizes, args.episodes_per_task)
        paths, collection = collect_all(args.data_dir, args.sizes, args.s3)
        print("| transitions | collected on | seconds | transitions/s |\n|---|---|---|---|\n" + "\n".join(collection))

    rows = [("| algo | transitions | data | start-up (s) | first iteration (s) | samples/s | streamed ÷ in memory | "
             "driver peak RSS (MiB) | learner peak RSS (MiB) |"), "|---|---|---|---|---|---|---|---|---|"]
    results = {}
    runs = [(algo, size, mode) for algo in ALGOS for size in args.sizes for mode in ("in memory", "streamed")]
    if args.s3:
        runs.append(("bc", args.sizes[-1], "streamed from S3"))
    for algo, size, mode in runs:
        location = paths[f"s3-{size}"] if mode == "streamed from S3" else paths[size]
        cache = HELD_IN_MEMORY if mode == "in memory" else STREAMED
        result = results[algo, size, mode] = measure_in_fresh_process(location, algo, cache, args.iterations)
        ratio = (f"{result['samples_per_s'] / results[algo, size, 'in memory']['samples_per_s']:.2f}"
                 if mode != "in memory" else "")
        rows.append(f"| {algo} | {size:,} | {mode} | {result['startup_s']:.1f} | {result['first_iteration_s']:.1f} | "
                    f"{result['samples_per_s']:,.0f} | "
                    f"{ratio} | {result['driver_rss'] / 2**20:.0f} | {result['learner_rss'] / 2**20:.0f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    smallest, largest = args.sizes[0], args.sizes[-1]
    for algo in ALGOS:
        for mode in ("in memory", "streamed"):
            small, large = results[algo, smallest, mode], results[algo, largest, mode]
            rows.append(f"\n{algo}, {mode}, peak RSS {largest:,} ÷ {smallest:,}: driver "
                        f"{large['driver_rss'] / small['driver_rss']:.2f}, learner "
                        f"{large['learner_rss'] / small['learner_rss']:.2f}")
    for size in args.sizes:
        card, disk = dataset.read_card(paths[size]), dataset.size_on_disk(paths[size])
        rows.append(f"\n{card.transitions:,} transitions: {disk / 2**20:.0f} MiB in {len(card.files)} files, "
                    f"{disk / card.transitions:.1f} bytes per transition")
    print("\n".join(rows))


if __name__ == "__main__":
    exit_on_user_error(main)
