"""The layout is the architecture: which part of nbdist may import which, and no import circles (ast, no kernel).

Every import counts, also one inside a function: it is a dependency all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nbdist"
BASE = "base"  # errors, config, ranksets, gathered, _version: under everything
TOP = "top"  # the entry points: magics, extension, session, cli, demo, script, __init__, __main__
BASE_MODULES = {"errors", "config", "ranksets", "gathered", "_version"}

# What each part may import, besides itself and the base. The top may import anything.
ALLOWED: dict[str, set[str]] = {
    BASE: set(),
    "world": set(),
    "backend": {"world"},
    "view": set(),
    "cell": {"world", "backend", "view"},
    "drive": {"world", "backend", "view", "cell"},
    "measure": {"world", "backend", "view", "cell", "drive"},
    "job": {"world", "backend", "view", "drive"},
    "debug": {"world", "view"},
    "heal": {"world", "view"},
    "diverge": {"world", "view"},
}
PARTS = set(ALLOWED) - {BASE}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """The part a module of nbdist belongs to: a subpackage, the base, or the top."""
    pieces = module.split(".")
    if len(pieces) >= 2 and pieces[1] in PARTS:
        return pieces[1]
    if len(pieces) == 2 and pieces[1] in BASE_MODULES:
        return BASE
    return TOP


def imported(path: Path) -> set[str]:
    """The nbdist modules ``path`` imports (``from . import x`` counts as module ``x`` where x is one)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "nbdist")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != "nbdist":
                continue
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                found.add(candidate if _is_module(candidate) else source)
    return {m for m in found if m != here}


def _is_module(name: str) -> bool:
    relative = Path(*name.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").exists() or (PACKAGE / relative / "__init__.py").exists()


def graph() -> dict[str, set[str]]:
    return {module_name(p): imported(p) for p in sorted(PACKAGE.rglob("*.py"))}


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import that goes against the allowed directions, in words."""
    wrong = []
    for module, targets in sorted(edges.items()):
        source = part_of(module)
        if source == TOP:
            continue
        for target in sorted(targets):
            into = part_of(target)
            if into in (source, BASE) or into in ALLOWED[source]:
                continue
            wrong.append(f"{module} ({source}) imports {target} ({into})")
    return wrong


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module, or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_import_goes_in_an_allowed_direction():
    assert upward(graph()) == []


def test_there_are_no_import_circles():
    assert circles(graph()) == []


def test_the_base_imports_nothing_of_nbdist_but_the_base():
    edges = graph()
    for module in (m for m in edges if part_of(m) == BASE):
        assert {part_of(t) for t in edges[module]} <= {BASE}, module


def test_each_part_says_what_it_owns_and_may_import():
    for part in sorted(PARTS):
        doc = ast.get_docstring(ast.parse((PACKAGE / part / "__init__.py").read_text())) or ""
        assert "May import" in doc, part
        for module in sorted((PACKAGE / part).glob("*.py")):
            if module.stem != "__init__":
                assert f"``{module.stem}``" in doc, f"nbdist/{part}/__init__.py does not name {module.stem}"


def test_the_top_holds_only_the_entry_points_and_the_shared_base():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {"__init__", "__main__", "magics", "magicflags", "healmagics", "divergemagics", "extension",
                   "session", "cli", "demo", "script"} | BASE_MODULES


# --- the checker itself, on made-up graphs: it must be able to fail --------------------------------
def test_an_import_from_the_view_into_the_world_is_named():
    edges = {"nbdist.view.celltable": {"nbdist.world.store", "nbdist.errors"}, "nbdist.world.store": set()}
    assert upward(edges) == ["nbdist.view.celltable (view) imports nbdist.world.store (world)"]


def test_the_world_may_not_import_a_cell_but_a_cell_may_import_the_world():
    edges = {"nbdist.world.world": {"nbdist.cell.cells"}, "nbdist.cell.cells": {"nbdist.world.world"}}
    assert upward(edges) == ["nbdist.world.world (world) imports nbdist.cell.cells (cell)"]
    assert circles(edges) == [["nbdist.cell.cells", "nbdist.world.world"]]


@pytest.mark.parametrize("module,part", [("nbdist.errors", BASE), ("nbdist.magics", TOP), ("nbdist", TOP),
                                         ("nbdist.view.align", "view"), ("nbdist.view", "view")])
def test_modules_are_placed_by_their_path(module, part):
    assert part_of(module) == part
