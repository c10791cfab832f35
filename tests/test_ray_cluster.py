"""`orl` on a real two-node Ray cluster on loopback (1 CPU per node), through RAY_ADDRESS, as a user runs it:
work placed on both nodes (read back from where each actor ran), the bytes of a one-node run, clean shutdowns,
a node lost mid-collection and mid-training, and no process left behind, on the cluster or on one machine."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import mlflow
import psutil
import pytest
import yaml

from common.loopback_cluster import RayCluster, wait_for
from tests.conftest import CARTPOLE_CONTROLLER, REPO, orl

pytestmark = pytest.mark.slow  # a two-node Ray cluster

DATASET, EPISODES = "cluster-expert", 200  # 8 tasks of 25: work for both nodes, and a collection to kill midway
EVAL_EPISODES = 8
# Tracebacks, C++ check failures and error-level log lines that a healthy run must not print.
FAILURE_SIGNS = re.compile(r"Traceback|Check failed|core_worker|ERROR|Error:|GeneratorExit|not initialized")


def write_params(directory: Path, episodes: int, **bc) -> Path:
    """The repository's params.yaml with a CartPole expert dataset of `episodes` episodes in tasks of 25, two
    collectors, and BC on two learner actors with the `bc` overrides."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["collect"].update(num_collectors=2, envs_per_collector=4, episodes_per_task=25)
    params["datasets"][DATASET] = {"env": "CartPole-v1", "episodes": episodes, "seed": 7, "policy": CARTPOLE_CONTROLLER}
    params["algos"]["bc"].update(num_learners=2, **bc)
    params["evaluate"].update(episodes=EVAL_EPISODES, num_workers=2)
    path = directory / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def tracking(directory: Path) -> mlflow.MlflowClient:
    """The MLflow store `orl` used in `directory` (its embedded default)."""
    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{directory / 'mlflow.db'}")


def files_of(dataset: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(dataset.iterdir())}


