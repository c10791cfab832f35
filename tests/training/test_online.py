"""`orl train-online`: PPO trained online until the target score, its checkpoint a behaviour policy to collect with
and every episode it trained on a dataset (the replay); a target not reached in the step budget is an error that
writes nothing."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import yaml
from mlflow import MlflowClient

import dataset_format as dataset
from collectors.collect import collect
from collectors.config import CollectConfig, DatasetConfig, PolicyConfig
from collectors.rollout import rollout_returns
from common.observations import ModelInput
from common.trained_policy import load_rl_module
from common.errors import UserError
from evaluation.config import EvaluateConfig
from tests.conftest import REPO, USER_CODE, orl
from training.config import OnlinePolicyConfig
from training.online import (NORMALIZING_STEPS, latest_mean, network_input, random_play_observations,
                             train_online)

pytestmark = pytest.mark.slow  # PPO trained online

EVALUATE = EvaluateConfig()
# Small PPO iterations, so the target is checked often.
TINY = dict(env="CartPole-v1", seed=0, batch_size=1000, minibatch_size=100, epochs=5, score_episodes=10)
FILE_BYTES = 2**20


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A directory holding CartPole's references, with MLflow's SQLite store and artifacts inside it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    reference = {"env_id": "CartPole-v1", "seed": EVALUATE.seed, "episodes": EVALUATE.episodes,
                 "random": {"mean": 22.0}, "expert": {"mean": 500.0}}
    (tmp_path / "references").mkdir()
    (tmp_path / "references" / "CartPole-v1.json").write_text(json.dumps(reference))
    return tmp_path


def test_trains_to_the_target_and_collects_with_the_policy(ray_local, workdir):
    config = OnlinePolicyConfig(target_score=10, max_env_steps=50_000, **TINY)  # a return of about 70
    final = train_online("cartpole-ppo", config, workdir / "references", EVALUATE, workdir / "runs" / "ppo",
                         workdir / "datasets" / "cartpole-ppo-replay", FILE_BYTES)

    assert final["normalized_score"] >= 10 and final["episodes"] >= 10
    # The replay: every episode that finished while PPO trained, whole, as RLlib counted them.
    replay = dataset.validate(workdir / "datasets" / "cartpole-ppo-replay")
    assert replay.episodes == final["episodes"] and replay.transitions <= final["env_steps"]
    assert replay.behavior_policy["kind"] == "logged" and replay.env_id == "CartPole-v1"
    assert replay.returns["mean"] == pytest.approx(replay.episode_length["mean"])  # CartPole: 1 a step
    assert json.loads((workdir / "runs" / "ppo" / "train_metrics.json").read_text()) == final
    curve = (workdir / "runs" / "ppo" / "learning_curve.csv").read_text().splitlines()
    assert curve[0].startswith("iteration,env_steps,episodes,return_mean,normalized_score")
    assert len(curve) - 1 == final["env_steps"] // 1000
    [run] = MlflowClient().search_runs([MlflowClient().get_experiment_by_name("CartPole-v1").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["target_score"] == "10"
    assert run.data.tags["purpose"] == "behaviour policy"
    assert run.data.metrics["normalized_score"] == pytest.approx(final["normalized_score"])

    # The pipeline's collect_from_policy: the checkpoint samples its actions, and the card knows their log-probs.
    spec = DatasetConfig(env="CartPole-v1", episodes=10, seed=5,
                         policy=PolicyConfig(kind="model", model=str(workdir / "runs" / "ppo" / "checkpoint")))
    card = collect("cartpole-ppo", spec, CollectConfig(episodes_per_task=5), workdir / "datasets" / "cartpole-ppo")
    assert card.episodes == 10 and card.returns["mean"] > 22
    logp = dataset.load_arrays(workdir / "datasets" / "cartpole-ppo")[dataset.Col.ACTION_LOGP]
    assert np.all(logp <= 0) and logp.std() > 0  # a stochastic policy, neither greedy nor uniform


def test_normalized_observations_travel_with_the_checkpoint(ray_local, workdir):
    """`normalize_observations`: PPO's network sees observations normalized by random play's statistics, the
    checkpoint keeps them, so that collection feeds it the env's own observations through them, and the replay holds
    the env's own."""
    config = OnlinePolicyConfig(target_score=10, max_env_steps=50_000, normalize_observations=True, **TINY)
    final = train_online("cartpole-ppo", config, workdir / "references", EVALUATE, workdir / "runs" / "ppo",
                         workdir / "datasets" / "cartpole-ppo-replay", FILE_BYTES)
    assert final["normalized_score"] >= 10

    checkpoint = workdir / "runs" / "ppo" / "checkpoint"
    statistics = ModelInput.normalizing(random_play_observations(config.env, NORMALIZING_STEPS, config.seed))
    assert ModelInput.of_module(load_rl_module(checkpoint)) == statistics
    assert max(statistics.std) > 5 * min(statistics.std)  # CartPole's velocities vary far more than its angle
    replay = dataset.load_arrays(workdir / "datasets" / "cartpole-ppo-replay")
    assert np.abs(replay[dataset.Col.OBS][replay[dataset.Col.T] == 0]).max() <= 0.05  # CartPole's own resets
    spec = DatasetConfig(env="CartPole-v1", episodes=10, seed=5,
                         policy=PolicyConfig(kind="model", model=str(checkpoint)))
    card = collect("cartpole-ppo", spec, CollectConfig(episodes_per_task=5), workdir / "datasets" / "cartpole-ppo")
    assert card.returns["mean"] > 22  # random play's


