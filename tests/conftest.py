"""Shared fixtures: a real local Ray, real collected datasets, a real MLflow server on loopback."""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pytest
import yaml

import dataset_format as dataset
from collectors.config import CollectConfig, DatasetConfig, PolicyConfig
from common.envs import EnvSpec
from common.loopback_cluster import free_port
from dataset_format import Col
from pipelines.cli import warm_orl

REPO = Path(__file__).resolve().parent.parent
ORL = str(Path(sys.executable).parent / "orl")  # the console script users run
# Our packages, as floors, lowest first: each imports only those before it (tests/test_layers.py).
PACKAGES = (
    "examples",        # controllers that behaviour policies and references name from params.yaml: none of ours
    "common",          # errors, small checks, envs, Ray start-up: imports none of ours
    "dataset_format",  # the dataset format
    "tracking",        # MLflow runs and the policy's MLflow model, above the format
    "collectors",      # collection; beside it, interop: data from elsewhere in and out
    "interop",
    "evaluation",      # runs policies with the collectors' episode runner
    "training",        # offline training; online training scores its behaviour policies with evaluation's references
    "pipelines",       # the `orl` command, on top
)
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

# The hand-written controllers of examples/controllers.py as behaviour policies, and epsilon-mixtures of them.
CARTPOLE_EXPERT = PolicyConfig(kind="callable", callable="examples.controllers:cartpole")
CARTPOLE_CONTROLLER = {"kind": "callable", "callable": "examples.controllers:cartpole"}  # as params.yaml gives it
ACROBOT_EXPERT = PolicyConfig(kind="callable", callable="examples.controllers:acrobot")
PENDULUM_EXPERT = PolicyConfig(kind="callable", callable="examples.controllers:pendulum")


def repo_files(pattern: str) -> list[Path]:
    """The repository's files matching the git pathspec `pattern`, new ones included; never what git ignores
    (virtualenvs, MLflow's artifact copies of our code)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", pattern],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return sorted(REPO / name for name in listed if (REPO / name).is_file())


def mixture(base: PolicyConfig, epsilon: float, **options) -> PolicyConfig:
    return PolicyConfig(kind="mixture", base=base, epsilon=epsilon, **options)


def pytest_collection_modifyitems(items):
    """The slow tier's files first: `make test`'s two pytest processes take files in this order, so the files of
    minutes start early instead of leaving one process to run them alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# A user's own simulator and controllers (tests/fixtures/user_code/corridor_sim), outside our packages.
USER_CODE = REPO / "tests" / "fixtures" / "user_code"
CORRIDOR = EnvSpec(entry_point="corridor_sim.env:CorridorEnv", kwargs={"length": 6}, max_episode_steps=30,
                   name="Corridor")


@pytest.fixture
def user_code(monkeypatch):
    """The user's package importable in this process, as PYTHONPATH makes it for `orl`."""
    monkeypatch.syspath_prepend(str(USER_CODE))


# Every S3 client of the session (pyarrow, boto3, s3fs, DVC, MLflow, and the Ray workers started after this) talks
# to the `s3_server` fixture's moto_server on loopback, through the usual AWS variables. The keys are unlike any other
# string, so a test can grep what the pipeline wrote for them.
S3_ENV = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": f"ORLTEST{secrets.token_hex(6)}",
          "AWS_SECRET_ACCESS_KEY": f"orl-secret-{secrets.token_hex(12)}", "AWS_DEFAULT_REGION": "us-east-1"}
os.environ.update(S3_ENV)
# `ope` params for tests of `orl ope` that check what it writes, not how well it estimates: seconds per run.
TINY_OPE = {"hidden_layers": [32, 32], "iterations": 5, "updates_per_iteration": 10, "fqe_heads": 2,
            "bootstrap_samples": 30, "model_hidden_layers": [32], "model_ensemble": 2, "model_updates": 50}
# One file per task (5 episodes), so tests see datasets of several files.
TINY_COLLECT = CollectConfig(num_collectors=2, envs_per_collector=2, episodes_per_task=5, file_mib=0.001)


def session_ray() -> str:
    """The address of this test session's local Ray (2 CPUs), started on first use; Ray shuts it down at exit.
    In-process tests run on it, and the `orl` processes of `orl()` connect to it, as `orl repro`'s stages do."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    return ray.get_runtime_context().gcs_address


_session_servers = ExitStack()
atexit.register(_session_servers.close)


@functools.cache
def session_warm_orl() -> dict[str, str]:
    """The variables that send `orl()`'s commands to this test session's warm `orl` (pipelines/warm.py), started on
    first use, after the session's Ray: that start sets RAY_AUTH_MODE here, which the server must be started with."""
    session_ray()
    return _session_servers.enter_context(warm_orl())


@pytest.fixture(scope="session")
def ray_local() -> str:
    return session_ray()


@pytest.fixture(scope="session")
def expert_dataset(ray_local, tmp_path_factory) -> Path:
    """20 expert CartPole episodes (10,000 transitions) in 4 files."""
    from collectors.collect import collect

    path = tmp_path_factory.mktemp("data") / "cartpole-expert"
    collect("cartpole-expert", DatasetConfig(env="CartPole-v1", episodes=20, seed=3, policy=CARTPOLE_EXPERT),
            TINY_COLLECT, path)
    return path


