"""Starting a local Ray: a quiet console whatever was imported first."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO


@pytest.mark.slow  # starts a Ray of its own: the quick tier stays within its 5 minutes
def test_a_process_that_imported_ray_first_starts_it_with_token_auth_and_no_notice_of_it():
    # As a benchmark script does: Ray imported (its config cached) before start_ray runs.
    script = textwrap.dedent("""
        import os
        import ray
        from common.ray_runtime import start_ray
        start_ray(1)
        print(os.environ.get("RAY_AUTH_MODE"))
        ray.shutdown()
    """)
    env = {name: value for name, value in os.environ.items() if name not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=180,
                            check=False, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "token"
    assert "Token authentication" not in result.stderr
    assert "WARNING" not in result.stderr, result.stderr
