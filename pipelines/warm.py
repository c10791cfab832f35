"""A warm command: one process imports what a command needs, then forks a fresh child for each run of it.

A cold `orl` pays seconds of imports (RLlib, torch, MLflow, Ray Data) before its first line of work, and the quick
tour runs it for every stage. `orl repro` (and the test session) start a server of `orl` (`warm_server`); an `orl`
whose environment names one in WARM_SOCKET hands it its arguments, environment, working directory, module path and
standard streams (`forward`), and waits for the exit status. Every run is its own fork of the just-imported server,
so nothing carries over from one run to the next, and a run sees what a cold one would: the same streams, exit
status and signals (Ctrl-C and `kill` are passed on; a run whose client is killed is stopped).

A run whose environment differs from the server's in a variable that libraries read when imported
(IMPORT_TIME_PREFIXES) runs cold, as does every run where no server answers. Linux only: elsewhere commands run
cold (forking after these imports, and os.pidfd_open, are Linux's).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

WARM_SOCKET = "ORL_WARM_SOCKET"

# Variables read by Ray, torch and the BLAS libraries when they are imported: a command that sets them otherwise than
# the server was started with would not see its setting in a fork, so it runs cold. RAY_ADDRESS is read by ray.init.
IMPORT_TIME_PREFIXES = ("RAY_", "TORCH_", "OMP_", "MKL_", "OPENBLAS_", "PYTHON")
READ_AT_RUN_TIME = ("RAY_ADDRESS", "PYTHONPATH", "PYTHONUNBUFFERED")

COLD = 256  # the server's answer to a run it will not serve; exit statuses are 0 to 255, signals negative
_LENGTH = struct.Struct("!I")
_STATUS = struct.Struct("!i")
STOP_GRACE_S = 30  # a command whose client was killed gets this long to unwind (an MLflow run marked failed)
SUPPORTED = sys.platform == "linux"


def forward(argv: list[str]) -> int | None:
    """Runs `argv` in a fork of the server that WARM_SOCKET names, and returns its exit status; None where this
    process should run it: no server named or answering, or an environment the server cannot serve."""
    path = os.environ.get(WARM_SOCKET)
    if not path or not SUPPORTED:
        return None
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(path)
    except OSError:
        return None  # no server (any more): nothing is lost by running cold
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "path": sys.path}).encode()
    socket.send_fds(client, [_LENGTH.pack(len(request))], [_open_or_null(fd) for fd in (0, 1, 2)])
    client.sendall(request)
    handlers = {signum: signal.signal(signum, lambda signum, frame: client.send(bytes([signum])))
                for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    answer = _receive(client, _STATUS.size)
    if answer is None:
        print(f"orl: error: the warm orl at {path} ended without the command's exit status; run again without "
              f"{WARM_SOCKET}", file=sys.stderr)
        return 1
    status = _STATUS.unpack(answer)[0]
    if status == COLD:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        return None
    if status < 0:  # the command died of a signal: so does this process, for whoever waits on it
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


@contextmanager
def warm_server(entry: str, warm_up: str) -> Iterator[dict[str, str]]:
    """Starts a server with this process's environment that runs `entry` (`module:function`, called with the
    arguments, returning the exit status) after `warm_up` (`module:function`: imports only, it must start no thread,
    connection or Ray, which a fork would not carry). Yields the variables that send commands to it."""
    if not SUPPORTED:
        yield {}
        return
    with tempfile.TemporaryDirectory(prefix="orl-warm-") as directory:
        path = Path(directory) / "socket"
        # The server ends when this process does, however it ends: its end of this pipe then reads EOF.
        server_end, owner_end = os.pipe()
        # Its own session: a Ctrl-C at the terminal reaches each run once, through its client.
        server = subprocess.Popen([sys.executable, "-m", "pipelines.warm", str(path), entry, warm_up, str(server_end)],
                                  stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=[server_end])
        os.close(server_end)
        try:
            while not path.exists() and server.poll() is None:  # bound at once; runs queue while it imports
                time.sleep(0.01)
            yield {WARM_SOCKET: str(path)} if server.poll() is None else {}
        finally:
            server.terminate()
            server.wait()
            os.close(owner_end)


def serve(path: str, entry: str, warm_up: str, owner: str) -> None:
    """Listens at `path`, runs `warm_up`, then forks a supervisor per run of `entry`, until the pipe `owner` (a file
    descriptor) reads EOF: the process that started the server is gone."""
    owner_end = int(owner)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    started_with = dict(os.environ)
    _function(warm_up)()
    # Variables the imports set (Ray's, torch's, MLflow's): a cold run's imports would set them too.
    set_by_imports = {key: value for key, value in os.environ.items() if started_with.get(key) != value}
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped as they end
    while owner_end not in select.select([listener, owner_end], [], [])[0]:
        connection, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            os.close(owner_end)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _supervise(connection, entry, set_by_imports)
        connection.close()


def _supervise(connection: socket.socket, entry: str, set_by_imports: dict[str, str]) -> None:
    """Receives one run, runs `entry` in a fork, passes signals on and answers its exit status, then exits. Returns
    only in the run's process, as it ends (SystemExit)."""
    try:
        header, fds, _, _ = socket.recv_fds(connection, _LENGTH.size, 3)
        request = json.loads(_receive(connection, _LENGTH.unpack(header)[0]))
    except (OSError, TypeError, struct.error):
        os._exit(0)  # the client is gone
    # Where both set a variable, the run's, as imports keep it; without WARM_SOCKET, the run is not forwarded again.
    env = {key: value for key, value in {**set_by_imports, **request["env"]}.items() if key != WARM_SOCKET}
    if _import_time_env(env) != _import_time_env(os.environ):
        connection.sendall(_STATUS.pack(COLD))
        os._exit(0)
    command = os.fork()
    if command == 0:
        connection.close()
        _run(_function(entry), request, env, fds)
    try:
        for fd in fds:
            os.close(fd)
        connection.sendall(_STATUS.pack(_watch(command, connection)))
    finally:
        os._exit(0)