def test_normalizing_images_is_refused_in_one_line():
    config = OnlinePolicyConfig(target_score=10, max_env_steps=1000, normalize_observations=True, **TINY)
    with pytest.raises(UserError, match=r"CartPole-v1: normalize_observations is for vector observations, not Box"):
        network_input(config, gym.spaces.Box(0, 255, (4, 8, 8), np.uint8))


def test_a_target_met_before_any_episode_ends_fails_and_writes_nothing(ray_local, workdir):
    # Held-out episodes score the policy after the first iteration, whose 50 steps finish no training episode.
    reference = {"env_id": "Pendulum-v1", "seed": EVALUATE.seed, "episodes": EVALUATE.episodes,
                 "random": {"mean": -1200.0}, "expert": {"mean": -150.0}}
    (workdir / "references" / "Pendulum-v1.json").write_text(json.dumps(reference))
    config = OnlinePolicyConfig(target_score=-100, max_env_steps=50_000, held_out_episodes=2,
                                **{**TINY, "env": "Pendulum-v1", "batch_size": 50, "minibatch_size": 50})
    with pytest.raises(UserError, match=r"online_policies.pendulum-ppo: the target was met before any training "
                                        r"episode finished, so the replay would be empty"):
        train_online("pendulum-ppo", config, workdir / "references", EVALUATE, workdir / "runs" / "ppo",
                     workdir / "datasets" / "pendulum-ppo-replay", FILE_BYTES)
    assert not (workdir / "runs" / "ppo").exists() and not (workdir / "datasets").exists()


def test_held_out_episodes_score_the_checkpoint_that_stops_training(ray_local, workdir):
    config = OnlinePolicyConfig(target_score=10, max_env_steps=50_000, held_out_episodes=10, **TINY)
    final = train_online("cartpole-ppo", config, workdir / "references", EVALUATE, workdir / "runs" / "ppo",
                         workdir / "datasets" / "cartpole-ppo-replay", FILE_BYTES)

    assert final["normalized_score"] >= 10
    assert final["normalized_score"] == pytest.approx(100 * (final["held_out_return_mean"] - 22) / (500 - 22))
    curve = (workdir / "runs" / "ppo" / "learning_curve.csv").read_text().splitlines()
    assert curve[0] == ("iteration,env_steps,episodes,return_mean,held_out_return_mean,training_score,"
                        "normalized_score,time_s")
    # The saved checkpoint is the policy that was scored: its episodes on the held-out seeds return the same.
    checkpoint = PolicyConfig(kind="model", model=str(workdir / "runs" / "ppo" / "checkpoint"))
    returns = rollout_returns("CartPole-v1", checkpoint, config.held_out_seed, config.held_out_episodes,
                              num_workers=1, label="re-score").returns
    assert returns.mean() == pytest.approx(final["held_out_return_mean"])


