"""The private RLlib and torch APIs we depend on are all listed in one module, and still there."""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
from pathlib import Path

import pytest

from tests.conftest import PACKAGES, REPO, repo_files
from training.algorithms import rllib_internals
from training.algorithms.rllib_internals import HOOKS, WRITTEN_FOR, resolve

# Names to look for in our code; `.data` is too common a name to scan for.
HOOK_NAMES = {hook.name for hook in HOOKS.values()} - {"data"}
DECLARED = {hook.name for hook in HOOKS.values()}


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


def _python_files(*folders: str) -> list[Path]:
    """The repository's Python files under `folders` (all of them by default)."""
    return [path for path in repo_files("*.py") if not folders or path.relative_to(REPO).parts[0] in folders]


# Public names that start with an underscore: os._exit (the end of a forked child, pipelines/warm.py).
PUBLIC_UNDERSCORED = {"_exit"}


def _is_private(name: str | None) -> bool:
    return bool(name) and name.startswith("_") and not name.startswith("__") and name not in PUBLIC_UNDERSCORED


def _hooked(node: ast.AST) -> bool:
    return any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "private_hook"
               for d in getattr(node, "decorator_list", []))


def _our_private_names(trees: list[ast.AST]) -> set[str]:
    """Private names our own code defines: functions, classes, module names, and attributes set on `self`/`cls`
    (an override of a library's private method, marked @private_hook, is not ours)."""
    ours = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not _hooked(node):
                ours.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                ours.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                ours.add(node.attr)
    return {name for name in ours if _is_private(name)}


def _private_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each private attribute, keyword argument or module imported under `tree`."""
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            uses.append((node.lineno, node.attr))
        elif isinstance(node, ast.keyword) and _is_private(node.arg):
            uses.append((node.lineno, node.arg))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] not in PACKAGES:
            uses.extend((node.lineno, name) for name in [*node.module.split("."), *(a.name for a in node.names)]
                        if _is_private(name))
        elif isinstance(node, ast.Import):
            uses.extend((node.lineno, part) for alias in node.names for part in alias.name.split(".")
                        if _is_private(part))
    return uses


def test_no_private_library_name_is_used_anywhere_unless_the_wall_declares_it():
    # A deny-list: every private name our code, tests and benchmarks touch is either ours or listed in HOOKS.
    files = _python_files()
    trees = {path: ast.parse(path.read_text()) for path in files}
    ours = _our_private_names(list(trees.values()))
    offenders = [f"{path.relative_to(REPO)}:{line} uses {name}" for path, tree in trees.items()
                 for line, name in _private_uses(tree) if name not in ours and name not in DECLARED]
    assert not offenders, ("private library names used without a hook in training/algorithms/rllib_internals.py "
                           "(list it in HOOKS with why, and reach it through an accessor there): "
                           + "; ".join(offenders))


def test_the_scan_finds_a_private_name_on_a_library_object():
    tree = ast.parse("learner._new_private_thing\nf(_secret=1)\nfrom mlflow._internal import x\n")
    assert sorted(name for _, name in _private_uses(tree)) == ["_internal", "_new_private_thing", "_secret"]


def test_declared_names_are_used_only_through_rllib_internals():
    # Our packages reach the hooks through the wall's accessors, or override them marked @private_hook.
    wall = Path(rllib_internals.__file__).resolve()
    offenders = []
    for path in _python_files(*PACKAGES):
        if path.resolve() == wall:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            calls_base = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", "") == "super"  # an override calling what it overrides
            if isinstance(node, ast.Attribute) and node.attr in HOOK_NAMES and not calls_base:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} uses .{node.attr}")
            if isinstance(node, ast.keyword) and node.arg in HOOK_NAMES and _is_private(node.arg):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} passes {node.arg}")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch" \
                    and node.attr.startswith("_"):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} uses torch.{node.attr}")
            if isinstance(node, ast.FunctionDef) and node.name in HOOK_NAMES and not _hooked(node):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} overrides {node.name} "
                                 "without @private_hook")
    assert not offenders, "private RLlib/torch APIs used around training/algorithms/rllib_internals.py: " + \
        "; ".join(offenders)


def test_an_unlisted_hook_is_refused():
    with pytest.raises(KeyError, match="not listed"):
        rllib_internals.private_hook("Learner._something_new")
