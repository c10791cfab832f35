"""MLflow: where runs go, experiments, the dataset as a run input, and the policy as a registered model."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import warnings
from importlib import metadata
from pathlib import Path

import gymnasium as gym
import mlflow
import numpy as np
from mlflow.utils.logging_utils import disable_logging, enable_logging

from common.errors import UserError
from common.observations import is_image
from dataset_format import DatasetCard, Location, flat_dim, locate
from dataset_format.location import storage_errors

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
LOCAL_ARTIFACTS = Path("mlartifacts")
MODEL_ARTIFACT = "policy"
NEWEST_ALIAS = "newest"  # "latest" is reserved by MLflow
# MLflow's UI opens an experiment on its GenAI overview (traces, tokens) unless it is tagged as model training.
EXPERIMENT_KIND_TAGS = {"mlflow.experimentKind": "custom_model_development"}
# The MLflow model's code (models from code): a trained policy acting greedily.
POLICY_MODEL_CODE = Path(__file__).resolve().parent / "policy_model.py"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI)


def connect() -> str:
    """Points MLflow at the tracking store, failing in seconds if a server does not answer; returns the URI."""
    uri = tracking_uri()
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # not its INFO lines (creating the store's tables)
    _prepare_store(uri)
    mlflow.set_tracking_uri(uri)
    return uri


def require_run(run_id: str, named_in: Path) -> None:
    """The MLflow run that `named_in` (a run.json) names is in the store, or a one-line error says where it is
    looked for (call `connect` first)."""
    from mlflow.exceptions import MlflowException

    try:
        mlflow.MlflowClient().get_run(run_id)
    except MlflowException:
        raise UserError(f"{named_in} names MLflow run {run_id}, which the tracking store {tracking_uri()} does not "
                        "have: set MLFLOW_TRACKING_URI to the store `orl train` logged to, or train again") from None


@functools.cache
def _prepare_store(uri: str) -> None:
    """Once per store and process: the server answers, or the SQLite tables exist."""
    if uri.startswith(("http://", "https://")):
        _check_server(uri)
    if uri.startswith("sqlite:///"):
        _create_sqlite_store(uri)


def _create_sqlite_store(uri: str) -> None:
    """Creates the store's tables under a file lock: processes that start together on a new SQLite file would
    otherwise race to create them ("table ... already exists")."""
    import fcntl

    from mlflow import MlflowClient

    database = Path(uri.removeprefix("sqlite:///"))
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(database.with_name(database.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        MlflowClient(uri).search_experiments(max_results=1)


def use_experiment(name: str) -> str:
    """Points MLflow at the tracking store and the experiment `name` (created on first use); returns its id.

    With the default SQLite store, artifacts go to ./mlartifacts beside it.
    """
    from mlflow.exceptions import MlflowException

    uri = connect()
    try:
        experiment = mlflow.get_experiment_by_name(name)
        if experiment is None:
            local = tracking_uri().startswith("sqlite:")
            location = LOCAL_ARTIFACTS.resolve().as_uri() if local else None
            try:
                return mlflow.create_experiment(name, artifact_location=location, tags=EXPERIMENT_KIND_TAGS)
            except MlflowException:  # another process created it first
                experiment = mlflow.get_experiment_by_name(name)
        return experiment.experiment_id
    except MlflowException as err:
        raise UserError(f"MLflow tracking store {uri} is not usable ({str(err).splitlines()[0]}); "
                        "check MLFLOW_TRACKING_URI") from None


def _check_server(uri: str, timeout_s: float = 5.0) -> None:
    """Fails in seconds on a server that does not answer (MLflow's own client retries for minutes)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s)
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise UserError(f"MLflow tracking server {uri} does not answer ({reason}); start it, or unset "
                        "MLFLOW_TRACKING_URI to use the local sqlite:///mlflow.db") from None


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def dvc_digest(path: str | Path | Location) -> str:
    """The DVC hash of a dataset (md5 of its file listing, as in dvc.lock: '<md5>.dir'), the same for the same
    files in a local directory or under an s3:// prefix, where DVC's own hashing would use ETags."""
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.meta import Meta
    from dvc_data.hashfile.tree import Tree
    from dvc_objects.fs.local import LocalFileSystem

    location = locate(path)
    if location.is_local:
        fs = LocalFileSystem()
        with tempfile.TemporaryDirectory() as scratch:
            _, _, obj = build(HashFileDB(fs, scratch), location.root, fs, "md5", dry_run=True)
        return obj.hash_info.value
    tree = Tree()
    with storage_errors(location):
        for name in location.files():
            md5 = hashlib.md5()
            with location.fs.open_input_stream(location.path(name)) as stream:
                while chunk := stream.read(2**22):
                    md5.update(chunk)
            tree.add((name,), Meta(size=location.size(name)), HashInfo("md5", md5.hexdigest()))
    tree.digest()
    return tree.hash_info.value


def log_dataset_input(card: DatasetCard, path: str | Path | Location, digest: str) -> None:
    """Records the dataset as the run's training input: its location, name, DVC digest and card summary."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    location = locate(path)
    uri = Path(location.root).as_uri() if location.is_local else location.uri
    with warnings.catch_warnings():  # MLflow registers two equivalent local-file sources and warns it picked one
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(uri)
    dataset = MetaDataset(source=source, name=card.name, digest=digest)
    tags = {"env_id": card.env_id or "", "episodes": str(card.episodes), "transitions": str(card.transitions)}
    mlflow.log_input(dataset, context="training", tags=tags)


def model_name(task: str, algo: str) -> str:
    """The registered model of `algo` on a task (DatasetCard.task: the env, or a dataset without one); a
    namespaced env's `/` (ALE/Pong-v5) becomes `-`, as registered model names allow neither `/` nor `:`."""
    return f"{task}-{algo}".replace("/", "-").replace(":", "-")


def log_policy_model(card: DatasetCard, module_dir: Path, algo: str) -> tuple[str, str]:
    """Logs the policy as a pyfunc model, registers it and points aliases at it; returns (name, version)."""
    from mlflow import MlflowClient
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    observation_space, action_space = card.spaces
    if card.action_space["type"] == "Discrete":
        output = TensorSpec(np.dtype(np.int64), (-1,))
    else:
        output = TensorSpec(np.dtype(np.float32), (-1, flat_dim(action_space)))
    # A batch of vectors as float32 rows; of images or Discrete observations, as the env gives them (uint8 stacks of
    # frames, integers).
    if is_image(observation_space) or isinstance(observation_space, gym.spaces.Discrete):
        obs_dtype, obs_shape = np.dtype(observation_space.dtype), tuple(observation_space.shape)
    else:
        obs_dtype, obs_shape = np.dtype(np.float32), (flat_dim(observation_space),)
    signature = ModelSignature(inputs=Schema([TensorSpec(obs_dtype, (-1, *obs_shape))]), outputs=Schema([output]))
    name = model_name(card.task, algo)
    with tempfile.TemporaryDirectory() as scratch:
        # The model carries the code it imports, so it loads without this package installed.
        code_paths = []
        for package in ("common", "dataset_format"):
            source = Path(__file__).resolve().parent.parent / package
            code_paths.append(shutil.copytree(source, Path(scratch) / package,
                                              ignore=shutil.ignore_patterns("__pycache__")))
        info = mlflow.pyfunc.log_model(
            name=MODEL_ARTIFACT,
            python_model=str(POLICY_MODEL_CODE),
            model_config={"action_space": card.action_space},
            artifacts={"module": str(module_dir)},
            code_paths=[str(p) for p in code_paths],
            signature=signature,
            input_example=np.zeros((1, *obs_shape), dtype=obs_dtype),
            pip_requirements=[f"{lib}=={metadata.version(lib)}" for lib in ("ray", "torch", "gymnasium", "mlflow")],
        )
    # MLflow announces a registration on stderr ("Successfully registered model ..."); `orl train` reports the
    # model and its version in its own last line.
    disable_logging()
    try:
        version = str(mlflow.register_model(info.model_uri, name).version)
    finally:
        enable_logging()
    client = MlflowClient()
    client.set_registered_model_alias(name, NEWEST_ALIAS, version)
    client.set_registered_model_alias(name, card.name, version)
    return name, version
