"""The reaper of a local Ray: a process that outlives an `orl` command and kills what its local Ray left behind.

Ray ties most of its processes to the driver that started them, but not the dashboard and runtime-env agents
(Ray 2.60): after a `kill -9` of the driver they stay, orphaned, and ignore SIGTERM. `watch_local_ray` starts
this module as a process of its own session, holding the read end of a pipe whose only write end the driver
keeps. While the driver lives, the reaper notes its descendants every `POLL_S`; once the pipe closes (the driver
exited in any way, a kill included), it SIGKILLs those still running. A Ray cluster named by RAY_ADDRESS is not
the driver's to reap.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import psutil

POLL_S = 1.0


def reap(driver_pid: int) -> None:
    """Notes the driver's descendants until stdin closes; then kills the ones still running."""
    driver, me = psutil.Process(driver_pid), psutil.Process()
    seen: dict[int, psutil.Process] = {}
    driver_gone = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), driver_gone.set()), daemon=True).start()
    while not driver_gone.wait(POLL_S):
        try:
            seen.update((p.pid, p) for p in driver.children(recursive=True) if p.pid != me.pid)
        except psutil.NoSuchProcess:
            break
    for process in seen.values():
        try:
            if process.is_running():  # also False for a reused PID: psutil compares creation times
                process.kill()
        except psutil.Error:
            pass


_reaper: subprocess.Popen | None = None  # held for the driver's lifetime: its stdin is the pipe's write end


def watch_local_ray() -> None:
    """Starts the reaper for this process (the driver of a local Ray), once."""
    global _reaper
    if _reaper is None:
        _reaper = subprocess.Popen([sys.executable, "-m", "common.reaper", str(psutil.Process().pid)],
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)


if __name__ == "__main__":
    reap(int(sys.argv[1]))
