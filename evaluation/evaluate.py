"""`orl reference` and `orl evaluate`: seeded episodes in the real environment, in parallel Ray actors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlflow

import tracking
from collectors.config import PolicyConfig
from collectors.rollout import rollout_returns
from common import plots
from common.errors import UserError
from common.run_dir import RunDir, write_csv, write_json
from dataset_format import summarize
from evaluation.config import EvaluateConfig
from evaluation.references import REFERENCE_POLICIES, normalized_score, read_reference, reference_path


def measure_references(env_ids: list[str], config: EvaluateConfig, references_dir: str | Path) -> None:
    """Writes references/ENV.json: random and expert returns on the evaluation seeds."""
    for env_id in sorted(set(env_ids)):
        result = {"env_id": env_id, "seed": config.seed, "episodes": config.episodes}
        for kind in REFERENCE_POLICIES:
            rollouts = rollout_returns(env_id, PolicyConfig(kind=kind), config.seed, config.episodes,
                                       config.num_workers, label=f"reference {env_id} {kind}")
            result[kind] = summarize(rollouts.returns)
        write_json(reference_path(Path(references_dir), env_id), result)
        print(f"[reference {env_id}] random {result['random']['mean']:.1f}, expert {result['expert']['mean']:.1f}",
              file=sys.stderr)


def evaluate(run_dir: str | Path, references_dir: str | Path, config: EvaluateConfig) -> dict:
    """Evaluates the policy of a training run, greedy unless `config.sample_actions` (BC, MARWIL, IQL); writes
    eval.json and logs it to the run's MLflow run."""
    run = RunDir(Path(run_dir))
    if not run.run_info.is_file():
        raise UserError(f"{run.run_info} is missing: {run.path} is not a finished `orl train` run")
    info = run.info()
    if info["env_id"] is None:
        return _no_simulator(run, info)
    reference = read_reference(references_dir, info["env_id"], config)
    tracking.connect()  # before the episodes, so an unreachable server fails fast
    sampled = config.sample_actions and info["policy_is_distribution"]
    actions = "sampled" if sampled else "greedy"
    policy = PolicyConfig(kind="model", model=str(run.checkpoint), greedy=not sampled)
    returns, nodes = rollout_returns(info["env_id"], policy, config.seed, config.episodes, config.num_workers,
                                     label=f"evaluate {run.path.name}")
    stats = summarize(returns)
    metrics = {f"return_{k}": v for k, v in stats.items()}
    metrics["normalized_score"] = normalized_score(stats["mean"], reference)
    metrics["episodes"] = len(returns)
    write_json(run.eval_metrics, {**metrics, "sampled_actions": sampled})
    write_csv(run.eval_returns, [{"episode": i, "return": float(r)} for i, r in enumerate(returns)])
    plots.return_distributions({run.path.name: list(returns)},
                               {k: reference[k]["mean"] for k in REFERENCE_POLICIES}, run.eval_returns_plot)

    with mlflow.start_run(run_id=info["mlflow_run_id"]):
        mlflow.log_metrics({f"eval/{k}": float(v) for k, v in metrics.items()})
        mlflow.set_tags({"eval.actions": actions, "eval.episodes_by_ray_node": json.dumps(nodes, sort_keys=True)})
        mlflow.log_artifact(str(run.eval_returns_plot), "plots")
    print(f"[evaluate {run.path.name}, {actions}] return {stats['mean']:.1f} ± "
          f"{stats['std']:.1f}, normalized score {metrics['normalized_score']:.1f}", file=sys.stderr)
    return metrics


def _no_simulator(run: RunDir, info: dict) -> dict:
    """A run on data without a simulator has nothing to run its policy in: its eval.json says so, and so do its
    plots, so that the stage's outputs exist and the report can list it."""
    reason = f"not evaluated: dataset {info['dataset']} has no simulator (its card names no env)"
    result = {"skipped": reason}
    write_json(run.eval_metrics, result)
    write_csv(run.eval_returns, [], fieldnames=["episode", "return"])
    plots.message(reason, run.eval_returns_plot)
    tracking.connect()
    with mlflow.start_run(run_id=info["mlflow_run_id"]):
        mlflow.set_tag("eval.skipped", reason)
    print(f"[evaluate {run.path.name}] {reason}", file=sys.stderr)
    return result
