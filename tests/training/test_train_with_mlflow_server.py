"""`orl train` and `orl evaluate` against a real MLflow server: params, metrics, inputs, models."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import yaml

import dataset_format as dataset
from collectors.collect import collect
from collectors.config import CollectConfig, DatasetConfig, PolicyConfig
from collectors.rollout import rollout_returns
from common.run_dir import read_csv
from evaluation.report import report
from tests.conftest import MLFLOW_BUCKET, PENDULUM_EXPERT, REPO, mixture, orl
from tracking import NEWEST_ALIAS, dvc_digest

pytestmark = pytest.mark.slow  # an MLflow server with its artifacts on the S3 server, and trainings

TINY_TRAINING = {"iterations": 3, "updates_per_iteration": 5, "batch_size": 256, "hidden_layers": [32, 32]}


@pytest.fixture(scope="module")
def trained_run(expert_dataset, mlflow_server, tmp_path_factory):
    """`orl train --algo bc` then `orl evaluate`, both as real subprocesses logging to the server."""
    work = tmp_path_factory.mktemp("work")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["algos"]["bc"].update(TINY_TRAINING)
    params["evaluate"].update(episodes=4)
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    env = {"MLFLOW_TRACKING_URI": mlflow_server}
    for args in (["train", "--algo", "bc", "--dataset", str(expert_dataset), "--out", "runs/bc"],
                 ["reference"],
                 ["evaluate", "runs/bc"]):
        result = orl(*args, cwd=work, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
    return work / "runs" / "bc", mlflow_server


def test_run_has_params_metrics_tags_and_dataset_input(trained_run, expert_dataset):
    from mlflow import MlflowClient

    run_dir, uri = trained_run
    info = json.loads((run_dir / "run.json").read_text())
    client = MlflowClient(uri)
    run = client.get_run(info["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["algo"] == "bc" and run.data.params["lr"] == "0.001"
    assert run.data.params["dataset.transitions"] == "10000"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "policy_loss")] == [1, 2, 3]
    assert run.data.tags["dvc.dataset_digest"] == dvc_digest(expert_dataset)
    assert len(run.data.tags["git_commit"]) in (40, len("unknown"))
    assert run.data.metrics["eval/episodes"] == 4 and "eval/normalized_score" in run.data.metrics
    assert run.data.tags["eval.actions"] == "greedy"
    assert json.loads((run_dir / "eval.json").read_text())["sampled_actions"] is False
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.name == "cartpole-expert"
    assert dataset_input.dataset.digest == dvc_digest(expert_dataset)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert artifacts == {"plots/learning_curve.png", "plots/eval_returns.png"}


def test_evaluate_samples_bcs_actions_when_asked(trained_run, ray_local, tmp_path):
    from mlflow import MlflowClient

    run_dir, uri = trained_run
    work = run_dir.parent.parent
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["evaluate"]["sample_actions"] = True
    (work / "sampled.yaml").write_text(yaml.safe_dump(params))
    result = orl("--params", "sampled.yaml", "evaluate", "runs/bc", cwd=work, env={"MLFLOW_TRACKING_URI": uri})
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run_dir / "eval.json").read_text())["sampled_actions"] is True
    # The returns are those of the checkpoint's policy sampling its actions on the evaluation seeds.
    evaluate = params["evaluate"]
    expected = rollout_returns("CartPole-v1", PolicyConfig(kind="model", model=str(run_dir / "checkpoint")),
                               evaluate["seed"], evaluate["episodes"], evaluate["num_workers"], label="expected").returns
    assert [r["return"] for r in read_csv(run_dir / "eval_returns.csv")] == pytest.approx(list(expected))
    info = json.loads((run_dir / "run.json").read_text())
    assert MlflowClient(uri).get_run(info["mlflow_run_id"]).data.tags["eval.actions"] == "sampled"
    summary = report(work / "runs", work / "references", tmp_path / "reports").read_text()
    assert "| cartpole-expert | bc (sampled) |" in summary


def test_registered_model_predicts_and_acts_in_the_env(trained_run, tracking_uri):
    import mlflow.pyfunc

    from common.trained_policy import ModulePolicy, load_rl_module

    run_dir, uri = trained_run
    tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/CartPole-v1-bc@{NEWEST_ALIAS}")
    assert model.metadata.signature.inputs.inputs[0].shape == (-1, 4)
    checkpoint_policy = ModulePolicy(load_rl_module(run_dir / "checkpoint"), gym.spaces.Discrete(2), greedy=True)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    for _ in range(10):  # the tiny training budget does not promise a good policy; see test_dvc_pipeline
        batch = obs[None].astype(np.float32)
        (action,) = model.predict(batch)
        assert env.action_space.contains(int(action))
        assert action == checkpoint_policy.act(batch, [], [])[0][0]  # the same policy as the checkpoint
        obs, _, terminated, truncated, _ = env.step(int(action))
        if terminated or truncated:
            obs, _ = env.reset()
    same = mlflow.pyfunc.load_model("models:/CartPole-v1-bc@cartpole-expert")
    batch = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    np.testing.assert_array_equal(model.predict(batch), same.predict(batch))


def test_artifacts_live_in_the_bucket_and_another_process_loads_the_model_by_alias(trained_run, tmp_path):
    import boto3

    run_dir, uri = trained_run
    info = json.loads((run_dir / "run.json").read_text())
    keys = [o["Key"] for page in boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=MLFLOW_BUCKET)
            for o in page.get("Contents", [])]
    assert any(key.startswith("mlartifacts/") and key.endswith("MLmodel") for key in keys)
    assert any(key.endswith("plots/learning_curve.png") for key in keys)
    # A process that knows only the tracking server: no AWS credentials, no endpoint, another directory.
    script = ("import mlflow.pyfunc, numpy as np; "
              "m = mlflow.pyfunc.load_model('models:/CartPole-v1-bc@cartpole-expert'); "
              "print(m.predict(np.zeros((3, 4), dtype=np.float32)).tolist())")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_S3"))}
    result = subprocess.run([sys.executable, "-c", script], check=False, cwd=tmp_path, capture_output=True, text=True,
                            env={**env, "MLFLOW_TRACKING_URI": uri}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    actions = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(actions) == 3 and set(actions) <= {0, 1}
    assert info["registered_model"]["name"] == "CartPole-v1-bc"


def test_experiments_open_on_the_model_training_views(trained_run):
    from mlflow import MlflowClient

    _, uri = trained_run
    experiment = MlflowClient(uri).get_experiment_by_name("CartPole-v1")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


@pytest.mark.parametrize("source", ["checkpoint", "mlflow"])
def test_a_trained_policy_generates_the_next_dataset(trained_run, ray_local, tmp_path, monkeypatch, source):
    run_dir, uri = trained_run
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    model = str(run_dir / "checkpoint") if source == "checkpoint" else f"models:/CartPole-v1-bc@{NEWEST_ALIAS}"
    spec = DatasetConfig(env="CartPole-v1", episodes=4, seed=9, policy=PolicyConfig(kind="model", model=model))
    card = collect("from-model", spec, CollectConfig(episodes_per_task=2), tmp_path / "ds")
    assert card.episodes == 4 and card.behavior_policy["model"] == model
    logp = dataset.load_arrays(tmp_path / "ds")["action_logp"]
    if source == "checkpoint":  # sampled from the policy's distribution: real log-probabilities
        assert np.all(logp <= 0) and np.any(logp < 0)
    else:  # the MLflow model acts greedily: deterministic
        assert np.all(logp == 0)


@pytest.fixture(scope="module")
def q_learning_runs(trained_run, expert_dataset, ray_local, tmp_path_factory):
    """`orl train` of the Q-learning algorithms against the same server: DQN, conservative DQN and IQL (discrete)
    on CartPole, CQL on a small Pendulum dataset."""
    work, uri = trained_run[0].parent.parent, trained_run[1]
    pendulum = tmp_path_factory.mktemp("pendulum") / "pendulum-medium"
    collect("pendulum-medium", DatasetConfig(env="Pendulum-v1", episodes=4, seed=3,
                                             policy=mixture(PENDULUM_EXPERT, 0.3)),
            CollectConfig(episodes_per_task=2), pendulum)
    params = yaml.safe_load((work / "params.yaml").read_text())
    for algo in ("dqn", "cql_dqn", "cql", "iql"):
        params["algos"][algo].update(TINY_TRAINING)
    params["algos"]["iql"]["per_dataset"] = {"cartpole-expert": {"beta": 0.5}}
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    runs = {}
    trainings = (("dqn", expert_dataset), ("cql_dqn", expert_dataset), ("cql", pendulum), ("iql", expert_dataset))
    for algo, data in trainings:
        result = orl("train", "--algo", algo, "--dataset", str(data), "--out", f"runs/{algo}", cwd=work,
                     env={"MLFLOW_TRACKING_URI": uri})
        assert result.returncode == 0, result.stderr[-3000:]
        runs[algo] = work / "runs" / algo
    return runs, uri


def test_a_runs_params_are_its_datasets_per_dataset_values(q_learning_runs):
    from mlflow import MlflowClient

    runs, uri = q_learning_runs
    logged = MlflowClient(uri).get_run(json.loads((runs["iql"] / "run.json").read_text())["mlflow_run_id"]).data.params
    assert logged["beta"] == "0.5" and logged["expectile"] == "0.7" and "per_dataset" not in logged


@pytest.mark.parametrize("algo,env_id", [("dqn", "CartPole-v1"), ("cql_dqn", "CartPole-v1"), ("cql", "Pendulum-v1"),
                                         ("iql", "CartPole-v1")])
def test_every_q_learning_model_predicts_the_checkpoints_greedy_actions(q_learning_runs, algo, env_id, tracking_uri):
    import mlflow.pyfunc

    from common.envs import env_spaces
    from common.trained_policy import ModulePolicy, load_rl_module

    runs, uri = q_learning_runs
    tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/{env_id}-{algo}@{NEWEST_ALIAS}")
    observation_space, action_space = env_spaces(env_id)
    checkpoint_policy = ModulePolicy(load_rl_module(runs[algo] / "checkpoint"), action_space, greedy=True)
    batch = np.stack([observation_space.sample() for _ in range(16)]).astype(np.float32)
    actions = np.asarray(model.predict(batch))
    assert all(action_space.contains(a.astype(action_space.dtype)) for a in actions)
    np.testing.assert_allclose(actions, checkpoint_policy.act(batch, [], [])[0], rtol=1e-5)
    curve = (runs[algo] / "learning_curve.csv").read_text().splitlines()
    assert curve[0].startswith("iteration,loss,") and "qf_loss" in curve[0]
