"""A real multi-node Ray cluster on one machine, on loopback: a head and worker nodes of 1 CPU each, every address on
127.0.0.1, each node its own raylet, object store and agents. The tests and `benchmarks/scale_out.py` run on it.

The nodes are started by Ray's own `ray.cluster_utils.Cluster`, in a process of their own (`python -m
common.loopback_cluster`), driven through its stdin and stdout. `ray start --head` / `ray start --address`
start the same processes, but on one machine the CLI dials the host's interface address even for 127.0.0.1;
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` keeps every address on loopback, and `ray start` refuses to add a worker
node with it set (docs/cluster-and-storage.md).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
NODE_CPUS = 1
OBJECT_STORE_BYTES = 300 * 2**20
# Ray Data's cluster-wide service actors: detached, started by the first job that uses Ray Data, and shared by
# every job after it. They belong to the cluster, not to a run.
CLUSTER_SERVICES = ("ray::_StatsActor", "ray::_AutoscalingCoordinatorActor", "ray::_UsageCollectionActor")


@dataclass(frozen=True)
class Node:
    node_id: str
    raylet_pid: int


class RayCluster:
    """Drives the cluster process: add worker nodes, kill one, and stop everything at the end.

    With `dashboard_port`, the head runs Ray's dashboard and job API there, on 127.0.0.1 (`dashboard_url`); with
    `token`, every node requires it (Ray's token authentication) of every client, `orl` processes and `ray job`
    alike."""

    def __init__(self, log_path: Path, dashboard_port: int | None = None, token: str | None = None):
        self.auth_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {}
        self.log = open(log_path, "w")
        arguments = [] if dashboard_port is None else ["--dashboard-port", str(dashboard_port)]
        self.process = subprocess.Popen([sys.executable, "-m", "common.loopback_cluster", *arguments],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                        start_new_session=True, env={**os.environ, **LOOPBACK_ENV, **self.auth_env},
                                        cwd=Path(__file__).resolve().parent.parent)
        started = self._reply()
        self.address, self.head = started["address"], Node(**started["head"])
        self.dashboard_url = f"http://127.0.0.1:{dashboard_port}" if dashboard_port is not None else None
        self.workers: list[Node] = []

    def _reply(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the Ray cluster process ended; see {self.log.name}")
        return json.loads(line)

    def add_worker(self) -> Node:
        self.process.stdin.write("add\n")
        self.process.stdin.flush()
        node = Node(**self._reply())
        self.workers.append(node)
        return node

    def kill_node(self, node: Node) -> None:
        """A lost machine: its raylet and the node's other processes are killed outright (SIGKILL)."""
        self.process.stdin.write(f"kill {node.node_id}\n")
        self.process.stdin.flush()
        self._reply()
        self.workers.remove(node)

    @property
    def env(self) -> dict:
        """What an `orl` process needs to run on this cluster."""
        return {**LOOPBACK_ENV, **self.auth_env, "RAY_ADDRESS": self.address}

    def run_processes(self) -> dict[int, str]:
        """pid -> command of every process that the cluster's raylets started (workers and agents), except
        CLUSTER_SERVICES."""
        found = {}
        for raylet in [self.head, *self.workers]:
            try:
                children = psutil.Process(raylet.raylet_pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for child in children:
                try:
                    command = " ".join(child.cmdline())
                except psutil.Error:
                    continue
                if not command.startswith(CLUSTER_SERVICES):
                    found[child.pid] = command
        return found

    def close(self) -> None:
        self.process.stdin.close()  # the cluster process shuts its nodes down
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()


def free_port() -> int:
    """A TCP port nothing on 127.0.0.1 listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(condition, timeout_s: float, what: str):
    """Polls `condition` until it returns something truthy, which it returns."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _serve(dashboard_port: int | None) -> None:
    from ray.cluster_utils import Cluster

    def node(ray_node) -> dict:
        return {"node_id": ray_node.node_id, "raylet_pid": ray_node.all_processes["raylet"][0].process.pid}

    # The head's job agent gets a port of its own: Ray's default (52365) is taken by any other Ray on the machine, and
    # then the job API answers "No available agent to submit job".
    agent_port = free_port()
    dashboard = ({"include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": dashboard_port,
                  "dashboard_agent_listen_port": agent_port}
                 if dashboard_port is not None else {"include_dashboard": False})
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": NODE_CPUS, "object_store_memory": OBJECT_STORE_BYTES, **dashboard})
    if dashboard_port is not None:  # jobs are refused until the agent is up, which takes long on a loaded machine
        wait_for(lambda: _listening(agent_port), 300, "the head node's job agent")
    print(json.dumps({"address": cluster.address, "head": node(cluster.head_node)}), flush=True)
    for command in sys.stdin:
        action, _, node_id = command.strip().partition(" ")
        if action == "add":
            worker = cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE_BYTES)
            cluster.wait_for_nodes()
            print(json.dumps(node(worker)), flush=True)
        elif action == "kill":
            [worker] = [w for w in cluster.worker_nodes if w.node_id == node_id]
            cluster.remove_node(worker, allow_graceful=False)  # SIGKILL, raylet first
            print(json.dumps({"killed": node_id}), flush=True)
    cluster.shutdown()


if __name__ == "__main__":
    _serve(int(sys.argv[2]) if sys.argv[1:2] == ["--dashboard-port"] else None)
