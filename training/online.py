"""`orl train-online`: a behaviour policy trained online with RLlib's PPO, stopped at a target score, and the
experience it trained on.

D4RL's "medium" datasets sample a policy trained online part of the way. Such a policy's most likely actions
are its own, not an expert's, so cloning its data copies a weak policy, unlike an epsilon-mixture of the
expert, whose most likely action is always the expert's. `collect_from_policy` samples the checkpoint. Every
episode PPO sampled on the way is D4RL's "medium-replay" (training/replay.py).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import gymnasium as gym
import mlflow
import numpy as np

import dataset_format as dataset
import tracking
from collectors.config import PolicyConfig
from collectors.rollout import EpisodeRunner
from common import plots
from common.envs import EnvSpec, make_env, provider_versions
from common.errors import UserError, refuse_to_overwrite
from common.observations import MODEL_INPUT_KEY, ModelInput, is_image, is_mapped, model_space
from common.run_dir import RunDir, write_csv, write_json
from common.trained_policy import ModulePolicy
from dataset_format import Col, column_to_numpy, episode_stats
from evaluation.config import EvaluateConfig
from evaluation.references import no_score_reason, normalized_score, read_reference
from training.config import OnlinePolicyConfig
from training.replay import RAW_OBSERVATION, record_samples, take_recorded, write_replay

# The learning curve's column that the stop rule reads (dvc.yaml plots it).
SCORE = "normalized_score"
# RLlib reports the mean return of the episodes that finished in each iteration, over at most this many.
EPISODES_PER_ITERATION_MEAN = 100_000


# Random-play steps whose observations' means and deviations `normalize_observations` takes.
NORMALIZING_STEPS = 10_000


def network_input(config: OnlinePolicyConfig, observation_space: gym.Space) -> ModelInput | None:
    """How the network sees the env's observations: images and Discrete ones as the offline learners' batches
    do (channels-last frames in [0, 1], one-hot integers); vectors normalized by random play's statistics where
    `normalize_observations` asks, else as they are (None)."""
    if config.normalize_observations:
        if is_mapped(observation_space):
            raise UserError(f"{config.env.label}: normalize_observations is for vector observations, not "
                            f"{observation_space}; remove it (images are scaled to [0, 1] already)")
        return ModelInput.normalizing(random_play_observations(config.env, NORMALIZING_STEPS, config.seed))
    return ModelInput.of(observation_space) if is_mapped(observation_space) else None


def random_play_observations(env: EnvSpec, steps: int, seed: int) -> np.ndarray:
    """The observations of at least `steps` steps of uniformly random actions, in seeded episodes as collection
    seeds them."""
    runner, tables, rows = EpisodeRunner(env, PolicyConfig(kind="random"), seed, num_envs=1), [], 0
    while rows < steps:
        tables.append(runner.run([len(tables)]))
        rows += tables[-1].num_rows
    return np.concatenate([column_to_numpy(table[Col.OBS]) for table in tables])


def rllib_env(env: EnvSpec, model_input: ModelInput | None) -> str:
    """The name RLlib's env runners make the env by: a plain registered id whose observations the network takes as
    they are (gymnasium makes it, as it always has for the suite's policies), any other through a creator
    registered with Ray Tune."""
    if env.is_plain_id and model_input is None:
        return env.id
    from ray.tune.registry import register_env

    name = f"orl:{env.label}"
    register_env(name, lambda _: make_env(env) if model_input is None
                 else _AsNetworkSeesIt(make_env(env), model_input))
    return name


class _AsNetworkSeesIt(gym.Wrapper):
    """The env's observations mapped to the network's input, each of its own kept in the step's info for the
    replay."""

    def __init__(self, env: gym.Env, model_input: ModelInput):
        super().__init__(env)
        self.model_input = model_input
        self.observation_space = model_space(env.observation_space, model_input)

    def _mapped(self, obs, info: dict) -> tuple[np.ndarray, dict]:
        return self.model_input(np.asarray(obs)[None])[0], {**info, RAW_OBSERVATION: obs}

    def reset(self, **kwargs):
        return self._mapped(*self.env.reset(**kwargs))

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        obs, info = self._mapped(obs, info)
        return obs, reward, terminated, truncated, info


def ppo_config(config: OnlinePolicyConfig, observation_space: gym.Space, model_input: ModelInput | None):
    """PPO's config, its network seeing the env's observations through `model_input` (`network_input`)."""
    from ray.rllib.algorithms.ppo import PPOConfig

    model_config = {"fcnet_hiddens": list(config.hidden_layers)}
    if is_image(observation_space):
        model_config["conv_filters"] = config.conv_filters
    if model_input is not None:
        # The checkpoint keeps the map, so collect_from_policy's ModulePolicy feeds it the env's raw observations.
        model_config[MODEL_INPUT_KEY] = dataclasses.asdict(model_input)
    return (
        PPOConfig()
        .environment(rllib_env(config.env, model_input))
        .env_runners(num_env_runners=config.env_runners, num_envs_per_env_runner=config.envs_per_env_runner)
        .training(lr=config.lr, train_batch_size_per_learner=config.batch_size,
                  minibatch_size=config.minibatch_size, num_epochs=config.epochs)
        .rl_module(model_config=model_config)
        .reporting(metrics_num_episodes_for_smoothing=EPISODES_PER_ITERATION_MEAN)
        .callbacks(on_sample_end=record_samples)
        .debugging(seed=config.seed)
    )


def train_online(name: str, config: OnlinePolicyConfig, references_dir: str | Path, evaluate: EvaluateConfig,
                 out_dir: str | Path, replay_out: str | Path, file_bytes: int) -> dict:
    """Trains until the mean return of the latest `score_episodes` training episodes (see `latest_mean`), or of
    the held-out episodes after an iteration, reaches the target score; writes the checkpoint,
    train_metrics.json, the learning curve, and every finished episode it trained on to `replay_out` (a dataset
    named NAME-replay, in files of about `file_bytes`). Raises UserError, writing nothing, if `max_env_steps`
    pass first."""
    run = RunDir(Path(out_dir))
    refuse_to_overwrite(run.checkpoint)
    replay_out = dataset.refuse_existing(replay_out)
    probe = make_env(config.env)  # a bad spec or a missing extra (Box2D) fails here, not inside an env runner
    spaces, providers = (probe.observation_space, probe.action_space), provider_versions(probe)
    probe.close()
    observation_space = spaces[0]
    reference = read_reference(references_dir, config.env.label, evaluate)
    if normalized_score(0.0, reference) is None:
        raise UserError(f"online_policies.{name}: its target is a normalized score, but "
                        f"{no_score_reason(config.env.label)}")
    # An image whose channel axis is unclear, or normalized, fails here, before the run starts.
    model_input = network_input(config, observation_space)
    experiment_id = tracking.use_experiment(config.env.label)

    with mlflow.start_run(experiment_id=experiment_id, run_name=f"ppo-online-{name}"):
        mlflow.log_params({"algo": "ppo", "name": name, **dataclasses.asdict(config), "env": config.env.label})
        mlflow.set_tags({"git_commit": tracking.git_commit(), "env_id": config.env.label, "algo": "ppo",
                         "purpose": "behaviour policy"})
        algorithm = ppo_config(config, observation_space, model_input).build_algo()
        experience = []
        try:
            curve = _train_to_target(algorithm, name, config, reference, run.checkpoint, experience)
            if not curve[-1]["episodes"]:  # held-out episodes met the target before any training episode ended
                raise UserError(f"online_policies.{name}: the target was met before any training episode finished, "
                                "so the replay would be empty; raise target_score or batch_size")
            algorithm.save_to_path(run.checkpoint.resolve())
        finally:
            algorithm.stop()
        replay = write_replay(experience, f"{name}-replay", config.env, spaces, providers,
                              f"PPO's own experience while it trained online to a normalized score of "
                              f"{config.target_score} (online_policies.{name})", replay_out, file_bytes)

        final = {k: v for k, v in curve[-1].items() if k != "iteration"}
        write_csv(run.learning_curve, curve)
        write_json(run.train_metrics, final)
        plots.learning_curves({f"ppo-online-{name}": curve}, SCORE, run.learning_curve_plot)
        mlflow.log_artifact(str(run.learning_curve_plot), "plots")
    print(f"[train-online {name}] done: score {final[SCORE]:.1f} after {final['env_steps']:,} env steps, "
          f"checkpoint {run.checkpoint}; its {replay.episodes} finished episodes ({replay.transitions:,} transitions, "
          f"return {replay.returns['mean']:.1f} ± {replay.returns['std']:.1f}) in {replay_out}", file=sys.stderr)
    return final


def _train_to_target(algorithm, name: str, config: OnlinePolicyConfig, reference: dict, checkpoint: Path,
                     experience: list) -> list[dict]:
    """PPO iterations until the target score; the learning curve, one row per iteration. Adds the episode pieces
    each iteration sampled to `experience`."""
    from ray.rllib.utils.metrics import (
        ENV_RUNNER_RESULTS,
        EPISODE_RETURN_MEAN,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
        NUM_EPISODES_LIFETIME,
    )

    curve, finished, episodes, started = [], [], 0, time.monotonic()
    held_out = held_out_runner(algorithm, config, checkpoint) if config.held_out_episodes else None
    while True:
        result = algorithm.train()
        for pieces in algorithm.env_runner_group.foreach_env_runner(take_recorded, local_env_runner=False):
            experience.extend(pieces)
        env_steps = int(result[NUM_ENV_STEPS_SAMPLED_LIFETIME])
        new_episodes = int(result[ENV_RUNNER_RESULTS].get(NUM_EPISODES_LIFETIME, 0)) - episodes
        if new_episodes:
            finished.append((new_episodes, float(result[ENV_RUNNER_RESULTS][EPISODE_RETURN_MEAN])))
            episodes += new_episodes
        count, mean_return = latest_mean(finished, config.score_episodes)
        row = {"iteration": len(curve) + 1, "env_steps": env_steps, "episodes": episodes, "return_mean": mean_return}
        if held_out is not None:
            held_out_returns, _ = episode_stats(held_out.run(list(range(config.held_out_episodes))))
            held_out_return = float(np.mean(held_out_returns))
            row.update(held_out_return_mean=held_out_return,
                       training_score=normalized_score(mean_return, reference))
            score, scored_by = normalized_score(held_out_return, reference), "held-out episodes"
            scored = True  # all of them ran the current policy
        else:
            score, scored_by = normalized_score(mean_return, reference), "training episodes"
            # The window must be full before it counts: a few lucky first episodes are not a policy's level.
            scored = count >= config.score_episodes
        row.update({SCORE: score, "time_s": time.monotonic() - started})
        curve.append(row)
        mlflow.log_metrics({k: v for k, v in row.items() if k != "iteration"}, step=len(curve))
        print(f"[train-online {name}] iteration {len(curve)}: {env_steps:,} env steps, {episodes} episodes, "
              f"training return {mean_return:.1f}, score {score:.1f} ({scored_by}) of target "
              f"{config.target_score} ({row['time_s']:.1f}s)", file=sys.stderr, flush=True)
        if scored and score >= config.target_score:
            return curve
        if env_steps >= config.max_env_steps:
            raise UserError(f"online_policies.{name}: PPO reached a normalized score of {score:.1f} in "
                            f"{env_steps:,} env steps, short of target_score {config.target_score}; raise "
                            "max_env_steps or lower target_score")


def held_out_runner(algorithm, config: OnlinePolicyConfig, checkpoint: Path) -> EpisodeRunner:
    """Runs episodes of the policy in training, sampling its actions as collect_from_policy will sample the
    checkpoint's, seeded from `held_out_seed` as collection seeds its episodes."""
    # The local env runner's inference module, whose weights RLlib overwrites in place after each iteration.
    module = algorithm.get_module()
    return EpisodeRunner(config.env, PolicyConfig(kind="model", model=str(checkpoint)), config.held_out_seed,
                         config.envs_per_env_runner, policy=ModulePolicy(module, module.action_space, greedy=False),
                         observations=False)


def latest_mean(finished: list[tuple[int, float]], episodes: int) -> tuple[int, float]:
    """(count, mean return) of the episodes that finished in the fewest latest iterations holding at least
    `episodes` of them (all of them while there are fewer); `finished` holds (count, mean) per iteration."""
    count, total = 0, 0.0
    for n, mean in reversed(finished):
        if count >= episodes:
            break
        count, total = count + n, total + n * mean
    return count, (total / count if count else float("nan"))
