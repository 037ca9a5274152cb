"""No import cycle inside nsq_spark: every import statement (module level or inside a
function) is an edge; a strongly connected component of more than one module is a cycle.
Imports under ``if TYPE_CHECKING:`` never run, so they are not edges (the package's
``__init__`` names its public classes there for type checkers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nsq_spark

pytestmark = pytest.mark.unit

ROOT = Path(nsq_spark.__file__).parent

def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import mod` imports the module pkg.mod
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            graph[mod].update(t for t in targets if t in files and t != mod)
    return graph


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]


def test_the_walk_resolves_relative_imports():
    graph = import_graph()
    assert "nsq_spark.protocol" in graph["nsq_spark.producer"]
    assert "nsq_spark.spool.format" in graph["nsq_spark.spool.store"]


def test_type_checking_imports_are_not_edges():
    graph = import_graph()
    assert "nsq_spark.producer" not in graph["nsq_spark"]


def test_no_import_cycle_inside_nsq_spark():
    assert [sorted(c) for c in cycles(import_graph())] == []
