"""The companion process: the console without Ray's core notices, every last word of a crash, no leftovers."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

from common.companion import RAY_CORE_NOTICES, forward
from tests.conftest import REPO

NOTICE = b"[core_worker.cc:2465] Actor 'MapWorker' " + RAY_CORE_NOTICES[0] + b". See ray#53727\n"


def test_forward_drops_the_notices_and_keeps_every_other_line_in_order():
    terminal = io.BytesIO()
    forward([b"[collect] 1/2 episodes\n", NOTICE, b"WARNING a real one\n", b"no newline at the end"], terminal)
    assert terminal.getvalue() == b"[collect] 1/2 episodes\nWARNING a real one\nno newline at the end"


def driver(body: str) -> subprocess.CompletedProcess:
    """A Python process that starts its companion (no Ray, nothing to reap), then runs `body`."""
    script = "import os, sys\nfrom common.companion import start_companion\nstart_companion(reap_local_ray=False)\n"
    return subprocess.run([sys.executable, "-c", script + textwrap.dedent(body)], cwd=REPO, capture_output=True,
                          timeout=60, check=False)


def test_the_last_words_of_an_abort_reach_the_terminal():
    # What a C++ abort does: writes to file descriptor 2, then dies by a signal without running any Python exit code.
    result = driver(f"""
        os.write(2, {NOTICE!r})
        print("[train] iteration 1", file=sys.stderr, flush=True)
        os.write(2, b"F core_worker.cc:92 Check failed: the last words\\n")
        os.abort()
    """)
    assert result.returncode < 0
    assert result.stderr == b"[train] iteration 1\nF core_worker.cc:92 Check failed: the last words\n"


def test_a_python_error_arrives_whole_after_the_notices_are_dropped():
    result = driver(f"""
        os.write(2, {NOTICE!r})
        raise SystemExit("orl: error: the one line")
    """)
    assert result.returncode == 1 and result.stderr == b"orl: error: the one line\n"