def _watch(command: int, connection: socket.socket) -> int:
    """Passes the client's signals on to `command` until it exits; stops it if the client goes. Its exit status."""
    exited = os.pidfd_open(command)
    while exited not in select.select([connection, exited], [], [])[0]:
        try:
            signum = connection.recv(1)
        except ConnectionError:
            signum = b""
        if not signum:  # the client is gone (killed): its command must not run on unwatched
            os.kill(command, signal.SIGTERM)
            if not select.select([exited], [], [], STOP_GRACE_S)[0]:
                os.kill(command, signal.SIGKILL)
            break
        os.kill(command, signum[0])
    return os.waitstatus_to_exitcode(os.waitpid(command, 0)[1])


def _run(entry: Callable[[list[str]], int], request: dict, env: dict[str, str], fds: list[int]) -> None:
    """Becomes the run: its streams, directory, environment, module path and signals; then calls `entry`. It exits
    by raising SystemExit through the server's frames, so the interpreter ends as a cold run's would."""
    for fd, stream in zip(fds, (0, 1, 2)):
        os.dup2(fd, stream)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = request["path"]
    sys.argv = request["argv"]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdout.reconfigure(line_buffering=os.isatty(1), write_through=unbuffered)
    sys.stderr.reconfigure(line_buffering=True, write_through=unbuffered)
    sys.exit(entry(sys.argv[1:]))


def _function(name: str) -> Callable:
    module, function = name.split(":")
    return getattr(importlib.import_module(module), function)


def _import_time_env(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items()
            if key.startswith(IMPORT_TIME_PREFIXES) and key not in READ_AT_RUN_TIME}


def _receive(connection: socket.socket, size: int) -> bytes | None:
    """Exactly `size` bytes, or None where the other end closed first."""
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _open_or_null(fd: int) -> int:
    """`fd`, or /dev/null where this process was started with it closed."""
    try:
        os.fstat(fd)
        return fd
    except OSError:
        return os.open(os.devnull, os.O_RDWR)


if __name__ == "__main__":
    serve(*sys.argv[1:])
