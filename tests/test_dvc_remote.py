"""Versions anyone can pull: a DVC remote on a real S3-compatible server (moto_server on loopback), pushed to,
emptied locally and pulled back byte for byte. Credentials live in DVC's git-ignored local config."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import S3_ENV

pytestmark = pytest.mark.slow  # a DVC remote on the S3-compatible server


def dvc(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # only DVC's config speaks to S3
    result = subprocess.run([str(Path(sys.executable).parent / "dvc"), *args], cwd=cwd, capture_output=True,
                            text=True, env=env, timeout=600)
    assert result.returncode == 0, f"dvc {' '.join(args)}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return result.stdout


def file_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_push_then_pull_gives_back_the_same_bytes(expert_dataset, bucket, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    dvc("init", "-q", cwd=repo)
    shutil.copytree(expert_dataset, repo / "datasets" / "cartpole-expert")
    dvc("add", "datasets/cartpole-expert", cwd=repo)
    # As the README documents: the remote and its endpoint in .dvc/config, the credentials in .dvc/config.local.
    dvc("remote", "add", "-d", "store", f"s3://{bucket}/dvcstore", cwd=repo)
    dvc("remote", "modify", "store", "endpointurl", S3_ENV["AWS_ENDPOINT_URL"], cwd=repo)
    dvc("remote", "modify", "--local", "store", "access_key_id", S3_ENV["AWS_ACCESS_KEY_ID"], cwd=repo)
    dvc("remote", "modify", "--local", "store", "secret_access_key", S3_ENV["AWS_SECRET_ACCESS_KEY"], cwd=repo)
    assert S3_ENV["AWS_SECRET_ACCESS_KEY"] not in (repo / ".dvc" / "config").read_text()
    assert "config.local" in (repo / ".dvc" / ".gitignore").read_text()
    dvc("push", cwd=repo)

    shutil.rmtree(repo / ".dvc" / "cache")
    shutil.rmtree(repo / "datasets" / "cartpole-expert")
    dvc("pull", cwd=repo)
    assert file_bytes(repo / "datasets" / "cartpole-expert") == file_bytes(expert_dataset)
    assert "in sync" in dvc("status", "-c", cwd=repo)
