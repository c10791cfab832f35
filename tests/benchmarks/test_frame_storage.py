"""benchmarks/frame_storage.py: the same image rows written, validated and read as each schema version stores them."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO, write_frame_stacks


def test_it_times_every_step_in_each_version_named(tmp_path):
    path = write_frame_stacks(tmp_path / "stacks", schema_version=2)
    result = subprocess.run([sys.executable, "-m", "benchmarks.frame_storage", "--dataset", str(path), "--versions",
                             "1", "2", "3"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[1] == "| step | lists (version 1) | bytes (version 2) | frames (version 3) | version 3 / version 1 |"
    steps = [line.split(" | ")[0].lstrip("| ") for line in lines[3:]]
    assert steps == ["write", "validate", "read_frames", "stream obs", "MB on disk"]
    assert all(float(line.split(" | ")[-1].rstrip(" |")) > 0 for line in lines[3:])
