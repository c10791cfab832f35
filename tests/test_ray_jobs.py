"""Ray's own cluster tools from our install, as docs/cluster-and-storage.md sets them up: a two-node cluster on loopback
whose head runs the dashboard and the job API on 127.0.0.1, with Ray's token authentication on. `ray job submit` runs
`orl collect` there: its logs show our progress lines, the dataset has the bytes of a local run, a failing job ends
FAILED on our one-line error, and a client without the token, or with a wrong one, is refused."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from common.loopback_cluster import LOOPBACK_ENV, RayCluster, free_port
from tests.conftest import CARTPOLE_CONTROLLER, REPO, copy_pipeline, orl

pytestmark = pytest.mark.slow  # a two-node Ray cluster with its dashboard, and Ray jobs on it

DATASET = "job-expert"
RAY = str(Path(sys.executable).parent / "ray")  # the CLI of the environment the README installs
TOKEN = secrets.token_hex(16)
COLLECTOR = f"MapWorker(MapBatches(collect {DATASET}))"  # Ray Data's actor around our collector class
COLOURS = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = RayCluster(tmp_path_factory.mktemp("job-cluster") / "cluster.log", dashboard_port=free_port(),
                         token=TOKEN)
    cluster.add_worker()
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A working directory with params for a small expert dataset, and that dataset collected by a local Ray."""
    directory = tmp_path_factory.mktemp("job-project")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["collect"].update(num_collectors=2, envs_per_collector=2, episodes_per_task=10)
    params["datasets"][DATASET] = {"env": "CartPole-v1", "episodes": 40, "seed": 11, "policy": CARTPOLE_CONTROLLER}
    (directory / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = orl("collect", DATASET, "--out", "local", cwd=directory, env={"RAY_ADDRESS": ""})  # a Ray of its own
    assert result.returncode == 0, result.stderr[-3000:]
    return directory


def ray_cli(cluster: RayCluster, *args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    """`ray ARGS` from a home without Ray's token file, as a client holding `token` (None: a client that sends
    none)."""
    client = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_AUTH_", "RAY_ADDRESS"))}
    client.update(LOOPBACK_ENV, HOME=str(Path(cluster.log.name).parent),
                  **({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {}))
    result = subprocess.run([RAY, *args], capture_output=True, text=True, env=client, timeout=600)
    result.stdout = COLOURS.sub("", result.stdout)  # the CLI colours its status lines
    return result


def ray_job(cluster: RayCluster, command: str, *args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    """`ray job COMMAND ARGS` against the cluster's dashboard."""
    return ray_cli(cluster, "job", command, "--address", cluster.dashboard_url, *args, token=token)


def submit(cluster: RayCluster, project: Path, *orl_args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    """Submits `orl ORL_ARGS` in `project` as a job and waits for it (`ray job submit` follows its logs)."""
    entrypoint = f"cd {project} && {sys.executable} -m pipelines.cli {' '.join(orl_args)}"
    return ray_job(cluster, "submit", "--", "bash", "-c", entrypoint, token=token)


def job_id(submitted: subprocess.CompletedProcess) -> str:
    [line] = [line for line in submitted.stdout.splitlines() if "submitted successfully" in line]
    return line.split("'")[1]


def test_a_job_runs_orl_collect_with_our_progress_lines_and_the_bytes_of_a_local_run(cluster, project):
    submitted = submit(cluster, project, "collect", DATASET, "--out", "by-job")
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
    assert f"[collect {DATASET}] 40/40 episodes" in submitted.stdout
    job = job_id(submitted)
    assert f"Job '{job}' succeeded" in ray_job(cluster, "status", job).stdout
    logs = ray_job(cluster, "logs", job).stdout
    assert f"[collect {DATASET}] wrote " in logs and "episodes by Ray node: " in logs
    local, by_job = project / "local", project / "by-job"
    assert sorted(p.name for p in by_job.iterdir()) == sorted(p.name for p in local.iterdir())
    for path in local.iterdir():
        assert (by_job / path.name).read_bytes() == path.read_bytes(), path.name


def test_a_job_runs_dvc_repro_of_a_tiny_pipeline_with_the_bytes_of_a_local_run(cluster, project, tmp_path):
    """The docs' `ray job submit -- bash -c "cd CHECKOUT && dvc repro"`, in a git + DVC repo of the pipeline whose
    one dataset is the project's: its collect stage runs on the cluster and DVC locks what it made."""
    copy_pipeline(tmp_path)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params.update(datasets={DATASET: params["datasets"][DATASET]}, policy_datasets={}, online_policies={}, imports={})
    params["train"]["runs"] = {}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for command in (["git", "init", "-q"], [str(Path(sys.executable).parent / "dvc"), "init", "-q"]):
        subprocess.run(command, cwd=tmp_path, check=True, capture_output=True, timeout=300)
    entrypoint = f"cd {tmp_path} && PATH={Path(sys.executable).parent}:$PATH dvc repro collect"
    submitted = ray_job(cluster, "submit", "--", "bash", "-c", entrypoint)
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
    assert f"Running stage 'collect@{DATASET}'" in submitted.stdout
    assert f"[collect {DATASET}] 40/40 episodes" in submitted.stdout
    assert f"collect@{DATASET}" in (tmp_path / "dvc.lock").read_text()
    local = sorted((project / "local").glob("*.parquet"))
    assert local and [p.read_bytes() for p in local] == [
        (tmp_path / "datasets" / DATASET / p.name).read_bytes() for p in local]


def test_the_dashboard_lists_the_jobs_collectors_by_dataset_on_both_nodes(cluster, project):
    """The dashboard's actors view shows what Ray's state API lists: the collector actors of the job above, named
    after their dataset, one on each node."""
    listed = ray_cli(cluster, "list", "actors", "--detail", "--format", "json", "--limit", "10000",
                     "--address", cluster.address)
    assert listed.returncode == 0, listed.stderr[-2000:]
    collectors = [actor for actor in json.loads(listed.stdout) if actor["class_name"] == COLLECTOR]
    assert {a["node_id"] for a in collectors} == {cluster.head.node_id, *(w.node_id for w in cluster.workers)}


def test_the_dashboard_in_a_browser_shows_the_collectors_on_each_node_to_whoever_logs_in(cluster, project, tmp_path):
    """Ray's dashboard rendered by headless Chromium, as a person opens it: without the token its API refuses; after
    the login the dashboard's token dialog makes (POST /api/authenticate, which sets its cookie), the actors view,
    filtered by class, lists the collectors of the jobs above, one on each node. The screenshot stays in tmp_path."""
    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no Chromium to render the dashboard with: apt-get install chromium")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1600, "height": 1000})
            assert context.request.get(f"{cluster.dashboard_url}/api/v0/actors").status == 401
            login = context.request.post(f"{cluster.dashboard_url}/api/authenticate",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
            assert login.ok, login.text()
            page = context.new_page()
            page.goto(f"{cluster.dashboard_url}/#/actors")
            page.get_by_label("Class", exact=True).fill(f"collect {DATASET}")
            rows = page.locator("tr", has_text=COLLECTOR)
            rows.first.wait_for(timeout=120_000)
            page.screenshot(path=tmp_path / "actors.png", full_page=True)
            shown = [rows.nth(i).inner_text() for i in range(rows.count())]
        finally:
            browser.close()
    nodes = {cluster.head.node_id, *(w.node_id for w in cluster.workers)}
    assert {node for node in nodes if any(node in row for row in shown)} == nodes, shown

def test_a_failing_job_ends_failed_on_our_one_line_error(cluster, project):
    submitted = submit(cluster, project, "collect", "no-such-dataset")
    assert submitted.returncode != 0
    job = job_id(submitted)
    assert f"Job '{job}' failed" in ray_job(cluster, "status", job).stdout
    last = ray_job(cluster, "logs", job).stdout.strip().splitlines()[-1]
    assert last.startswith("orl: error: ") and "no-such-dataset" in last, last


@pytest.mark.parametrize("token", [None, "not-the-token"])
def test_a_client_without_the_token_is_refused(cluster, project, token):
    refused = submit(cluster, project, "collect", DATASET, "--out", "refused", token=token)
    assert refused.returncode != 0
    refusal = ("Unauthorized: Missing authentication token" if token is None
               else "Forbidden: Invalid authentication token")
    assert "ray.exceptions.AuthenticationError: Authentication " in refused.stderr and refusal in refused.stderr, (
        refused.stderr[-2000:])
    assert not (project / "refused").exists()
    listed = ray_job(cluster, "list")
    assert listed.returncode == 0 and "--out refused" not in listed.stdout


def test_the_token_reaches_no_log_and_no_file_the_jobs_wrote(cluster, project):
    jobs = ray_job(cluster, "list").stdout
    submitted = set(re.findall(r"raysubmit_\w+", jobs))
    logs = "".join(ray_job(cluster, "logs", job).stdout for job in submitted)
    assert len(submitted) >= 2 and TOKEN not in jobs + logs
    written = [p for p in project.rglob("*") if p.is_file()]
    assert any(p.name == "_card.json" for p in written)
    for path in written:
        assert TOKEN.encode() not in path.read_bytes(), path