def test_the_score_averages_the_latest_iterations_holding_enough_episodes():
    finished = [(4, -500.0), (2, -300.0), (3, -100.0)]  # (episodes, mean return) per iteration, oldest first
    assert latest_mean(finished, 3) == (3, -100.0)
    assert latest_mean(finished, 4) == (5, -180.0)
    assert latest_mean(finished, 20) == (9, pytest.approx(-2900 / 9))
    assert latest_mean([], 5)[0] == 0


def test_a_target_out_of_reach_fails_and_writes_nothing(ray_local, workdir):
    config = OnlinePolicyConfig(target_score=99, max_env_steps=2_000, **TINY)
    with pytest.raises(UserError, match=r"online_policies.cartpole-ppo: PPO reached .* in [\d,]+ env steps, short of "
                                        r"target_score 99.*raise max_env_steps or lower target_score"):
        train_online("cartpole-ppo", config, workdir / "references", EVALUATE, workdir / "runs" / "ppo",
                     workdir / "datasets" / "cartpole-ppo-replay", FILE_BYTES)
    assert not (workdir / "runs" / "ppo").exists() and not (workdir / "datasets").exists()
    [run] = MlflowClient().search_runs([MlflowClient().get_experiment_by_name("CartPole-v1").experiment_id])
    assert run.info.status == "FAILED"


def test_ppo_learns_from_frames_and_collects_them_raw(tmp_path):
    """A user's image env (uint8 frames, channels first as a frame stack is): PPO's CNN sees them as the offline
    learners do, and its checkpoint collects the raw frames, as `dvc repro`'s stages run it."""
    pixels = {"entry_point": "corridor_sim.env:PixelCorridorEnv", "kwargs": {"length": 6}, "max_episode_steps": 30,
              "name": "PixelCorridor"}
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params.update(datasets={}, imports={}, train={**params["train"], "runs": {}},
                  references={"PixelCorridor": {"ceiling": {"kind": "callable",
                                                            "callable": "corridor_sim.control:walk_right"}}},
                  online_policies={"pixel-ppo": {
                      "env": pixels, "target_score": 60, "max_env_steps": 40_000, "seed": 0, "batch_size": 500,
                      "minibatch_size": 100, "epochs": 5, "score_episodes": 20, "hidden_layers": [32],
                      "conv_filters": [[8, 3, 2], [16, 3, 2]], "envs_per_env_runner": 2}},
                  policy_datasets={"pixel-learned": {
                      "env": pixels, "episodes": 20, "seed": 5,
                      "policy": {"kind": "model", "model": "runs/ppo-pixel-ppo/checkpoint"}}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    user_shell = {"PYTHONPATH": str(USER_CODE), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    for command in (["reference"], ["train-online", "pixel-ppo"], ["collect", "pixel-learned"]):
        result = orl(*command, cwd=tmp_path, env=user_shell, timeout=900)
        assert result.returncode == 0, f"{command}: {result.stderr[-3000:]}"

    metrics = json.loads((tmp_path / "runs" / "ppo-pixel-ppo" / "train_metrics.json").read_text())
    assert metrics["normalized_score"] >= 60
    # The CNN took channels-last frames in [0, 1], and the checkpoint says how to make them from the env's.
    module = load_rl_module(tmp_path / "runs" / "ppo-pixel-ppo" / "checkpoint")
    assert module.observation_space.shape == (8, 8, 2) and module.observation_space.high.max() == 1.0
    assert ModelInput.of_module(module) == ModelInput((2, 8, 8), channels_first=True, scale=1 / 255)
    card = dataset.validate(tmp_path / "datasets" / "pixel-learned")
    observations, _ = card.spaces
    assert observations.shape == (2, 8, 8) and observations.dtype == np.uint8  # stored as the env gives them
    random_return = json.loads((tmp_path / "references" / "PixelCorridor.json").read_text())["random"]["mean"]
    assert card.returns["mean"] > random_return + 10  # the policy walks right, as it learned to from the frames
    # The replay holds the frames as the env gave them too, not as the network saw them.
    replay = dataset.validate(tmp_path / "datasets" / "pixel-ppo-replay")
    assert replay.episodes == metrics["episodes"] and replay.spaces[0] == observations
