"""Starting Ray for an `orl` command or a benchmark: a cluster named by RAY_ADDRESS, or a local instance; and a
quiet console, where a healthy run prints `orl`'s progress lines and real warnings only."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

from common.reaper import watch_local_ray

# Notices that Ray and RLlib print on every healthy run, about their own defaults rather than about the run:
# (logger, start of the message, why it says nothing to an `orl` user). Anything else still prints.
LIBRARY_NOTICES = (
    ("ray._common.deprecation", "DeprecationWarning: `RLModule(config=",
     "RLlib 2.60's RLModule.__init__ builds the deprecated RLModuleConfig itself, for every module"),
    ("ray.rllib.algorithms.algorithm_config", "You are running ",
     "the new API stack, which RLlib announces as its default, is the one our learners are written for"),
    ("ray.data._internal.progress", "Progress bars disabled", "orl prints its own progress lines"),
    ("ray.tune.utils.util", "Install gputil", "a GPU monitor for machines with GPUs"),
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


# Printed by the driver's C++ core worker, which no logging filter reaches, for every actor pool Ray Data starts:
# Ray Data passes actor constructor arguments through the object store, and Ray warns that a restart could then
# fail if they were lost (ray-project/ray#53727). Our collectors' restarts are exercised by the tests.
RAY_CORE_NOTICES = (b"has constructor arguments in the object store and max_restarts > 0",)


def drop_ray_core_notices() -> None:
    """From now until this process exits, its stderr (file descriptor 2, where Ray's C++ logs go too) passes
    through a thread that drops RAY_CORE_NOTICES lines and forwards everything else, in order. At exit the real
    stderr comes back once the last lines (an error, say) are out. Processes already started keep the real one."""
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    terminal = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward() -> None:
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if not any(notice in line for notice in RAY_CORE_NOTICES):
                    os.write(terminal, line)

    thread = threading.Thread(target=forward, name="stderr-filter", daemon=True)
    thread.start()

    def restore() -> None:
        sys.stderr.flush()
        os.dup2(terminal, 2)  # closes the pipe's only write end: the thread drains it, then ends
        thread.join(timeout=10)

    atexit.register(restore)


def ask_for_token_auth() -> None:
    """Asks for token authentication, Ray's default for a new local instance, explicitly: left unset, Ray warns
    about it at every start. Must run before Ray is imported (Ray caches its config then); a cluster named by
    RAY_ADDRESS keeps the mode its operator set."""
    if not os.environ.get("RAY_ADDRESS"):
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def start_ray(num_cpus: int) -> None:
    """Connects to RAY_ADDRESS when set; otherwise starts a local Ray of `num_cpus` CPUs (params' ray.num_cpus)."""
    import ray
    from ray.data import DataContext

    quiet_library_notices()
    settings = {"include_dashboard": False, "logging_level": logging.WARNING,
                "runtime_env": {"worker_process_setup_hook": quiet_library_notices}}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **settings)
    else:
        ray.init(address="local", num_cpus=num_cpus, **settings)  # never join a stray local cluster
        watch_local_ray()  # a killed `orl` leaves none of its local Ray's processes behind
    drop_ray_core_notices()  # after ray.init: Ray's own processes keep the real stderr
    DataContext.get_current().enable_progress_bars = False  # `orl` prints its own progress lines
    logging.getLogger("ray.data").setLevel(logging.WARNING)
