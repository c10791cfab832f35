"""The private RLlib and torch APIs we depend on are all listed in one module, and still there."""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
from pathlib import Path

import pytest

from tests.conftest import REPO
from training.algorithms import rllib_internals
from training.algorithms.rllib_internals import HOOKS, WRITTEN_FOR, resolve

OUR_PACKAGES = ("collectors", "common", "dataset_format", "evaluation", "pipelines", "training")
# Names to look for in our code; `.data` is too common a name to scan for.
HOOK_NAMES = {hook.name for hook in HOOKS.values()} - {"data"}


def test_installed_versions_are_those_the_hooks_were_written_for():
    installed = {package: importlib.metadata.version(package).split("+")[0] for package in WRITTEN_FOR}
    differ = {package: version for package, version in installed.items() if version != WRITTEN_FOR[package]}
    assert not differ, (
        f"installed {differ}, but training/algorithms/rllib_internals.py was written for {WRITTEN_FOR}: re-check "
        f"each of its hooks ({', '.join(HOOKS)}) against the new source, then update WRITTEN_FOR")


@pytest.mark.parametrize("key", sorted(HOOKS))
def test_each_hook_is_still_in_the_installed_source(key):
    hook = HOOKS[key]
    owner = resolve(hook)
    # Instance attributes exist only once built: the owner's source (or its bases') must still name them.
    sources = [inspect.getsource(cls) for cls in inspect.getmro(owner)
               if cls.__module__.startswith(("ray.", "torch"))] if inspect.isclass(owner) else []
    assert hasattr(owner, hook.name) or any(hook.name in source for source in sources), (
        f"{hook.owner} no longer has {hook.name} ({hook.why}); adapt the code using it through rllib_internals")


def _python_files() -> list[Path]:
    return [path for package in OUR_PACKAGES for path in (REPO / package).rglob("*.py")]


def test_private_names_are_used_only_through_rllib_internals():
    wall = Path(rllib_internals.__file__).resolve()
    offenders = []
    for path in _python_files():
        if path.resolve() == wall:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            calls_base = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", "") == "super"  # an override calling what it overrides
            if isinstance(node, ast.Attribute) and node.attr in HOOK_NAMES and not calls_base:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} uses .{node.attr}")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch" \
                    and node.attr.startswith("_"):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} uses torch.{node.attr}")
            if isinstance(node, ast.FunctionDef) and node.name in HOOK_NAMES:
                hooked = any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "private_hook"
                             for d in node.decorator_list)
                if not hooked:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} overrides {node.name} "
                                     "without @private_hook")
    assert not offenders, "private RLlib/torch APIs used around training/algorithms/rllib_internals.py: " + \
        "; ".join(offenders)


def test_an_unlisted_hook_is_refused():
    with pytest.raises(KeyError, match="not listed"):
        rllib_internals.private_hook("Learner._something_new")
