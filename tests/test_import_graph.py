"""No import cycles among fxcc's modules, lazy imports (inside functions) included.

The graph is read from the sources with `ast`: every `import` and `from ... import` anywhere in a
module (function bodies too) is an edge, except those under `if TYPE_CHECKING:` (never run). A
`from package import name` edge goes to the submodule `name` when there is one, else to the
package. pyproject maps fxcc's parts (fxcc.client = client/, ...), so that map is read here too.
"""

from __future__ import annotations

import ast
import functools
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    package_dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    mods: dict[str, Path] = {}
    for package, folder in package_dirs.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(REPO / folder).with_suffix("").parts if p != "__init__"]
            mods[".".join([package, *parts])] = path
    return mods


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


@functools.cache
def import_graph() -> dict[str, frozenset[str]]:
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                found = target if target in mods else resolve(target)
                if found and found != module and found.startswith("fxcc"):
                    edges[module].add(found)
    return {m: frozenset(e) for m, e in edges.items()}


def cycles(edges: dict[str, frozenset[str]] | dict[str, set[str]], prefix: str) -> list[list[str]]:
    """The strongly connected components of more than one module among those under `prefix`."""
    nodes = [m for m in edges if m == prefix or m.startswith(prefix + ".")]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in nodes:
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

    for v in nodes:
        if v not in index:
            visit(v)
    return found


def _describe(edges: dict[str, frozenset[str]], component: list[str]) -> str:
    return "; ".join(f"{m} -> {sorted(e for e in edges[m] if e in component)}" for m in component)


@pytest.mark.parametrize("package", ["fxcc.compiler_core", "fxcc.client", "fxcc.service", "fxcc.worker", "fxcc"])
def test_no_import_cycle(package: str) -> None:
    edges = import_graph()
    found = cycles(edges, package)
    assert not found, "import cycles: " + " | ".join(_describe(edges, c) for c in found)


def test_the_graph_sees_lazy_imports_and_would_report_a_cycle() -> None:
    edges = import_graph()
    # a lazy import (inside a function) is an edge: pipeline.py imports lowering at module level,
    # build.py imports the passes inside a function
    assert "fxcc.compiler_core.lowering" in edges["fxcc.compiler_core.pipeline"]
    assert "fxcc.compiler_core.passes" in edges["fxcc.compiler_core.build"]
    looped = {m: set(e) for m, e in edges.items()}
    looped["fxcc.compiler_core.wire"].add("fxcc.compiler_core.build")  # wire is imported by build's imports
    assert cycles(looped, "fxcc.compiler_core")


def test_compiler_core_knows_nothing_of_the_service() -> None:
    edges = import_graph()
    for module, targets in edges.items():
        if module.startswith("fxcc.compiler_core"):
            assert not {t for t in targets if t.startswith(("fxcc.service", "fxcc.worker", "fxcc.client"))}, module