@pytest.fixture(scope="session")
def mixture_dataset(ray_local, tmp_path_factory) -> Path:
    from collectors.collect import collect

    path = tmp_path_factory.mktemp("data") / "cartpole-medium"
    spec = DatasetConfig(env="CartPole-v1", episodes=12, seed=2, policy=mixture(CARTPOLE_EXPERT, 0.5))
    collect("cartpole-medium", spec, TINY_COLLECT, path)
    return path


@pytest.fixture(scope="session")
def pendulum_dataset(ray_local, tmp_path_factory) -> Path:
    """8 Pendulum episodes (continuous actions) of a half-random expert."""
    from collectors.collect import collect

    path = tmp_path_factory.mktemp("data") / "pendulum-medium"
    spec = DatasetConfig(env="Pendulum-v1", episodes=8, seed=4, policy=mixture(PENDULUM_EXPERT, 0.5))
    collect("pendulum-medium", spec, CollectConfig(episodes_per_task=4), path)
    return path


@contextmanager
def built_algorithm(algo: str, params, dataset_dir: Path):
    """The RLlib algorithm that trains `algo` with `params` on the dataset (seed 0), stopped afterwards."""
    from training.algorithms.registry import rllib_config

    algorithm = rllib_config(algo, params, dataset_dir, seed=0).build_algo()
    try:
        yield algorithm
    finally:
        algorithm.stop()


def train_columns(algorithm, rows: int) -> dict:
    """A batch of `rows` rows of an algorithm's train batches, as tensors named by column (no module prefix)."""
    return dict(algorithm.offline_data.sample(num_samples=rows)["default_policy"])


def write_frame_stacks(path: Path, channels_first: bool = True, episodes: int = 3, length: int = 9,
                       stack: int = 4, frame_shape: tuple[int, int] = (12, 10),
                       schema_version: int = dataset.SCHEMA_VERSION, one_file: bool = False) -> Path:
    """A dataset of random grey frames stacked as Gymnasium's FrameStackObservation stacks them (the first frame
    repeated before an episode's start), on the first axis or, with `channels_first` False, the last; each episode
    its own file, or with `one_file` all in one, where every episode starts from the same frame (as an Atari game's
    reset screen); as `schema_version` stores images."""
    rng = np.random.default_rng(0)
    shape = (stack, *frame_shape) if channels_first else (*frame_shape, stack)
    observation_space, action_space = gym.spaces.Box(0, 255, shape, np.uint8), gym.spaces.Discrete(3)
    schema = dataset.arrow_schema(observation_space, action_space, with_logp=False, schema_version=schema_version)

    def episode(eps_id: int) -> pa.Table:
        frames = rng.integers(0, 256, (length + 1, *frame_shape), dtype=np.uint8)
        if one_file:
            frames[0] = 0
        padded = np.concatenate([np.repeat(frames[:1], stack - 1, axis=0), frames])
        stacks = np.stack([padded[t:t + stack] for t in range(length + 1)])
        stacks = stacks if channels_first else np.moveaxis(stacks, 1, -1)
        return dataset.transitions_table({
            Col.EPS_ID: np.full(length, eps_id), Col.T: np.arange(length),
            Col.OBS: stacks[:-1].reshape(length, -1), Col.NEW_OBS: stacks[1:].reshape(length, -1),
            Col.ACTIONS: rng.integers(0, 3, length), Col.REWARDS: rng.normal(size=length).astype(np.float32),
            Col.TERMINATEDS: np.arange(length) == length - 1, Col.TRUNCATEDS: np.zeros(length, bool)}, schema)

    card = dataset.DatasetCard(
        name=path.name, env_id=None, observation_space=dataset.space_to_dict(observation_space),
        action_space=dataset.space_to_dict(action_space), behavior_policy={"kind": "logged"}, seed=None,
        episodes=episodes, transitions=0, returns={}, episode_length={}, files=[], columns=schema.names,
        code_version="tests", library_versions={}, schema_version=schema_version)
    dataset.write_tables((episode(i) for i in range(episodes)), path, card, file_bytes=2**30 if one_file else 1)
    return path


