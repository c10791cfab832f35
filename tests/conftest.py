"""Shared fixtures: a real local Ray, real collected datasets, a real MLflow server on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from collectors.config import CollectConfig, DatasetConfig, PolicyConfig

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# One file per task (5 episodes), so tests see datasets of several files.
TINY_COLLECT = CollectConfig(num_collectors=2, envs_per_collector=2, episodes_per_task=5, file_mib=0.001)


@pytest.fixture(scope="session")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def expert_dataset(ray_local, tmp_path_factory) -> Path:
    """20 expert CartPole episodes (10,000 transitions) in 4 files."""
    from collectors.collect import collect

    path = tmp_path_factory.mktemp("data") / "cartpole-expert"
    collect("cartpole-expert", DatasetConfig(env="CartPole-v1", episodes=20, seed=3), TINY_COLLECT, path)
    return path


@pytest.fixture(scope="session")
def mixture_dataset(ray_local, tmp_path_factory) -> Path:
    from collectors.collect import collect

    path = tmp_path_factory.mktemp("data") / "cartpole-medium"
    spec = DatasetConfig(env="CartPole-v1", episodes=12, seed=2, policy=PolicyConfig(kind="mixture", epsilon=0.5))
    collect("cartpole-medium", spec, TINY_COLLECT, path)
    return path


@pytest.fixture(scope="session")
def pendulum_dataset(ray_local, tmp_path_factory) -> Path:
    """8 Pendulum episodes (continuous actions) of a half-random expert."""
    from collectors.collect import collect

    path = tmp_path_factory.mktemp("data") / "pendulum-medium"
    spec = DatasetConfig(env="Pendulum-v1", episodes=8, seed=4, policy=PolicyConfig(kind="mixture", epsilon=0.5))
    collect("pendulum-medium", spec, CollectConfig(episodes_per_task=4), path)
    return path


@contextmanager
def built_algorithm(algo: str, params, dataset_dir: Path):
    """The RLlib algorithm that trains `algo` with `params` on the dataset (seed 0), stopped afterwards."""
    import dataset_format as dataset
    from training.algorithms.registry import rllib_config

    algorithm = rllib_config(algo, params, dataset.read_card(dataset_dir).spaces, dataset_dir, seed=0).build_algo()
    try:
        yield algorithm
    finally:
        algorithm.stop()


def train_columns(algorithm, rows: int) -> dict:
    """The first `rows` rows of an algorithm's train batches, as tensors named by column (no module prefix)."""
    import numpy as np
    import torch

    data = algorithm.offline_data.data.take_batch(rows, batch_format="numpy")
    return {key.split("/", 1)[1]: torch.as_tensor(np.array(values)) for key, values in data.items()}


def copy_dataset(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def orl(*args: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Runs the real `orl` command in a subprocess."""
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """`orl` failed as a user error should: exit 2, no traceback, one last line naming the problem."""
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("orl: error: ") and "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in last


def kill_group(process: subprocess.Popen) -> None:
    """Kills what is left of a process started with start_new_session (its Ray processes), as a machine loss."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 with a SQLite store; stopped after the session."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    log = open(root / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, cwd=root,
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2)
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
    yield uri
    server.terminate()
    server.wait(timeout=30)
    log.close()
