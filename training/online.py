"""`orl train-online`: a behaviour policy trained online with RLlib's PPO, stopped at a target score.

D4RL's "medium" datasets sample a policy trained online part of the way. Such a policy's most likely actions
are its own, not an expert's, so cloning its data copies a weak policy, unlike an epsilon-mixture of the
expert, whose most likely action is always the expert's. `collect_from_policy` samples the checkpoint.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import time
from pathlib import Path

import mlflow

from collectors.envs import make_env
from collectors.errors import UserError, refuse_to_overwrite
from training import plots, tracking
from training.config import EvaluateConfig, OnlinePolicyConfig
from training.evaluate import normalized_score, read_reference
from training.run_dir import RunDir, write_csv, write_json

CURVE_METRIC = "normalized_score"
# RLlib reports the mean return of the episodes that finished in each iteration, over at most this many.
EPISODES_PER_ITERATION_MEAN = 100_000


def ppo_config(config: OnlinePolicyConfig):
    from ray.rllib.algorithms.ppo import PPOConfig

    return (
        PPOConfig()
        .environment(config.env)
        .env_runners(num_env_runners=config.env_runners, num_envs_per_env_runner=config.envs_per_env_runner)
        .training(lr=config.lr, train_batch_size_per_learner=config.batch_size,
                  minibatch_size=config.minibatch_size, num_epochs=config.epochs)
        .rl_module(model_config={"fcnet_hiddens": list(config.hidden_layers)})
        .reporting(metrics_num_episodes_for_smoothing=EPISODES_PER_ITERATION_MEAN)
        .debugging(seed=config.seed)
    )


def train_online(name: str, config: OnlinePolicyConfig, references_dir: str | Path, evaluate: EvaluateConfig,
                 out_dir: str | Path) -> dict:
    """Trains until the mean return of the latest `score_episodes` episodes reaches the target score (see
    `latest_mean`); writes the checkpoint, train_metrics.json and the learning curve. Raises UserError, writing
    nothing, if `max_env_steps` pass first."""
    from ray.rllib.utils.metrics import (ENV_RUNNER_RESULTS, EPISODE_RETURN_MEAN, NUM_ENV_STEPS_SAMPLED_LIFETIME,
                                         NUM_EPISODES_LIFETIME)

    run, label = RunDir(Path(out_dir)), f"train-online {name}"
    refuse_to_overwrite(run.checkpoint)
    make_env(config.env).close()  # a missing extra (Box2D) fails here, not inside an env runner
    reference = read_reference(references_dir, config.env, evaluate)
    experiment_id = tracking.use_experiment(config.env)

    with mlflow.start_run(experiment_id=experiment_id, run_name=f"ppo-online-{name}"):
        mlflow.log_params({"algo": "ppo", "name": name, **dataclasses.asdict(config)})
        mlflow.set_tags({"git_commit": tracking.git_commit(), "env_id": config.env, "algo": "ppo",
                         "purpose": "behaviour policy"})
        algorithm = ppo_config(config).build_algo()
        curve, started, score, env_steps, episodes, finished = [], time.monotonic(), float("-inf"), 0, 0, []
        while score < config.target_score:
            if env_steps >= config.max_env_steps:
                algorithm.stop()
                raise UserError(f"online_policies.{name}: PPO reached a normalized score of "
                                f"{curve[-1][CURVE_METRIC]:.1f} in {env_steps:,} env steps, short of target_score "
                                f"{config.target_score}; raise max_env_steps or lower target_score")
            result = algorithm.train()
            env_steps = int(result[NUM_ENV_STEPS_SAMPLED_LIFETIME])
            new_episodes = int(result[ENV_RUNNER_RESULTS].get(NUM_EPISODES_LIFETIME, 0)) - episodes
            if new_episodes:
                finished.append((new_episodes, float(result[ENV_RUNNER_RESULTS][EPISODE_RETURN_MEAN])))
                episodes += new_episodes
            count, mean_return = latest_mean(finished, config.score_episodes)
            # The window must be full before it counts: a few lucky first episodes are not a policy's level.
            score = normalized_score(mean_return, reference) if count >= config.score_episodes else float("-inf")
            curve.append({"iteration": len(curve) + 1, "env_steps": env_steps, "episodes": episodes,
                          "return_mean": mean_return, CURVE_METRIC: normalized_score(mean_return, reference),
                          "time_s": time.monotonic() - started})
            mlflow.log_metrics({k: v for k, v in curve[-1].items() if k != "iteration"}, step=len(curve))
            print(f"[{label}] iteration {len(curve)}: {env_steps:,} env steps, {episodes} episodes, return "
                  f"{mean_return:.1f}, score {curve[-1][CURVE_METRIC]:.1f} of target {config.target_score} "
                  f"({curve[-1]['time_s']:.1f}s)", file=sys.stderr, flush=True)
        algorithm.save_to_path(run.checkpoint.resolve())
        algorithm.stop()
        del algorithm
        gc.collect()

        final = {k: v for k, v in curve[-1].items() if k != "iteration"}
        write_csv(run.learning_curve, curve)
        write_json(run.train_metrics, final)
        plots.learning_curves({f"ppo-online-{name}": curve}, CURVE_METRIC, run.learning_curve_plot)
        mlflow.log_artifact(str(run.learning_curve_plot), "plots")
    print(f"[{label}] done: score {final[CURVE_METRIC]:.1f} after {final['env_steps']:,} env steps, checkpoint "
          f"{run.checkpoint}", file=sys.stderr)
    return final


def latest_mean(finished: list[tuple[int, float]], episodes: int) -> tuple[int, float]:
    """(count, mean return) of the episodes that finished in the fewest latest iterations holding at least
    `episodes` of them (all of them while there are fewer); `finished` holds (count, mean) per iteration."""
    count, total = 0, 0.0
    for n, mean in reversed(finished):
        if count >= episodes:
            break
        count, total = count + n, total + n * mean
    return count, (total / count if count else float("nan"))
