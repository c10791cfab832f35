"""MLflow tracking: the dataset's DVC digest, failing fast on a server that does not answer, experiments."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import yaml
from mlflow import MlflowClient

import tracking
from common.errors import UserError

DVC = str(Path(sys.executable).parent / "dvc")


@pytest.fixture
def tracking_env(monkeypatch):
    """Sets MLFLOW_TRACKING_URI for one test; afterwards MLflow's global URI (which `connect` sets) is unset and
    the environment variable put back."""
    import mlflow

    yield lambda uri: monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(None)  # before monkeypatch restores the variable, which this unsets


def dvc_add_md5(repo: Path, data: Path) -> str:
    """The hash `dvc add` records for a directory, in a fresh git + DVC repository."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, env=env)
    subprocess.run([DVC, "init", "-q"], cwd=repo, check=True, env=env, capture_output=True)
    subprocess.run([DVC, "add", "-q", data.name], cwd=repo, check=True, env=env, capture_output=True)
    [out] = yaml.safe_load((repo / f"{data.name}.dvc").read_text())["outs"]
    return out["md5"]


def test_dvc_digest_is_the_hash_dvc_records_for_the_dataset(expert_dataset, tmp_path):
    digest = tracking.dvc_digest(expert_dataset)
    assert digest.endswith(".dir") and len(digest) == 32 + 4

    repo = tmp_path / "repo"
    repo.mkdir()
    data = shutil.copytree(expert_dataset, repo / "cartpole-expert")
    assert tracking.dvc_digest(data) == digest  # content and names, not the directory's location
    assert dvc_add_md5(repo, data) == digest


def test_dvc_digest_changes_with_the_contents(expert_dataset, tmp_path):
    data = shutil.copytree(expert_dataset, tmp_path / "copy")
    before = tracking.dvc_digest(data)
    card = data / "_card.json"
    card.write_text(card.read_text() + " ")
    assert tracking.dvc_digest(data) != before


def _silent_server():
    """A socket that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server


def test_connect_to_a_refused_port_fails_at_once_naming_the_uri(tracking_env):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    tracking_env(uri)
    started = time.monotonic()
    with pytest.raises(UserError, match=f"MLflow tracking server {uri} does not answer"):
        tracking.connect()
    assert time.monotonic() - started < 5


def test_connect_to_a_server_that_never_answers_fails_within_seconds(tracking_env):
    with _silent_server() as server:
        uri = f"http://127.0.0.1:{server.getsockname()[1]}"
        tracking_env(uri)
        started = time.monotonic()
        with pytest.raises(UserError) as err:
            tracking.connect()
        elapsed = time.monotonic() - started
    assert uri in str(err.value) and "MLFLOW_TRACKING_URI" in str(err.value)
    assert elapsed < 15  # MLflow's own client would retry for minutes


def test_connect_returns_the_uri_and_creates_a_sqlite_store(tmp_path, tracking_env):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    tracking_env(uri)
    assert tracking.connect() == uri
    assert mlflow.get_tracking_uri() == uri
    assert (tmp_path / "store" / "mlflow.db").is_file()


def test_use_experiment_creates_it_once_and_returns_the_same_id(tmp_path, monkeypatch, tracking_env):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking_env(uri)

    first = tracking.use_experiment("CartPole-v1")
    second = tracking.use_experiment("CartPole-v1")
    assert first == second
    named = [e for e in MlflowClient(uri).search_experiments() if e.name == "CartPole-v1"]
    assert [e.experiment_id for e in named] == [first]
    # With a SQLite store, artifacts go to ./mlartifacts beside it.
    assert named[0].artifact_location == (tmp_path / "mlartifacts").resolve().as_uri()
    # Another name is another experiment.
    assert tracking.use_experiment("Pendulum-v1") != first
