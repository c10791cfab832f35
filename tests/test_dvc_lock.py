"""The committed dvc.lock holds the versions a fresh collection reproduces, byte for byte."""

from __future__ import annotations

import yaml

from collectors.collect import collect
from common.tracking import dvc_digest
from pipelines.params import load_params
from tests.conftest import REPO

STAGE, NAME = "collect@cartpole-expert", "cartpole-expert"  # the quick tour's smallest dataset


def test_the_lock_names_every_dataset_of_the_quick_tour():
    stages = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]
    params = load_params(REPO / "params.yaml")
    assert {f"collect@{name}" for name in params.datasets} <= set(stages)
    assert {f"collect_from_policy@{name}" for name in params.policy_datasets} <= set(stages)


def test_a_fresh_collection_has_the_locked_hash(ray_local, tmp_path):
    locked = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"][STAGE]
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    # The lock was made with today's params (else `dvc repro` would re-collect, and this compares nothing).
    assert locked["params"]["params.yaml"] == {f"datasets.{NAME}": raw["datasets"][NAME], "collect": raw["collect"],
                                               "ray": raw["ray"]}
    params = load_params(REPO / "params.yaml")
    collect(NAME, params.dataset(NAME), params.collect, tmp_path / NAME)
    (out,) = locked["outs"]
    assert dvc_digest(tmp_path / NAME) == out["md5"], (
        "a fresh collection differs from dvc.lock: re-run `make pipeline` on a clean checkout and commit dvc.lock")
