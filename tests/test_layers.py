"""The package's import structure: no circle between modules, and no import against the declared layer order."""

from __future__ import annotations

import ast
from pathlib import Path

from repo_files import REPO

PACKAGE = REPO / "tune_dfrl"
# Lowest first: a module may import its own package's modules and those of lower layers, never a higher one.
LAYERS = ("errors", "config", "backends", "paired", "state", "report", "tracking", "cluster", "tune", "search")
COMMANDS = ("cli", "__main__")  # a package's command sits above every layer; no library module imports it


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The tune_dfrl modules `path` imports, at module level or inside functions (TYPE_CHECKING imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{a.name}" for a in node.names)
            found.add(node.module)
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {m for m in found if m in modules}


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def layer(module: str) -> int | None:
    """The layer index of a library module (None: a command, the package root or a data package)."""
    parts = module.split(".")
    if len(parts) < 2 or parts[-1] in COMMANDS or parts[1] not in LAYERS:
        return None
    return LAYERS.index(parts[1])


def test_every_subpackage_has_a_declared_layer() -> None:
    declared = set(LAYERS) | {"conf", "policies", "trainers", "search_spaces"}
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert folders | modules <= declared, f"give {sorted((folders | modules) - declared)} a place in LAYERS"


def against_the_order(edges: dict[str, set[str]]) -> list[str]:
    """The imports that go up the layers, or from a library module to a command."""
    found = []
    for module, targets in edges.items():
        for target in targets:
            if target.split(".")[-1] in COMMANDS and module.split(".")[-1] not in COMMANDS:
                found.append(f"{module} -> {target} (a command)")
            elif layer(module) is not None and layer(target) is not None and layer(target) > layer(module):
                found.append(f"{module} -> {target}")
    return sorted(found)


def circles(edges: dict[str, set[str]]) -> list[str]:
    """Every import circle a depth-first walk of `edges` meets (a module importing its own package does not count)."""
    edges = {m: {t for t in ts if t != m and not m.startswith(t + ".")} for m, ts in edges.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[str] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                found.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return found


def test_the_checks_catch_what_they_name() -> None:
    edges = {
        "tune_dfrl.paired.ledger": {"tune_dfrl.search.run"},
        "tune_dfrl.search.run": {"tune_dfrl.search.finish", "tune_dfrl.paired.ledger"},
        "tune_dfrl.search.finish": {"tune_dfrl.search.run", "tune_dfrl.report.cli"},
    }
    assert against_the_order(edges) == [
        "tune_dfrl.paired.ledger -> tune_dfrl.search.run",
        "tune_dfrl.search.finish -> tune_dfrl.report.cli (a command)",
    ]
    assert circles(edges) == [
        "tune_dfrl.paired.ledger -> tune_dfrl.search.run -> tune_dfrl.paired.ledger",
        "tune_dfrl.search.run -> tune_dfrl.search.finish -> tune_dfrl.search.run",
    ]


def test_no_import_against_the_layer_order() -> None:
    upward = against_the_order(graph())
    assert not upward, "imports against the layer order (LAYERS, lowest first):\n" + "\n".join(upward)


def test_no_import_circle() -> None:
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(found)
