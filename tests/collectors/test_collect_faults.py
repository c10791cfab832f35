"""Faults during collection: a collector actor dies, or the whole collect process is killed with -9."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import yaml

from collectors import dataset
from collectors.rollout import CRASH_ONCE_ENV
from tests.collectors.test_collect import file_hashes
from tests.conftest import REPO, kill_group, orl


def write_params(workdir, datasets: dict, collect: dict):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["datasets"], params["collect"] = datasets, collect
    params["train"]["datasets"] = []
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))


def test_a_dead_collector_is_replaced_and_the_dataset_is_identical(expert_dataset, tmp_path):
    # The same spec and layout as the expert_dataset fixture.
    write_params(tmp_path, {"cartpole-expert": {"env": "CartPole-v1", "episodes": 20, "seed": 3}},
                 {"num_collectors": 2, "envs_per_collector": 2, "episodes_per_task": 5, "file_mib": 0.001})
    marker = tmp_path / "collector-crashed"
    result = orl("collect", "cartpole-expert", "--out", "ds", cwd=tmp_path, env={CRASH_ONCE_ENV: str(marker)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert marker.exists(), "the fault was not injected"
    assert file_hashes(tmp_path / "ds") == file_hashes(expert_dataset)


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
