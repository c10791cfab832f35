"""The version of the code that made a dataset, as its card records it."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path


def code_version(folders: tuple[str, ...]) -> str:
    """This package's version and, inside a git checkout, the last commit that changed `folders` (the code the
    dataset's bytes depend on); `.dirty` if that code has local edits. Commits that leave it alone leave the
    version, and so every written byte, as they were: a fresh clone reproduces dvc.lock's dataset hashes."""
    version = metadata.version("offline-rl-pipeline")
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("log", "-1", "--format=%h", "--abbrev=12", "--", *folders)
        dirty = git("status", "--porcelain", "--", *folders)
        return f"{version}+g{commit}" + (".dirty" if dirty else "") if commit else version
    except (OSError, subprocess.CalledProcessError):
        return version


def library_versions() -> dict[str, str]:
    """The libraries a dataset's bytes depend on."""
    return {lib: metadata.version(lib) for lib in ("gymnasium", "pyarrow", "ray")}
