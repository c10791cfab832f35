"""`orl reference` and `orl evaluate`: seeded episodes in the real environment, in parallel Ray actors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlflow

import tracking
from collectors.config import PolicyConfig
from collectors.rollout import check_env, rollout_returns
from common import plots
from common.envs import EnvSpec
from common.errors import UserError
from common.run_dir import RunDir, write_csv, write_json
from dataset_format import space_from_dict, space_to_dict, summarize
from evaluation.config import EvaluateConfig, ReferenceConfig
from evaluation.references import (
    CEILING,
    FLOOR,
    no_score_reason,
    normalized_score,
    read_reference,
    reference_path,
    reference_returns,
)


def measure_references(envs: list[EnvSpec], references: dict[str, ReferenceConfig], config: EvaluateConfig,
                       references_dir: str | Path) -> None:
    """Writes references/ENV.json for each env: its floor and ceiling returns on the evaluation seeds."""
    for env in envs:  # every env made before any is measured: a bad one fails first, with nothing written
        check_env(env)
    for env in sorted(envs, key=lambda e: e.label):
        given = references.get(env.label, ReferenceConfig())
        result = {"env_id": env.label, "seed": config.seed, "episodes": config.episodes}
        for name, fixed, policy in ((FLOOR, given.ref_min, given.floor), (CEILING, given.ref_max, given.ceiling)):
            if fixed is not None:
                result[name] = {"mean": fixed, "given": True}
            elif policy is not None:
                rollouts = rollout_returns(env, policy, config.seed, config.episodes, config.num_workers,
                                           label=f"reference {env.label} {name}")
                result[name] = summarize(rollouts.returns)
        write_json(reference_path(Path(references_dir), env.label), result)
        ceiling = f"{result[CEILING]['mean']:.1f}" if CEILING in result else "none (raw returns)"
        print(f"[reference {env.label}] random {result[FLOOR]['mean']:.1f}, expert {ceiling}", file=sys.stderr)


def evaluate(run_dir: str | Path, references_dir: str | Path, config: EvaluateConfig) -> dict:
    """Evaluates the policy of a training run, greedy unless `config.sample_actions` (BC, MARWIL, IQL); writes
    eval.json and logs it to the run's MLflow run."""
    run = RunDir(Path(run_dir))
    if not run.run_info.is_file():
        raise UserError(f"{run.run_info} is missing: {run.path} is not a finished `orl train` run")
    info = run.info()
    env = run.env()
    if env is None:
        return _no_simulator(run, info)
    _require_the_trained_spaces(run, info, env)
    reference = read_reference(references_dir, env.label, config)
    tracking.connect()  # before the episodes, so an unreachable server or a lost run fails fast
    tracking.require_run(info["mlflow_run_id"], run.run_info)
    sampled = config.sample_actions and info["policy_is_distribution"]
    actions = "sampled" if sampled else "greedy"
    policy = PolicyConfig(kind="model", model=str(run.checkpoint), greedy=not sampled)
    returns, nodes = rollout_returns(env, policy, config.seed, config.episodes, config.num_workers,
                                     label=f"evaluate {run.path.name}")
    stats = summarize(returns)
    metrics = {f"return_{k}": v for k, v in stats.items()}
    score = normalized_score(stats["mean"], reference)
    unscored = {} if score is not None else {"no_normalized_score": no_score_reason(env.label)}
    if score is not None:
        metrics["normalized_score"] = score
    metrics["episodes"] = len(returns)
    write_json(run.eval_metrics, {**metrics, "sampled_actions": sampled, **unscored})
    write_csv(run.eval_returns, [{"episode": i, "return": float(r)} for i, r in enumerate(returns)])
    plots.return_distributions({run.path.name: list(returns)},
                               reference_returns(reference), run.eval_returns_plot)

    with mlflow.start_run(run_id=info["mlflow_run_id"]):
        mlflow.log_metrics({f"eval/{k}": float(v) for k, v in metrics.items()})
        mlflow.set_tags({"eval.actions": actions, "eval.episodes_by_ray_node": json.dumps(nodes, sort_keys=True),
                         **{f"eval.{key}": reason for key, reason in unscored.items()}})
        mlflow.log_artifact(str(run.eval_returns_plot), "plots")
    scored = f"normalized score {score:.1f}" if score is not None else unscored["no_normalized_score"]
    print(f"[evaluate {run.path.name}, {actions}] return {stats['mean']:.1f} ± {stats['std']:.1f}, {scored}",
          file=sys.stderr)
    return metrics


def _require_the_trained_spaces(run: RunDir, info: dict, env: EnvSpec) -> None:
    """Makes the env once, before the actors do (`check_env`): it must give the observations and take the actions
    the run's dataset holds (run.json records its spaces; runs trained before it did are not checked)."""
    made_spaces = check_env(env)
    trained = (info.get("observation_space"), info.get("action_space"))
    if None in trained:
        return
    for what, recorded, made in zip(("observation", "action"), trained, made_spaces):
        if recorded != space_to_dict(made):
            raise UserError(f"{run.path} was trained on the {what} space {space_from_dict(recorded)}, but env "
                            f"{env.label} has {made}; evaluate it in the environment its dataset was collected in")


def _no_simulator(run: RunDir, info: dict) -> dict:
    """A run on data without a simulator has nothing to run its policy in: its eval.json says so, and so do its
    plots, so that the stage's outputs exist and the report can list it."""
    reason = f"not evaluated: dataset {info['dataset']} has no simulator (its card names no env)"
    result = {"skipped": reason}
    write_json(run.eval_metrics, result)
    write_csv(run.eval_returns, [], fieldnames=["episode", "return"])
    plots.message(reason, run.eval_returns_plot)
    tracking.connect()
    tracking.require_run(info["mlflow_run_id"], run.run_info)
    with mlflow.start_run(run_id=info["mlflow_run_id"]):
        mlflow.set_tag("eval.skipped", reason)
    print(f"[evaluate {run.path.name}] {reason}", file=sys.stderr)
    return result
