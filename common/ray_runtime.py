"""Starting Ray for an `orl` command or a benchmark: a cluster named by RAY_ADDRESS, or a local instance; and a
quiet console, where a healthy run prints `orl`'s progress lines and real warnings only."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys

from common.companion import start_companion
from common.errors import UserError

# Notices that Ray and RLlib print on every healthy run, about their own defaults rather than about the run:
# (logger, start of the message, why it says nothing to an `orl` user). Anything else still prints.
LIBRARY_NOTICES = (
    ("ray._common.deprecation", "DeprecationWarning: `RLModule(config=",
     "RLlib 2.60's RLModule.__init__ builds the deprecated RLModuleConfig itself, for every module"),
    ("ray.rllib.algorithms.algorithm_config", "You are running ",
     "the new API stack, which RLlib announces as its default, is the one our learners are written for"),
    ("ray.rllib.algorithms.sac.sac", "You are running SAC on the new API stack",
     "the same announcement, made again by SAC's config, which CQL's extends"),
    ("ray.data._internal.progress", "Progress bars disabled", "orl prints its own progress lines"),
    ("ray.tune.utils.util", "Install gputil", "a GPU monitor for machines with GPUs"),
    ("ray._private.authentication.authentication_token_setup", "Token authentication is enabled for this Ray",
     "a new local Ray's default, which we keep (Ray 2.60 sets RAY_AUTH_MODE=token for it and its workers)"),
)

# Loggers whose INFO lines narrate a healthy run, set to WARNING in every Ray process: (logger, why).
QUIET_LOGGERS = (
    ("ray.data._internal.execution.streaming_executor",
     "three lines per pass over the data from the actor that splits it among several learners"),
    ("ray.train.torch.config", "the torch.distributed process group that several learners set up"),
)


class _DropLibraryNotices(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def quiet_library_notices() -> None:
    """Drops LIBRARY_NOTICES and QUIET_LOGGERS' INFO lines in this process; Ray runs it in every worker too
    (`start_ray`)."""
    for logger, prefix, _ in LIBRARY_NOTICES:
        logging.getLogger(logger).addFilter(_DropLibraryNotices(prefix))
    for logger, _ in QUIET_LOGGERS:
        logging.getLogger(logger).setLevel(logging.WARNING)


def exit_on_sigterm() -> None:
    """Makes `kill` (SIGTERM) unwind this process like Ctrl-C, with exit status 143: an MLflow run in progress is
    marked failed, not left running. `start_ray` installs it again after `ray.init`, whose own handlers replace
    it: a Python one that exits with status 15, and a C one (Ray 2.60's failure handler, logging.cc) that prints
    a stack dump at error level and lets the process abort while it unwinds, at times before MLflow ends the run."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


IDLE_WORKER_MS = 10_000  # how long a local Ray keeps an idle worker process for the next task

# How Ray 2.60's ray.init starts the message of the bare Exception it raises where a new local node has not
# registered within 30 s (node.py's raylet_start_wait_time_s, which no setting changes): a loaded machine runs past it.
LOCAL_START_TIMEOUT = "The current node timed out during startup"


def start_ray(num_cpus: int) -> None:
    """Connects to RAY_ADDRESS when set; otherwise starts a local Ray of `num_cpus` CPUs (params' ray.num_cpus)."""
    import ray
    from ray.data import DataContext

    quiet_library_notices()
    address = os.environ.get("RAY_ADDRESS")
    on_cluster = bool(address)
    runtime_env = {"worker_process_setup_hook": quiet_library_notices}
    if on_cluster and os.environ.get("PYTHONPATH"):
        # A local Ray's workers inherit this process's environment, a cluster's their node's: the user's packages
        # on PYTHONPATH (their envs, controllers) go with the job.
        runtime_env["env_vars"] = {"PYTHONPATH": os.environ["PYTHONPATH"]}
    settings = {"include_dashboard": False, "logging_level": logging.WARNING, "runtime_env": runtime_env}
    if on_cluster:
        _check_answers(address)
        try:
            ray.init(address=address, **settings)
        except ConnectionError as err:
            raise UserError(f"RAY_ADDRESS={address}: {err}; check the address and that its RAY_AUTH_MODE is "
                            "yours, or unset RAY_ADDRESS for a local Ray") from None
    else:
        # A fresh worker costs about a second of CPU, and Ray 2.60 ends an idle one after 1 s (its raylet's
        # idle_worker_killing_time_threshold_ms, read from RAY_<name>): collection wrote each file from a new
        # worker, 15 % of a 2-core Pong collection's time (benchmarks/throughput.md, "Frames stored once").
        os.environ.setdefault("RAY_idle_worker_killing_time_threshold_ms", str(IDLE_WORKER_MS))
        try:
            ray.init(address="local", num_cpus=num_cpus, **settings)  # never join a stray local cluster
        except Exception as err:
            if not str(err).startswith(LOCAL_START_TIMEOUT):
                raise
            raise UserError(f"a local Ray did not start within Ray's fixed 30 s: the machine is busy (load "
                            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs); run again when it is less "
                            "loaded, or set RAY_ADDRESS to a running cluster") from None
    exit_on_sigterm()  # Python's signal.signal replaces the C handler too
    # After ray.init, so Ray's own processes keep the real stderr; a killed `orl` leaves none of its local Ray's.
    start_companion(reap_local_ray=not on_cluster)
    DataContext.get_current().enable_progress_bars = False  # `orl` prints its own progress lines
    logging.getLogger("ray.data").setLevel(logging.WARNING)


def _check_answers(address: str) -> None:
    """Fails at once, in one line, where RAY_ADDRESS is a HOST:PORT nothing listens on: Ray itself retries for
    minutes before it gives up."""
    host, _, port = address.rpartition(":")
    if not host or "/" in address or not port.isdigit():
        return  # "auto", ray://, ...: Ray's own check
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as err:
        raise UserError(f"RAY_ADDRESS={address}: no Ray cluster answers there ({err.strerror or err}); start one "
                        "(`ray start --head`) or unset RAY_ADDRESS for a local Ray") from None
