"""The warm `orl`: a command forked from the server behaves as a cold one, streams, status and signals included.

The command under test is `orl collect` of a dataset whose behaviour policy is a probe: collection tries the policy
once before Ray starts, so the probe runs inside the command's process, records where it runs and ends the command
with a one-line error (or waits to be signalled)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from pipelines.cli import warm_orl
from pipelines.warm import WARM_SOCKET
from tests.conftest import ORL, REPO

PROBE = '''
import json, os, time
from pathlib import Path
import psutil

def record(obs):
    ancestors = [" ".join(process.cmdline()) for process in psutil.Process().parents()]
    print("probe says hello", flush=True)
    Path("probe.json").write_text(json.dumps({"pid": os.getpid(), "ancestors": ancestors,
                                             "marker": os.environ.get("PROBE_MARKER")}))
    if os.environ.get("PROBE_WAITS"):
        time.sleep(300)
    raise RuntimeError("probe recorded")
'''
PROBE_ERROR = "behaviour policy probe:record raised RuntimeError: probe recorded"


@pytest.fixture(scope="module")
def warm():
    with warm_orl() as env:
        yield env


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "probe.py").write_text(PROBE)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["datasets"]["cartpole-expert"]["policy"] = {"kind": "callable", "callable": "probe:record"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return tmp_path


def start(workdir: Path, env: dict) -> subprocess.Popen:
    """`orl collect` of the probed dataset; RAY_ADDRESS "" as the probe ends it before any Ray."""
    env = {**os.environ, "PYTHONPATH": str(workdir / "code"), "PROBE_MARKER": "from the client", "RAY_ADDRESS": "",
           **env}
    return subprocess.Popen([ORL, "collect", "cartpole-expert"], cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def probed(workdir: Path) -> dict:
    deadline = time.monotonic() + 120
    while not (workdir / "probe.json").exists():
        assert time.monotonic() < deadline, "the probe never ran"
        time.sleep(0.2)
    time.sleep(0.2)  # written at once, but not atomically
    return json.loads((workdir / "probe.json").read_text())


def forked_from_the_server(record: dict, warm: dict) -> bool:
    return any(f"pipelines.warm {warm[WARM_SOCKET]}" in ancestor for ancestor in record["ancestors"])


def test_a_command_runs_in_a_fork_of_the_server_as_it_would_cold(warm, workdir):
    client = start(workdir, warm)
    out, err = client.communicate(timeout=300)
    record = probed(workdir)
    assert forked_from_the_server(record, warm) and record["pid"] != client.pid
    assert record["marker"] == "from the client"  # its environment, module path and directory are the client's
    assert client.returncode == 2 and "probe says hello" in out
    assert err.strip().splitlines()[-1].startswith(f"orl: error: {PROBE_ERROR}")

    (workdir / "probe.json").unlink()
    cold = start(workdir, {})
    cold_out, cold_err = cold.communicate(timeout=300)
    assert not forked_from_the_server(probed(workdir), warm)
    assert (cold.returncode, cold_out, cold_err.strip().splitlines()[-1]) == (2, out, err.strip().splitlines()[-1])


@pytest.mark.parametrize("signum,status,last_line", [(signal.SIGTERM, 128 + signal.SIGTERM, ""),
                                                     (signal.SIGINT, 1, "KeyboardInterrupt")])
def test_a_signal_to_the_client_reaches_the_command(warm, workdir, signum, status, last_line):
    """`kill` unwinds the command through `orl`'s handler (exit 143); Ctrl-C as an uncaught KeyboardInterrupt ends
    a cold `orl` (exit 1)."""
    client = start(workdir, {**warm, "PROBE_WAITS": "1"})
    record = probed(workdir)
    assert forked_from_the_server(record, warm)
    client.send_signal(signum)
    _, err = client.communicate(timeout=120)
    assert client.returncode == status and err.strip().endswith(last_line)
    assert not psutil.pid_exists(record["pid"])


def test_a_killed_client_takes_its_command_with_it(warm, workdir):
    client = start(workdir, {**warm, "PROBE_WAITS": "1"})
    command = psutil.Process(probed(workdir)["pid"])
    client.kill()
    client.communicate(timeout=120)
    command.wait(timeout=120)


def test_an_environment_the_server_did_not_import_with_runs_cold(warm, workdir):
    """Ray reads RAY_ variables when imported: a command that sets one otherwise cannot be served from the fork."""
    client = start(workdir, {**warm, "RAY_DEDUP_LOGS": "0" if os.environ.get("RAY_DEDUP_LOGS") != "0" else "1"})
    client.communicate(timeout=300)
    assert client.returncode == 2 and not forked_from_the_server(probed(workdir), warm)


def test_without_a_server_the_command_runs_cold(workdir, tmp_path):
    client = start(workdir, {WARM_SOCKET: str(tmp_path / "nobody-listens")})
    _, err = client.communicate(timeout=300)
    assert client.returncode == 2 and err.strip().splitlines()[-1].startswith(f"orl: error: {PROBE_ERROR}")
    assert "pipelines.warm" not in " ".join(probed(workdir)["ancestors"])


def test_the_server_ends_with_the_process_that_started_it(tmp_path):
    """However its owner ends (here `kill -9`, which no cleanup survives), the server does not outlive it."""
    owner = subprocess.Popen([sys.executable, "-c", "import time\nfrom pipelines.cli import warm_orl\n"
                              "with warm_orl() as env:\n    print(env, flush=True)\n    time.sleep(600)"],
                             cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert WARM_SOCKET in owner.stdout.readline()
    server = psutil.Process(owner.pid).children()[0]
    owner.kill()
    owner.wait()
    server.wait(timeout=120)
