"""Every dvc.yaml stage declares the code it runs, so DVC never calls a stage up to date after its code changed.

A stage's code is the module its `orl` subcommand hands the work to (the imports of `cmd_NAME` in
pipelines/cli.py) and every project module that one imports, at the top or inside a function (algorithms are
imported lazily). pipelines/ itself is the thin entrypoint: params are declared under `params:`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from tests.conftest import PACKAGES, REPO

CODE = tuple(package for package in PACKAGES if package != "pipelines")  # the thin entrypoint is not a dep


def module_path(name: str) -> Path | None:
    """The file of a project module (`training.train`, or a package's __init__), None for other modules."""
    if name.split(".")[0] not in CODE:
        return None
    base = REPO / Path(*name.split("."))
    return base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"


def imported_modules(tree: ast.AST) -> set[str]:
    """Modules named by the import statements under `tree`; `from pkg import mod` counts as `pkg.mod` too."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def code_closure(roots: set[str]) -> set[Path]:
    """The project files that the modules `roots` import, transitively, themselves included."""
    files, pending = set(), [module_path(name) for name in roots]
    while pending:
        path = pending.pop()
        if path is None or path in files or not path.exists():
            continue  # not ours, seen, or a name imported from a module (not a module itself)
        if path.stat().st_size:  # an empty __init__.py holds no code
            files.add(path)
        pending.extend(module_path(name) for name in imported_modules(ast.parse(path.read_text())))
    return files


def subcommand_code(subcommand: str) -> set[Path]:
    cli = ast.parse((REPO / "pipelines" / "cli.py").read_text())
    handler = f"cmd_{subcommand.replace('-', '_')}"
    function = next(node for node in cli.body if isinstance(node, ast.FunctionDef) and node.name == handler)
    return code_closure(imported_modules(function))


def stages() -> list[tuple[str, str, list[str]]]:
    """(stage name, orl subcommand, deps) of every stage in dvc.yaml."""
    rows = []
    for name, stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].items():
        body = stage.get("do", stage)
        command = body["cmd"].split()
        assert command[0] == "orl", f"stage {name} should call orl"
        subcommand = f"{command[1]}-{command[2]}" if command[1] == "datasets" else command[1]
        rows.append((name, subcommand, body.get("deps", [])))
    return rows


STAGES = stages()


@pytest.mark.parametrize(("stage", "subcommand", "deps"), STAGES, ids=[row[0] for row in STAGES])
def test_stage_declares_the_code_it_runs(stage, subcommand, deps):
    declared = [REPO / dep for dep in deps if dep.split("/")[0] in CODE]  # not data, not other stages' outs
    assert all(path.exists() for path in declared), f"dvc.yaml stage {stage} names code that does not exist"
    missing = sorted(str(path.relative_to(REPO)) for path in subcommand_code(subcommand)
                     if not any(path == dep or dep in path.parents for dep in declared))
    assert not missing, f"dvc.yaml stage {stage} runs code it does not declare: add {missing} to its deps"


def test_the_closure_follows_lazy_imports():
    # The registry imports the offline learners inside functions; they must count.
    code = subcommand_code("train")
    algorithms = REPO / "training" / "algorithms"
    assert algorithms / "offline_dqn.py" in code and algorithms / "lean_learner.py" in code
    assert REPO / "evaluation" / "report.py" not in code


def test_training_follows_the_data_one_way():
    # `orl train` reads datasets and never the collectors that wrote them.
    assert not [path for path in subcommand_code("train") if path.is_relative_to(REPO / "collectors")]


@pytest.mark.parametrize("name", ["suite", "atari", "mujoco"])
def test_each_suite_is_a_dvc_project_running_the_same_stages_with_the_same_code(name):
    # Its own DVC project, so the quick tour's `dvc status` never lists it; the root's dvc.yaml and code folders
    # through links, so nothing is copied.
    suite = REPO / "benchmarks" / name
    assert (suite / ".dvc" / "config").is_file()
    assert (suite / "dvc.yaml").is_symlink() and (suite / "dvc.yaml").resolve() == REPO / "dvc.yaml"
    code = {dep.split("/")[0] for _, _, deps in STAGES for dep in deps if dep.split("/")[0] in CODE}
    for package in code:
        assert (suite / package).is_symlink() and (suite / package).resolve() == REPO / package, package
