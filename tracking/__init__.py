"""Tracking, above the dataset format: the MLflow store and experiments, the dataset as a run input (its DVC
digest), and the trained policy as a registered MLflow model (`policy_model.py`, the model's own code)."""

from tracking.runs import (
    NEWEST_ALIAS,
    connect,
    dvc_digest,
    git_commit,
    log_dataset_input,
    log_policy_model,
    require_run,
    tracking_uri,
    use_experiment,
)

__all__ = ["NEWEST_ALIAS", "connect", "dvc_digest", "git_commit", "log_dataset_input", "log_policy_model",
           "require_run", "tracking_uri", "use_experiment"]
