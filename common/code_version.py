"""The version of the code that made a dataset, as its card records it."""

from __future__ import annotations

import hashlib
import subprocess
from importlib import metadata
from pathlib import Path


def code_version(folders: tuple[str, ...]) -> str:
    """This package's version and, inside a git checkout, a digest of the git trees of `folders` (the code the
    dataset's bytes depend on) at HEAD; `.dirty` if that code has local edits. It follows the code's content, not
    its history: a commit elsewhere, or an edit and its revert, leaves the version, and so every written byte, as it
    was, and a fresh clone reproduces dvc.lock's dataset hashes."""
    version = metadata.version("offline-rl-pipeline")
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        trees = git("ls-tree", "HEAD", "--", *folders)  # one line per folder: mode, type, tree hash, path
        dirty = git("status", "--porcelain", "--", *folders)
    except (OSError, subprocess.CalledProcessError):
        return version
    if not trees:
        return version
    digest = hashlib.sha1(trees.encode()).hexdigest()[:12]
    return f"{version}+tree.{digest}" + (".dirty" if dirty else "")


def library_versions() -> dict[str, str]:
    """The libraries a dataset's bytes depend on."""
    return {lib: metadata.version(lib) for lib in ("gymnasium", "pyarrow", "ray")}
