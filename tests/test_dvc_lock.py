"""The committed dvc.lock is true: to today's code and params, and to the bytes a fresh collection reproduces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from collectors.collect import collect
from pipelines.params import load_params
from tests.conftest import PACKAGES, REPO
from tracking import dvc_digest

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


def stale_reasons(changes: list) -> list[str]:
    """What in a stage's `dvc status --json` entry makes its lock stale: a changed command, params, or code (a
    package folder it depends on) modified or new. Data is not: a fresh clone has no datasets, and of runs/ only
    the small files kept in git, until `dvc pull` or a repro."""
    reasons = []
    for change in changes:
        if isinstance(change, str):  # "changed command"
            reasons.append(change)
            continue
        for path, state in change.get("changed deps", {}).items():
            if isinstance(state, dict):  # a params file: key -> modified, new or deleted
                reasons.extend(f"{key} {how}" for key, how in state.items())
            elif path.split("/")[0] in PACKAGES and state != "deleted":
                reasons.append(f"{path} {state}")
    return reasons


def test_the_committed_lock_is_true_to_the_code_and_params():
    dvc = Path(sys.executable).parent / "dvc"
    # No target, as a user types it: every pipeline of this DVC project (the full suite's is a project of its own).
    result = subprocess.run([str(dvc), "status", "--json"], cwd=REPO, capture_output=True, text=True, timeout=600,
                            check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    status = json.loads(result.stdout or "{}")
    assert not [stage for stage in status if ":" in stage], "dvc status lists stages of another dvc.yaml"
    stale = {stage: reasons for stage, changes in status.items() if (reasons := stale_reasons(changes))}
    assert not stale, (f"dvc.lock is stale for {len(stale)} stages ({', '.join(sorted(stale))}; e.g. "
                       f"{next(iter(stale.values()))}): run `make lock` and commit dvc.lock and what it changed")


def test_stale_reasons_name_code_params_and_commands_but_not_data():
    deps = {"training": "modified", "datasets/x": "deleted", "runs": "modified",
            "params.yaml": {"algos.bc": "modified"}}
    changes = [{"changed deps": deps}, {"changed outs": {"runs/bc-x/checkpoint": "deleted"}}, "changed command"]
    assert stale_reasons(changes) == ["training modified", "algos.bc modified", "changed command"]
    assert stale_reasons([{"changed deps": {"datasets/x": "deleted"}}, {"changed outs": {"runs/y": "deleted"}}]) == []
