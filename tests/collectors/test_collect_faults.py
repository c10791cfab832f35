"""Faults during collection: a collector actor is killed, or the whole collect process is killed with -9."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

import dataset_format as dataset
from tests.collectors.test_collect import file_hashes
from tests.conftest import CARTPOLE_CONTROLLER, REPO, kill_group, orl

pytestmark = pytest.mark.slow  # collections killed midway


def write_params(workdir, datasets: dict, collect: dict):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["datasets"], params["collect"] = datasets, collect
    params["train"]["runs"] = {}
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))


def collector_processes(root: psutil.Process, name: str) -> list[psutil.Process]:
    """The actor processes of dataset `name`'s collectors among `root`'s descendants (their title names the dataset)."""
    found = []
    for child in root.children(recursive=True):
        try:
            if f"MapBatches(collect {name})" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def test_a_killed_collector_is_replaced_and_the_dataset_is_identical(tmp_path):
    write_params(tmp_path,
                 {"expert": {"env": "CartPole-v1", "episodes": 400, "seed": 3, "policy": CARTPOLE_CONTROLLER}},
                 {"num_collectors": 2, "envs_per_collector": 4, "episodes_per_task": 20, "file_mib": 16})
    clean = orl("collect", "expert", "--out", "clean", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr[-3000:]
    process = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "collect", "expert", "--out", "ds"],
                               cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        for line in process.stderr:  # the first progress line: collectors are running tasks
            if "episodes," in line:
                break
        victims = collector_processes(psutil.Process(process.pid), "expert")
        assert victims, "no collector process found to kill"
        victims[0].kill()
        assert not (tmp_path / "ds").exists(), "the collection ended before the fault"
        _, stderr = process.communicate(timeout=600)
    finally:
        kill_group(process)
    assert process.returncode == 0, stderr[-3000:]
    assert file_hashes(tmp_path / "ds") == file_hashes(tmp_path / "clean")


def test_kill_9_leaves_no_partial_dataset_and_a_rerun_is_identical(tmp_path):
    write_params(tmp_path, {"big": {"env": "CartPole-v1", "episodes": 3000, "seed": 8, "policy": {"kind": "random"}}},
                 {"num_collectors": 2, "envs_per_collector": 4, "episodes_per_task": 300})
    clean = orl("collect", "big", "--out", "clean", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr[-3000:]
    command = [sys.executable, "-m", "pipelines.cli", "collect", "big", "--out", "killed"]
    for delay in random.Random(0).sample([x / 2 for x in range(4, 22)], 3):  # 2 s .. 10.5 s into the run
        process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        time.sleep(delay)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        time.sleep(1)
        kill_group(process)
        killed = tmp_path / "killed"
        if killed.exists():  # the kill came after the final rename: then the dataset is whole
            assert file_hashes(killed) == file_hashes(tmp_path / "clean"), delay
            shutil.rmtree(killed)
    rerun = orl("collect", "big", "--out", "killed", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert file_hashes(tmp_path / "killed") == file_hashes(tmp_path / "clean")
    dataset.validate(tmp_path / "killed")
