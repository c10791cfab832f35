"""Starting a local Ray: a quiet console whatever was imported first."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO


def run_python(script: str, timeout: int, unset: tuple[str, ...]) -> subprocess.CompletedProcess:
    """`script` run by a fresh interpreter in the repository, without the environment variables `unset`."""
    env = {name: value for name, value in os.environ.items() if name not in unset}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False, env=env)


@pytest.mark.slow  # starts a Ray of its own: the quick tier stays within its 5 minutes
def test_a_process_that_imported_ray_first_starts_it_with_token_auth_and_no_notice_of_it():
    # As a benchmark script does: Ray imported (its config cached) before start_ray runs.
    result = run_python("""
        import os
        import ray
        from common.ray_runtime import start_ray
        start_ray(1)
        print(os.environ.get("RAY_AUTH_MODE"))
        ray.shutdown()
    """, timeout=180, unset=("RAY_ADDRESS", "RAY_AUTH_MODE"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "token"
    assert "Token authentication" not in result.stderr
    assert "WARNING" not in result.stderr, result.stderr


def test_a_local_ray_that_does_not_start_in_time_ends_in_one_line_naming_the_load():
    # Ray 2.60's own failure on a loaded machine, which no setting lengthens: raised by ray.init as it raises it.
    result = run_python("""
        import ray
        from common.errors import exit_on_user_error
        from common.ray_runtime import LOCAL_START_TIMEOUT, start_ray
        def timed_out(**kwargs):
            raise Exception(LOCAL_START_TIMEOUT + ". This could happen because some of the raylet failed to startup.")
        ray.init = timed_out
        exit_on_user_error(lambda: start_ray(1))
    """, timeout=120, unset=("RAY_ADDRESS",))
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "a local Ray did not start within Ray's fixed 30 s" in result.stderr
    assert "load" in result.stderr and "RAY_ADDRESS" in result.stderr