def nodes_named(stderr: str, label: str) -> dict[str, int]:
    """Node-id prefix -> episodes, from the `episodes by Ray node` line of `label`."""
    [line] = [line for line in stderr.splitlines() if line.startswith(f"[{label}] episodes by Ray node: ")]
    return {node: int(count) for node, count in re.findall(r"(\w{8}) (\d+)", line.split(": ", 1)[1])}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster, with token authentication as a new Ray has by default, so its mode does not depend on whether
    the session's Ray, which sets RAY_AUTH_MODE in this process, started before it."""
    with pytest.MonkeyPatch.context() as patch:  # the cluster's process and its nodes inherit it; `orl` does not
        # Ray's GCS declares a node dead after 5 failed health checks, 3 s apart by default: 15 s that each node-loss
        # test would wait out. Every 0.5 s, 2.5 s; a check still fails only when refused, or silent for 10 s.
        patch.setenv("RAY_health_check_period_ms", "500")
        cluster = RayCluster(tmp_path_factory.mktemp("cluster") / "cluster.log", token=secrets.token_hex(16))
    cluster.add_worker()
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A working directory with the params, and the dataset collected on one local Ray node."""
    directory = tmp_path_factory.mktemp("project")
    write_params(directory, episodes=EPISODES, iterations=4)
    result = orl("collect", DATASET, "--out", "one-node", cwd=directory)
    assert result.returncode == 0, result.stderr[-3000:]
    return directory


def test_collect_places_collectors_on_both_nodes_and_writes_the_one_node_bytes(cluster, project):
    result = orl("collect", DATASET, "--out", "two-nodes", cwd=project, env=cluster.env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not FAILURE_SIGNS.search(result.stderr), result.stderr[-3000:]
    placed = nodes_named(result.stderr, f"collect {DATASET}")
    assert set(placed) == {cluster.head.node_id[:8], cluster.workers[0].node_id[:8]}
    assert sum(placed.values()) == EPISODES
    assert files_of(project / "two-nodes") == files_of(project / "one-node")


def test_collect_finishes_on_the_remaining_node_when_a_node_is_lost(cluster, project):
    doomed = cluster.workers[0]
    out = project / "node-lost"
    stderr = open(project / "node-lost.log", "w+")
    collecting = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "collect", DATASET, "--out", str(out)],
                                  cwd=project, stderr=stderr, env={**os.environ, **cluster.env})
    try:
        # Killed once both nodes have run tasks and most of the work is still to do.
        started = rf"\] ([1-9]\d*)/{EPISODES} episodes"
        wait_for(lambda: re.search(started, open(stderr.name).read()), 120, "collection")
        cluster.kill_node(doomed)
        assert collecting.wait(timeout=300) == 0, open(stderr.name).read()[-3000:]
    finally:
        collecting.kill()
        cluster.add_worker()  # the cluster is whole again for the next tests
    log = open(stderr.name).read()
    # Tasks lost with the node ran again on the head, and counted once.
    assert [int(done) for done in re.findall(rf"\] (\d+)/{EPISODES} episodes", log)][-1] == EPISODES
    assert max(int(done) for done in re.findall(rf"\] (\d+)/{EPISODES} episodes", log)) == EPISODES
    assert files_of(out) == files_of(project / "one-node")


@pytest.fixture(scope="module")
def trained(cluster, project):
    """`orl train --algo bc` with two learner actors on the cluster."""
    before = cluster.run_processes()
    result = orl("train", "--algo", "bc", "--dataset", "one-node", "--out", "runs/bc", cwd=project, env=cluster.env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, before


def test_two_learners_train_on_two_nodes_and_shut_down_cleanly(cluster, project, trained):
    result, before = trained
    assert not FAILURE_SIGNS.search(result.stderr), result.stderr[-3000:]
    run = json.loads((project / "runs/bc/run.json").read_text())
    tags = tracking(project).get_run(run["mlflow_run_id"]).data.tags
    assert sorted(json.loads(tags["ray.learner_nodes"])) == sorted([cluster.head.node_id, cluster.workers[-1].node_id])
    # Every worker the run started, learners included, is gone once orl has exited.
    wait_for(lambda: cluster.run_processes().keys() <= before.keys(), 60, "the run's Ray workers to exit")


def test_evaluate_spreads_its_episodes_over_the_nodes(cluster, project, trained):
    for command in (["reference"], ["evaluate", "runs/bc"]):
        result = orl(*command, cwd=project, env=cluster.env)
        assert result.returncode == 0, result.stderr[-3000:]
    run = json.loads((project / "runs/bc/run.json").read_text())
    placed = json.loads(tracking(project).get_run(run["mlflow_run_id"]).data.tags["eval.episodes_by_ray_node"])
    assert set(placed) == {cluster.head.node_id, cluster.workers[-1].node_id} and sum(placed.values()) == EVAL_EPISODES


def test_training_that_loses_a_learner_node_fails_in_one_line_and_resumes(cluster, project, tmp_path):
    """A learner's node lost mid-run: exit 2 with one line saying where to resume, the MLflow run FAILED and no
    model registered; the same command on the mended cluster resumes from the last saved iteration and finishes."""
    work = tmp_path / "work"
    work.mkdir()
    write_params(work, episodes=EPISODES, iterations=60, updates_per_iteration=5)
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["train"]["checkpoint_every"] = 5
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (work / "data").symlink_to(project / "one-node")

    log = open(work / "train.log", "w+")
    training = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "train", "--algo", "bc", "--dataset", "data",
                                 "--out", "runs/bc"], cwd=work, stderr=log, env={**os.environ, **cluster.env})
    try:
        wait_for(lambda: "iteration 12/60" in open(log.name).read(), 240, "training to pass iteration 12")
        cluster.kill_node(cluster.workers[-1])
        assert training.wait(timeout=300) == 2
    finally:
        training.kill()
        cluster.add_worker()
    stderr = open(log.name).read()
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("orl: error: a learner was lost in iteration "), stderr[-3000:]
    saved = int(re.search(r"resume after iteration (\d+)", last).group(1))
    assert saved >= 10 and saved % 5 == 0
    client = tracking(work)
    [failed] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert failed.info.status == "FAILED"
    assert not client.search_registered_models()  # nothing half-registered
    assert not (work / "runs/bc/run.json").exists()

    resumed = orl("train", "--algo", "bc", "--dataset", "data", "--out", "runs/bc", cwd=work, env=cluster.env,
                  timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming after iteration {saved} " in resumed.stderr
    assert client.get_run(failed.info.run_id).info.status == "FINISHED"
    assert json.loads((work / "runs/bc/run.json").read_text())["mlflow_run_id"] == failed.info.run_id


def test_a_killed_orl_leaves_no_process_of_its_local_ray(project):
    log = open(project / "killed.log", "w+")
    collecting = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "collect", DATASET, "--out", "killed"],
                                  cwd=project, stderr=log)
    wait_for(lambda: "episodes," in open(log.name).read(), 120, "collection to start")
    started = psutil.Process(collecting.pid).children(recursive=True)  # its local Ray, and the reaper
    assert any("raylet" in " ".join(p.cmdline()) for p in started)
    os.kill(collecting.pid, signal.SIGKILL)
    collecting.wait()

    def all_gone() -> bool:
        return not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    wait_for(all_gone, 30, "every process of its local Ray to be gone")