def copy_pipeline(root: Path) -> dict:
    """The project's pipeline (dvc.yaml, its ignore files and our packages) copied into `root`, for a real `dvc repro`
    there; returns the project's params.yaml, loaded, for the test to shrink and write."""
    for name in ("dvc.yaml", ".dvcignore", ".gitignore"):
        shutil.copy(REPO / name, root / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    return yaml.safe_load((REPO / "params.yaml").read_text())


def copy_dataset(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def orl(*args: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Runs the real `orl` command in a subprocess, forked from the session's warm `orl`, on the session's Ray unless
    `env` names a RAY_ADDRESS ("" for a Ray of its own): a Ray started and stopped, and the imports of a cold `orl`,
    would cost seconds each command."""
    warm = session_warm_orl()  # before the copy of os.environ: it starts the session's Ray, which sets RAY_AUTH_MODE
    env = {"RAY_ADDRESS": session_ray(), **os.environ, **warm, **(env or {})}
    return subprocess.run([ORL, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)


def run_benchmark(module: str, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    """Runs `python -m benchmarks.MODULE ARGS` from the repository's root, on the session's Ray."""
    env = {"RAY_ADDRESS": session_ray(), **os.environ}
    return subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=timeout)


def assert_minari_round_trip(workdir: Path, name: str, env, tmp_path: Path) -> None:
    """`orl datasets export` of workdir's datasets/NAME to a Minari store under tmp_path, then `orl datasets import`
    of it (with `env`) gives the same rows, less action_logp (Minari keeps no log-probabilities)."""
    store = {"MINARI_DATASETS_PATH": str(tmp_path / "minari")}
    result = orl("datasets", "export", f"datasets/{name}", "--to", "minari", "--id", f"orl/{name}-v0", cwd=workdir,
                 env=store)
    assert result.returncode == 0, result.stderr[-3000:]
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["imports"] = {f"{name}-back": {"format": "minari", "source": f"orl/{name}-v0", "env": env}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = orl("datasets", "import", f"{name}-back", "--out", str(tmp_path / "back"), cwd=tmp_path, env=store)
    assert result.returncode == 0, result.stderr[-3000:]
    original, back = dataset.load_table(workdir / "datasets" / name), dataset.load_table(tmp_path / "back")
    columns = [c for c in original.column_names if c != Col.ACTION_LOGP]
    original, back = original.select(columns), back.select(columns)
    assert back.schema == original.schema
    for column in columns:  # as arrays: each writer's dictionaries number the same frames in their own order
        np.testing.assert_array_equal(dataset.column_to_numpy(back[column]), dataset.column_to_numpy(original[column]))


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str, prog: str = "orl") -> None:
    """`orl` (or the script `prog`) failed as a user error should: exit 2, no traceback, one last line naming the
    problem."""
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{prog}: error: ") and "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in last


def kill_group(process: subprocess.Popen) -> None:
    """Kills what is left of a process started with start_new_session (its Ray processes), as a machine loss."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextmanager
def served(command: list[str], url: str, log_path: Path, env: dict | None = None):
    """Runs a server until the block ends, once `url` answers (any HTTP status)."""
    log = open(log_path, "w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                              cwd=log_path.parent)
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except urllib.error.HTTPError:
            break  # it answers
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"{command[0]} did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.3)
    try:
        yield
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def moto_server(port: int, log_path: Path, env: dict | None = None):
    """moto's standalone S3-compatible server on 127.0.0.1:`port`."""
    command = [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
    return served(command, f"http://127.0.0.1:{port}/", log_path, env)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> str:
    """A real S3-compatible server on loopback, the one S3_ENV points at; yields its endpoint URL."""
    endpoint = S3_ENV["AWS_ENDPOINT_URL"]
    with moto_server(int(endpoint.rsplit(":", 1)[1]), tmp_path_factory.mktemp("s3") / "moto.log"):
        yield endpoint


@pytest.fixture
def bucket(s3_server, request) -> str:
    """A new, empty bucket on the S3 server, named after the test."""
    import boto3

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + f"-{next(_bucket_numbers)}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


_bucket_numbers = itertools.count()


def upload(local: Path, bucket: str, prefix: str) -> str:
    """Copies a local dataset directory under s3://bucket/prefix; returns that URI."""
    import boto3

    for path in local.iterdir():
        boto3.client("s3").upload_file(str(path), bucket, f"{prefix}/{path.name}")
    return f"s3://{bucket}/{prefix}"


@pytest.fixture
def tracking_uri(monkeypatch):
    """Sets MLflow's tracking URI for one test; afterwards MLflow's global URI is unset and MLFLOW_TRACKING_URI
    put back. `mlflow.set_tracking_uri` alone would leave the variable set for the `orl` of every later test."""
    import mlflow

    def use(uri: str) -> None:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # recorded, so restored; set_tracking_uri sets it too
        mlflow.set_tracking_uri(uri)

    yield use
    mlflow.set_tracking_uri(None)  # before monkeypatch restores the variable, which this unsets


MLFLOW_BUCKET = "mlflow"


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory, s3_server):
    """A real `mlflow server` on 127.0.0.1 with a SQLite store and its artifacts in the S3 server's bucket
    `mlflow` (under mlartifacts/); clients reach both through the server alone. Stopped after the session."""
    import boto3

    boto3.client("s3").create_bucket(Bucket=MLFLOW_BUCKET)
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"http://127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", uri.rsplit(":", 1)[1],
               "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
               "--artifacts-destination", f"s3://{MLFLOW_BUCKET}/mlartifacts"]
    # Without the GenAI job runner: nine more processes that tracking never uses.
    env = {"MLFLOW_S3_ENDPOINT_URL": s3_server, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with served(command, f"{uri}/health", root / "server.log", env=env):
        yield uri
