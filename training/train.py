"""`orl train`: one algorithm on one dataset with RLlib, tracked in MLflow, resumable after a crash."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import math
import os
import shutil
import sys
import time

import mlflow
import ray

import tracking
from common import plots
from common.errors import UserError
from common.run_dir import CURVE_METRIC, RunDir, write_csv, write_json
from common.trained_policy import MODULE_SUBDIR
from training.algorithms.registry import algorithm as offline_algorithm
from training.algorithms.registry import learner_metrics, rllib_config
from training.algorithms.train_batches import release_data_iterator
from training.plan import TrainingPlan


def train(plan: TrainingPlan, checkpoint_every: int) -> dict:
    """Runs the plan: trains into its run directory, resuming an interrupted run of the same inputs."""
    algo, params, dataset_dir, card, run, label = plan.algo, plan.params, plan.dataset, plan.card, plan.run, plan.label
    entry = offline_algorithm(algo)
    experiment_id = tracking.use_experiment(card.task)  # an unusable tracking store fails before training
    digest = tracking.dvc_digest(dataset_dir)
    fingerprint = hashlib.sha256(json.dumps([algo, dataclasses.asdict(params), digest, plan.seed]).encode()).hexdigest()
    resume = _load_resume(run, fingerprint)

    # A resumed run continues its MLflow run; a new one starts with params, tags and the dataset input.
    start = {"run_id": resume["mlflow_run_id"]} if resume else {"experiment_id": experiment_id,
                                                               "run_name": f"{algo}-{card.name}"}
    with mlflow.start_run(**start) as mlflow_run:
        if resume is None:
            mlflow.log_params({"algo": algo, "seed": plan.seed, **params.hyper_parameters(),
                               **{f"dataset.{k}": v for k, v in card.summary().items()}})
            mlflow.set_tags({"git_commit": tracking.git_commit(), "dvc.dataset_digest": digest,
                             "dataset": card.name, "env_id": card.env_id or "", "algo": algo})
            tracking.log_dataset_input(card, dataset_dir, digest)

        algorithm = rllib_config(algo, params, dataset_dir, plan.seed, card).build_algo()
        try:
            mlflow.set_tag("ray.learner_nodes", json.dumps(learner_nodes(algorithm)))
            curve = resume["curve"] if resume else []
            if resume:
                # The learner group holds the weights and optimizer state. Algorithm.restore_from_path would also
                # sync env runners, which offline training does not have (it fails on None in RLlib 2.60).
                algorithm.learner_group.restore_from_path((run.resume_checkpoint / "learner_group").resolve())
                print(f"[{label}] resuming after iteration {len(curve)} from {run.resume_checkpoint}",
                      file=sys.stderr)
            started, saved_after = time.monotonic() - (curve[-1]["time_s"] if curve else 0.0), len(curve)
            main_loss = entry.curve_loss
            for iteration in range(len(curve) + 1, params.iterations + 1):
                metrics = learner_metrics(_train_iteration(algorithm, iteration, run, saved_after))
                mlflow.log_metrics(metrics, step=iteration)
                # The curve keeps the losses, which every iteration reports (other stats come and go), in name
                # order: RLlib's order varies from run to run, and the CSV's columns must not.
                losses = {k: metrics[k] for k in sorted(metrics) if k.endswith("loss")}
                curve.append({"iteration": iteration, CURVE_METRIC: losses.get(main_loss, math.nan), **losses,
                              "time_s": time.monotonic() - started})
                print(f"[{label}] iteration {iteration}/{params.iterations} {main_loss}="
                      f"{curve[-1][CURVE_METRIC]:.4f} ({curve[-1]['time_s']:.1f}s)",
                      file=sys.stderr, flush=True)
                if iteration % checkpoint_every == 0 and iteration < params.iterations:
                    _save_resume(algorithm, run, {"fingerprint": fingerprint, "curve": curve,
                                                  "mlflow_run_id": mlflow_run.info.run_id})
                    saved_after = iteration
            algorithm.save_to_path(run.checkpoint.resolve())
        finally:
            # Learners let go of their data while Ray is up in their processes; then the algorithm stops them.
            algorithm.learner_group.foreach_learner(release_data_iterator)
            algorithm.stop()
            del algorithm
            gc.collect()  # closes RLlib's dataset iterators while Ray is still up (else noisy errors at exit)

        final = {k: v for k, v in curve[-1].items() if k != "iteration"}
        write_csv(run.learning_curve, curve)
        write_json(run.train_metrics, final)
        plots.learning_curves({f"{algo}-{card.name}": curve}, CURVE_METRIC, run.learning_curve_plot)
        mlflow.log_artifact(str(run.learning_curve_plot), "plots")
        # Registered only now, after the checkpoint and model files exist: no version points at nothing.
        name, version = tracking.log_policy_model(card, run.checkpoint / MODULE_SUBDIR, algo)
        info = {
            "algo": algo,
            "policy_is_distribution": entry.policy_is_distribution,
            "dataset": card.name,
            "dataset_path": dataset_dir.uri,
            "env_id": card.env_id,
            "env_spec": card.env.to_dict() if card.env else None,
            "observation_space": card.observation_space,
            "action_space": card.action_space,
            "mlflow_run_id": mlflow_run.info.run_id,
            "mlflow_experiment_id": experiment_id,
            "registered_model": {"name": name, "version": version, "uri": f"models:/{name}/{version}"},
        }
        write_json(run.run_info, info)
    shutil.rmtree(run.resume_dir, ignore_errors=True)
    print(f"[{label}] done: checkpoint {run.checkpoint}, MLflow run {info['mlflow_run_id']}, "
          f"model {name} v{version}", file=sys.stderr)
    return info


def _train_iteration(algorithm, iteration: int, run: RunDir, saved_after: int) -> dict:
    """One `Algorithm.train()`. A learner lost meanwhile (its node or its process) ends the run with one line
    saying how to resume, from the state saved after iteration `saved_after` (0: none yet)."""
    try:
        return algorithm.train()
    except ray.exceptions.RayError as err:
        # The lost learner is out of service by now; the survivors' own errors (torch.distributed's, as their
        # peer vanished) come first at times.
        health = algorithm.learner_group.foreach_learner(lambda learner: None, healthy_only=False, timeout_seconds=30)
        if all(result.ok for result in health):
            raise  # a learner's own error, not a lost learner: its traceback says more than a line could
        resume = (f"run the same command again to resume after iteration {saved_after} from {run.resume_checkpoint}"
                  if saved_after else "no resume state was saved yet: running it again starts over")
        raise UserError(f"a learner was lost in iteration {iteration} (its Ray node or process died); the MLflow "
                        f"run is marked FAILED; {resume}") from err


def learner_nodes(algorithm) -> list[str]:
    """The Ray node id of each learner, by rank (the driver's node for a learner in the driver's process)."""
    results = algorithm.learner_group.foreach_learner(lambda learner: ray.get_runtime_context().get_node_id())
    return [result.get() for result in results]


def _load_resume(run: RunDir, fingerprint: str) -> dict | None:
    """The saved state of an interrupted run with the same algorithm, params, data and seed, if any.

    State from a run with other inputs is discarded, and its MLflow run marked FAILED.
    """
    if not run.resume_state.is_file():
        return None
    state = json.loads(run.resume_state.read_text())
    if state["fingerprint"] == fingerprint:
        return state
    mlflow.MlflowClient().set_terminated(state["mlflow_run_id"], "FAILED")
    shutil.rmtree(run.resume_dir)
    return None


def _save_resume(algorithm, run: RunDir, state: dict) -> None:
    """Checkpoint and state written aside, then swapped in by renames: a kill leaves the old pair or the new."""
    staging, retired = run.resume_dir / "staging", run.resume_dir / "retired"
    for leftover in (staging, retired):
        shutil.rmtree(leftover, ignore_errors=True)
    algorithm.save_to_path(staging.resolve())
    write_json(staging / run.resume_state.name, state)
    if run.resume_checkpoint.exists():
        os.rename(run.resume_checkpoint, retired)
    os.rename(staging, run.resume_checkpoint)
    shutil.rmtree(retired, ignore_errors=True)
