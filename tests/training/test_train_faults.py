"""Faults during training: kill -9 then re-run resumes; SIGTERM marks the MLflow run failed; an unreachable
tracking server fails in seconds; concurrent writers to one SQLite store lose nothing."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import REPO, assert_user_error, kill_group, orl

pytestmark = pytest.mark.slow  # trainings killed, stopped and resumed

ITERATIONS = 6


@pytest.fixture
def workdir(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["algos"]["bc"].update(iterations=ITERATIONS, updates_per_iteration=5, batch_size=256, hidden_layers=[32])
    params["train"]["checkpoint_every"] = 2
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return tmp_path


def tracking_env(workdir) -> dict:
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"}


def start_training(workdir, dataset, after_line: str) -> subprocess.Popen:
    """Starts `orl train` and returns once its stderr shows `after_line`."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "train", "--algo", "bc", "--dataset", str(dataset), "--out", "run"],
        cwd=workdir, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True,
        env={**os.environ, **tracking_env(workdir)})
    seen = []
    for line in process.stderr:
        if after_line in line:
            return process
        seen.append(line)
    raise AssertionError(f"training ended (rc {process.wait()}) before '{after_line}'; its stderr ended:\n"
                         + "".join(seen[-20:]))


def client(workdir):
    from mlflow import MlflowClient

    return MlflowClient(tracking_env(workdir)["MLFLOW_TRACKING_URI"])


def test_killed_training_resumes_from_its_last_checkpoint(workdir, expert_dataset):
    process = start_training(workdir, expert_dataset, f"iteration 3/{ITERATIONS}")
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    kill_group(process)
    state = json.loads((workdir / "run" / ".resume" / "checkpoint" / "orl_resume.json").read_text())
    assert len(state["curve"]) == 2

    result = orl("train", "--algo", "bc", "--dataset", str(expert_dataset), "--out", "run", cwd=workdir,
                 env=tracking_env(workdir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming after iteration 2" in result.stderr
    info = json.loads((workdir / "run" / "run.json").read_text())
    assert info["mlflow_run_id"] == state["mlflow_run_id"]  # the same MLflow run, continued
    run = client(workdir).get_run(info["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    steps = {m.step for m in client(workdir).get_metric_history(run.info.run_id, "policy_loss")}
    assert steps == set(range(1, ITERATIONS + 1))
    assert not (workdir / "run" / ".resume").exists()
    curve = (workdir / "run" / "learning_curve.csv").read_text().splitlines()
    assert len(curve) == 1 + ITERATIONS


def test_sigterm_marks_the_mlflow_run_failed(workdir, expert_dataset):
    process = start_training(workdir, expert_dataset, f"iteration 1/{ITERATIONS}")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM  # unwound and exited, not aborted by Ray's handler
    stderr = process.stderr.read()
    kill_group(process)
    assert "SIGTERM received" not in stderr, stderr[-3000:]  # Ray's stack dump, at error level
    (run,) = client(workdir).search_runs([client(workdir).get_experiment_by_name("CartPole-v1").experiment_id])
    assert run.info.status == "FAILED"
    assert not (workdir / "run" / "run.json").exists()
    assert not client(workdir).search_registered_models()  # nothing registered for a run that did not finish


def test_an_unreachable_tracking_server_fails_in_seconds(workdir, expert_dataset):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    started = time.monotonic()
    result = orl("train", "--algo", "bc", "--dataset", str(expert_dataset), "--out", "run", cwd=workdir,
                 env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{closed_port}"})
    assert time.monotonic() - started < 30
    assert_user_error(result, f"MLflow tracking server http://127.0.0.1:{closed_port} does not answer")
    assert not (workdir / "run").exists()


def _log_like_a_training_run(args) -> str:
    """What `orl train` does with MLflow, minus the training: experiment, params, metrics, model, aliases."""
    tracking_uri, dataset_dir, module_dir, index = args
    os.environ["MLFLOW_TRACKING_URI"] = tracking_uri
    import mlflow

    import tracking
    from dataset_format import read_card

    card = read_card(dataset_dir)
    experiment_id = tracking.use_experiment(card.env_id)
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_params({"index": index, "lr": 0.001})
        for step in range(1, 21):
            mlflow.log_metrics({"policy_loss": 1.0 / step, "vf_loss": float(index)}, step=step)
        tracking.log_policy_model(card, module_dir, "bc")
        return run.info.run_id


def test_four_concurrent_writers_to_one_sqlite_store_lose_nothing(tmp_path, expert_dataset, monkeypatch):
    from ray.rllib.algorithms.bc import BCConfig

    monkeypatch.chdir(tmp_path)  # the writers' artifacts go to ./mlartifacts beside the store
    from dataset_format import read_card

    observation_space, action_space = read_card(expert_dataset).spaces
    module = BCConfig().environment(observation_space=observation_space, action_space=action_space) \
        .get_rl_module_spec().build()
    module.save_to_path(tmp_path / "module")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    jobs = [(uri, str(expert_dataset), str(tmp_path / "module"), i) for i in range(4)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        run_ids = pool.map(_log_like_a_training_run, jobs)

    from mlflow import MlflowClient

    store = MlflowClient(uri)
    assert len(set(run_ids)) == 4
    for run_id in run_ids:
        run = store.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.001"
        assert len(store.get_metric_history(run_id, "policy_loss")) == 20
    versions = store.search_model_versions("name='CartPole-v1-bc'")
    assert sorted(int(v.version) for v in versions) == [1, 2, 3, 4]
    assert {v.run_id for v in versions} == set(run_ids)
