"""The consumer's shape, checked from the source (no sockets): no import cycle inside
nsq_spark, the parts never import the Reader that owns them, and no class grows back into
a god object."""

from __future__ import annotations

import ast
import pathlib

import pytest

import nsq_spark

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(nsq_spark.__file__).parent


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, package: str) -> set[str]:
    """nsq_spark modules imported at run time (``if TYPE_CHECKING:`` blocks excluded)."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and ast.unparse(node.test).endswith("TYPE_CHECKING") for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("nsq_spark")}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("nsq_spark"):
                out.add(name)
                out |= {f"{name}.{a.name}" for a in node.names}
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps = {m for m in _imports(path, package) if m in files and m != mod}
        # ``from . import sibling`` names the sibling, not its package's __init__ (which
        # runs first anyway: packages are left out, or every child would cycle with them)
        graph[mod] = {m for m in deps if not (m == package or mod.startswith(m + "."))}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per back edge of a depth-first walk (empty: no cycle at all)."""
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(mod: str, stack: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph[mod]):
            if state.get(dep) == 1:
                found.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    return found


CONSUMER = ("nsq_spark.consumer", "nsq_spark._loop", "nsq_spark.reader", "nsq_spark.message",
            "nsq_spark.rdy", "nsq_spark.backoff", "nsq_spark.lookupd", "nsq_spark.conn")


def test_no_import_cycle_through_the_consumer():
    # (the producer's modules are another part of issue #11)
    cycles = [c for c in _cycles(_graph()) if any(m.startswith(CONSUMER) for m in c)]
    assert not cycles, cycles


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_consumer_parts_never_import_their_owner():
    graph = _graph()
    owners = {"nsq_spark.consumer.reader", "nsq_spark.consumer", "nsq_spark.reader"}
    for mod, deps in graph.items():
        if mod.startswith("nsq_spark.consumer.") and mod != "nsq_spark.consumer.reader":
            assert not deps & owners, f"{mod} imports {deps & owners}"
    assert not graph["nsq_spark._loop"] & owners


@pytest.mark.parametrize("path", sorted((ROOT / "consumer").glob("*.py")) + [ROOT / "_loop.py"],
                         ids=lambda p: p.name)
def test_no_consumer_class_over_600_lines_and_the_reader_under_500(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            lines = node.end_lineno - node.lineno + 1
            limit = 500 if node.name == "Reader" else 600
            assert lines < limit, f"{path.name}: class {node.name} has {lines} lines"
