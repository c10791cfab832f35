"""Every import runs downward: the packages are floors, each importing only those below it, and no module imports
itself back through others (imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import PACKAGES, REPO


def imports_of(path: Path) -> set[str]:
    """Our modules that `path` imports, anywhere in it; `from pkg import name` counts as `pkg.name` when that is
    a module, else as `pkg`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if module_file(f"{node.module}.{alias.name}") else node.module
                     for alias in node.names]
        found.update(name for name in names if name.split(".")[0] in PACKAGES)
    return found


def module_file(name: str) -> Path | None:
    base = REPO / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def module_graph() -> dict[str, set[str]]:
    graph = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            graph[name] = {imported for imported in imports_of(path) if module_file(imported)}
    return graph


def test_each_package_imports_only_the_floors_below_it():
    upward = [f"{module} imports {imported}" for module, imports in module_graph().items() for imported in imports
              if PACKAGES.index(imported.split(".")[0]) > PACKAGES.index(module.split(".")[0])]
    assert not upward, f"imports that run upward (floors, lowest first: {', '.join(PACKAGES)}): {'; '.join(upward)}"


def test_no_module_imports_itself_back():
    graph = module_graph()
    cycles, done = [], set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            cycles.append(" -> ".join([*trail[trail.index(module):], module]))
            return
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            # A package's __init__ re-exports its modules: a module importing its own package is no circle.
            if not module.startswith(imported + "."):
                visit(imported, [*trail, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert not cycles, f"import circles: {'; '.join(cycles)}"


def test_the_floors_name_every_package():
    packages = {path.parent.name for path in REPO.glob("*/__init__.py")} - {"tests", "benchmarks"}
    assert packages == set(PACKAGES)
