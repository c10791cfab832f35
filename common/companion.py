"""The companion of an `orl` command that runs Ray: a process that outlives the command, for two jobs Ray leaves us.

1. The console. The driver's C++ core worker, which no logging filter reaches, prints RAY_CORE_NOTICES at error
   level on every healthy run. After `ray.init` the driver's stderr (file descriptor 2) becomes a pipe to this
   process, which forwards every line to the terminal but those. It reads until the driver is gone, so the last
   words of any exit, a C++ abort included, reach the terminal: nothing is lost with a thread of the dying process.
2. A local Ray's leftovers. Ray ties most of its processes to the driver that started them, but not the dashboard
   and runtime-env agents (Ray 2.60): after a `kill -9` of the driver they stay, orphaned, and ignore SIGTERM.
   While the driver lives, the companion notes its descendants every `POLL_S`; once the pipe closes (the driver
   exited in any way, a kill included), it SIGKILLs those still running. A cluster named by RAY_ADDRESS is not the
   driver's to reap.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import psutil

POLL_S = 1.0

# Printed by the driver's core worker for every actor pool Ray Data starts: Ray Data passes an actor's constructor
# arguments through the object store and restarts its actors, and Ray warns that a restart could then fail if
# those objects were lost (ray-project/ray#53727). The driver holds them for the pool's life; our collectors'
# restarts are exercised by the tests.
RAY_CORE_NOTICES = (b"has constructor arguments in the object store and max_restarts > 0",)


def forward(lines, terminal) -> None:
    """Copies `lines` (bytes) to `terminal` but RAY_CORE_NOTICES, until the input ends."""
    for line in lines:
        if not any(notice in line for notice in RAY_CORE_NOTICES):
            terminal.write(line)
            terminal.flush()


def run(driver_pid: int, reap: bool) -> None:
    """Forwards stdin to stderr until the driver is gone; then, if `reap`, kills its descendants still running."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the terminal must not cut the driver's last words
    driver, me = psutil.Process(driver_pid), psutil.Process()
    seen: dict[int, psutil.Process] = {}
    driver_gone = threading.Event()

    def note_descendants() -> None:
        while reap and not driver_gone.wait(POLL_S):
            try:
                seen.update((p.pid, p) for p in driver.children(recursive=True) if p.pid != me.pid)
            except psutil.NoSuchProcess:
                return

    noting = threading.Thread(target=note_descendants, daemon=True)
    noting.start()
    forward(sys.stdin.buffer, sys.stderr.buffer)
    driver_gone.set()
    noting.join()
    for process in seen.values():
        try:
            if process.is_running():  # also False for a reused PID: psutil compares creation times
                process.kill()
        except psutil.Error:
            pass


_companion: subprocess.Popen | None = None  # held for the driver's lifetime: its stdin is the driver's stderr


def start_companion(reap_local_ray: bool) -> None:
    """Starts this process's companion, once, and makes it this process's stderr. Call it after `ray.init`: Ray's
    own processes keep the real stderr, so the pipe closes when this process ends."""
    global _companion
    if _companion is not None:
        return
    sys.stderr.flush()
    _companion = subprocess.Popen(
        [sys.executable, "-m", "common.companion", str(os.getpid()), "reap" if reap_local_ray else "forward"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
    os.dup2(_companion.stdin.fileno(), 2)


if __name__ == "__main__":
    run(int(sys.argv[1]), reap=sys.argv[2] == "reap")
