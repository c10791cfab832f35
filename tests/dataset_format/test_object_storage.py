"""Datasets on a real S3-compatible server (moto_server on loopback): written, read by every reader, trained on,
refused whole when a write was interrupted, and bad storage input reported in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

import dataset_format as dataset
from collectors.collect import collect
from collectors.config import DatasetConfig
from common.errors import UserError
from common.loopback_cluster import free_port
from tests.conftest import (
    CARTPOLE_CONTROLLER,
    CARTPOLE_EXPERT,
    REPO,
    S3_ENV,
    TINY_COLLECT,
    assert_user_error,
    kill_group,
    moto_server,
    orl,
    upload,
)
from tracking import dvc_digest

pytestmark = pytest.mark.slow  # the S3-compatible server, and collections killed midway

EXPERT = DatasetConfig(env="CartPole-v1", episodes=20, seed=3, policy=CARTPOLE_EXPERT)  # expert_dataset's spec


def objects(bucket: str, prefix: str) -> dict[str, bytes]:
    import boto3

    s3 = boto3.client("s3")
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])]
    # Keys ending in "/" are directory markers (pyarrow leaves one where it deleted a directory's last file).
    return {key[len(prefix):]: s3.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys
            if not key.endswith("/")}


def local_bytes(path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir()}


def write_params(workdir, datasets: dict, **algos) -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["datasets"], params["policy_datasets"], params["train"]["runs"] = datasets, {}, {}
    # Files of a few tasks each: several files, and few Ray Data write tasks at once.
    params["collect"].update(num_collectors=2, envs_per_collector=2, episodes_per_task=5, file_mib=0.5)
    for algo, overrides in algos.items():
        params["algos"][algo].update(overrides)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))


def test_collect_to_s3_writes_the_bytes_of_a_local_collection(expert_dataset, ray_local, bucket):
    card = collect("cartpole-expert", EXPERT, TINY_COLLECT, f"s3://{bucket}/cartpole-expert")
    assert card.transitions == 10_000 and len(card.files) == 4
    assert objects(bucket, "cartpole-expert/") == local_bytes(expert_dataset)
    assert dvc_digest(f"s3://{bucket}/cartpole-expert") == dvc_digest(expert_dataset)


def test_every_reader_takes_the_s3_uri(expert_dataset, ray_local, bucket):
    """Ours, and stock pandas (stock RLlib: tests/training/test_rllib_reads_datasets.py)."""
    uri = upload(expert_dataset, bucket, "data/cartpole-expert")
    local = dataset.load_table(expert_dataset)
    assert dataset.load_table(uri).equals(local)
    pd.testing.assert_frame_equal(pd.read_parquet(uri), pd.read_parquet(expert_dataset))  # stock pandas (s3fs)
    assert dataset.load_ray(uri).count() == local.num_rows
    obs, actions = next(iter(dataset.torch_dataloader(uri, batch_size=64)))
    assert obs.shape == (64, 4) and actions.shape == (64,)


def test_orl_lists_shows_validates_and_trains_from_s3(expert_dataset, bucket, tmp_path):
    uri = upload(expert_dataset, bucket, "data/cartpole-expert")
    # memory_cache_mib 0: the learner streams the row groups from the store as it trains.
    write_params(tmp_path, {}, bc={"iterations": 2, "updates_per_iteration": 5, "hidden_layers": [32, 32],
                                   "memory_cache_mib": 0})
    listed = orl("datasets", "list", f"s3://{bucket}/data", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.startswith(uri), listed.stderr[-2000:]
    for command in (["datasets", "show", uri], ["datasets", "validate", uri]):
        result = orl(*command, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
    trained = orl("train", "--algo", "bc", "--dataset", uri, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    info = json.loads((tmp_path / "runs" / "bc-cartpole-expert" / "run.json").read_text())
    assert info["dataset_path"] == uri and info["registered_model"]["name"] == "CartPole-v1-bc"
    # The S3 keys reach no output, no run directory and no MLflow run (its store and artifacts are in tmp_path).
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in written) and any(p.name == "MLmodel" for p in written)
    for key in (S3_ENV["AWS_ACCESS_KEY_ID"], S3_ENV["AWS_SECRET_ACCESS_KEY"]):
        assert not any(key in r.stdout + r.stderr for r in (listed, trained))
        assert not [p for p in written if key.encode() in p.read_bytes()]


def test_an_interrupted_collection_leaves_no_readable_dataset_and_a_rerun_is_identical(bucket, tmp_path):
    write_params(tmp_path, {"big": {"env": "CartPole-v1", "episodes": 100, "seed": 8, "policy": CARTPOLE_CONTROLLER}})
    clean = orl("collect", "big", "--out", "clean", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr[-3000:]
    uri, prefix = f"s3://{bucket}/big", "big/"
    process = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "collect", "big", "--out", uri],
                               cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not objects(bucket, prefix) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        os.kill(process.pid, signal.SIGKILL)  # as soon as the first file is there
        process.wait()
    finally:
        kill_group(process)
    left = objects(bucket, prefix)
    assert left and dataset.CARD_FILE not in left, "the kill came before the first file or after the card"
    assert_user_error(orl("datasets", "show", uri, cwd=tmp_path), f"{uri}/_card.json is missing", "interrupted")
    with pytest.raises(UserError, match="_card.json is missing"):
        dataset.load_table(uri)
    rerun = orl("collect", "big", "--out", uri, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert objects(bucket, prefix) == local_bytes(tmp_path / "clean")


def test_a_dataset_on_s3_is_never_overwritten(expert_dataset, bucket, tmp_path):
    uri = upload(expert_dataset, bucket, "cartpole-expert")
    write_params(tmp_path, {"cartpole-expert": {"env": "CartPole-v1", "episodes": 20, "seed": 3,
                                                "policy": CARTPOLE_CONTROLLER}})
    assert_user_error(orl("collect", "cartpole-expert", "--out", uri, cwd=tmp_path), uri, "already holds a dataset")
    assert objects(bucket, "cartpole-expert/") == local_bytes(expert_dataset)


def test_bad_storage_input_is_one_line_naming_the_uri(expert_dataset, bucket, tmp_path):
    write_params(tmp_path, {"cartpole-expert": {"env": "CartPole-v1", "episodes": 20, "seed": 3,
                                                "policy": CARTPOLE_CONTROLLER}})
    upload(expert_dataset, bucket, "not-a-dataset/files")  # a prefix of prefixes, no card
    cases = [
        ({}, ["datasets", "show", f"s3://{bucket}/not-a-dataset"], ["_card.json is missing"]),
        ({}, ["datasets", "show", f"s3://{bucket}/nothing-here"], ["does not exist"]),
        ({}, ["collect", "cartpole-expert", "--out", "s3://no-such-bucket/x"], ["bucket 'no-such-bucket' does not"]),
        ({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}, ["datasets", "show", f"s3://{bucket}/x"],
         ["cannot reach the S3 endpoint"]),
        ({}, ["train", "--algo", "bc", "--dataset", "gs://bucket/x"], ["only local paths and s3://"]),
    ]
    for env, command, fragments in cases:
        uri = next(arg for arg in command if "://" in arg)
        assert_user_error(orl(*command, cwd=tmp_path, env=env), uri, *fragments)
    assert not (tmp_path / "runs").exists()


def test_wrong_credentials_are_named(tmp_path):
    """A second S3 server that checks credentials (moto with IAM authentication on): ours are unknown to it."""
    write_params(tmp_path, {})
    port = free_port()
    with moto_server(port, tmp_path / "moto.log", env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}):
        env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
        result = orl("datasets", "show", "s3://some-bucket/x", cwd=tmp_path, env=env)
        assert_user_error(result, "s3://some-bucket/x", "refused the credentials", "AWS_ACCESS_KEY_ID")
    assert S3_ENV["AWS_ACCESS_KEY_ID"] == os.environ["AWS_ACCESS_KEY_ID"]


def test_files_are_written_in_order_on_s3_as_locally(ray_local, bucket, tmp_path):
    """More than one task per file on object storage too: Ray Data's sink keeps the rows' order."""
    from collectors.config import CollectConfig

    settings = CollectConfig(num_collectors=2, envs_per_collector=2, episodes_per_task=2, file_mib=0.2)
    collect("x", EXPERT, settings, tmp_path / "local")
    collect("x", EXPERT, settings, f"s3://{bucket}/x")
    assert objects(bucket, "x/") == local_bytes(tmp_path / "local")
    first = pq.read_table(tmp_path / "local" / "episodes-00000.parquet")
    assert first["eps_id"].to_pylist() == sorted(first["eps_id"].to_pylist())
