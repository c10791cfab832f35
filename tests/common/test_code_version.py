"""A card's code version follows the content of the code that wrote the dataset, not the commits around it."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture
def checkout(tmp_path):
    """A git checkout holding common/code_version.py and a folder of collection code, `collector/`; the module is
    loaded from there, so it reads that checkout's history."""
    (tmp_path / "common").mkdir()
    shutil.copy(REPO / "common" / "code_version.py", tmp_path / "common" / "code_version.py")
    (tmp_path / "collector").mkdir()
    (tmp_path / "collector" / "write.py").write_text("ROWS = 1\n")
    (tmp_path / "notes.md").write_text("first\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "first")
    spec = importlib.util.spec_from_file_location("checkout_code_version", tmp_path / "common" / "code_version.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tmp_path, module


def commit(repo: Path, path: str, text: str) -> None:
    (repo / path).write_text(text)
    git(repo, "commit", "-q", "-am", f"edit {path}")


def test_an_edit_and_its_revert_leave_the_version_as_it_was(checkout):
    repo, module = checkout
    first = module.code_version(("collector",))
    assert "+tree." in first and not first.endswith(".dirty")
    commit(repo, "collector/write.py", "ROWS = 2\n")
    edited = module.code_version(("collector",))
    assert edited != first
    commit(repo, "collector/write.py", "ROWS = 1\n")
    assert module.code_version(("collector",)) == first
    commit(repo, "notes.md", "second\n")  # a commit outside the code leaves it too
    assert module.code_version(("collector",)) == first


def test_a_local_edit_marks_the_version_dirty(checkout):
    repo, module = checkout
    (repo / "collector" / "write.py").write_text("ROWS = 3\n")
    assert module.code_version(("collector",)).endswith(".dirty")
    assert not module.code_version(("common",)).endswith(".dirty")
