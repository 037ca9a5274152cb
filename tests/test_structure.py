"""The library's shape, checked from the source (no sockets): no import cycle of any kind
inside nsq_spark, between modules or between packages, no import running back up the
layers (:data:`LAYERS`), parts never import the facade that owns them, the project never imports
its own compatibility shims (which keep working for users), the package says which root
modules are public, and a class's public attributes exist whatever branch its
``__init__`` took.

The import graph sees every edge a module has on another: module-level imports, imports
inside functions, imports under ``if TYPE_CHECKING:`` (a type-level cycle is a cycle: the
two modules cannot be understood, or split, one without the other) and
``importlib.import_module("...")`` calls, whose module names are string constants.
``from . import sibling`` is an edge to the sibling module; ``from . import NAME`` of a name
defined in the enclosing package's ``__init__`` is an edge to that ``__init__`` (which, if
it imported the module back, would hand it a half-initialised package). A strongly
connected component of more than one module is a cycle. The same walk over packages (each
module counted as its top-level package or root module: ``nsq_spark._publish.tcp`` is
``nsq_spark._publish``) finds circles that no module-level cycle shows: publish -> spool ->
publish through different modules is one.

One kind of edge is left out of the graph: an import inside a function that warns
``DeprecationWarning``, a shim kept for users for one release (a method that moved up a
layer, say). They are listed in :data:`DEPRECATED_SHIM_EDGES` with the release they go
in, and a test holds the list to what the source has.

These are shape rules, not size rules: a class is as long as its one job needs (the line
caps this file had invited trimming and were dropped in issue #23).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

import nsq_spark

pytestmark = pytest.mark.unit

ROOT = Path(nsq_spark.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_files() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _warns_deprecation(func: ast.AST) -> bool:
    """Whether a function calls ``warn(..., DeprecationWarning, ...)`` in its own body."""
    return any(isinstance(c, ast.Call) and isinstance(c.func, (ast.Name, ast.Attribute))
               and (c.func.id if isinstance(c.func, ast.Name) else c.func.attr) == "warn"
               and any(isinstance(a, ast.Name) and a.id == "DeprecationWarning"
                       for a in [*c.args, *(k.value for k in c.keywords)])
               for c in ast.walk(func))


def imported_names(mod: str, path: Path, files: dict[str, Path],
                   shims: list[tuple[str, str]] | None = None
                   ) -> list[tuple[str, str | None]]:
    """Every ``(module, name)`` that ``mod`` imports from nsq_spark, anywhere in its source
    (``name`` is None for a whole-module import). ``from pkg import sub`` of a submodule
    is the module ``pkg.sub``; ``importlib.import_module("x")`` is the module ``x``; a
    module that calls ``import_module`` with a computed name is taken to import every
    nsq_spark module that one of its string constants names (its table of lazy imports).
    Imports inside a function that warns ``DeprecationWarning`` are left out, and appended
    to ``shims`` as ``(mod, module)`` when it is given."""
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    in_shim = {id(n) for f in ast.walk(tree)
               if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and _warns_deprecation(f)
               for n in ast.walk(f)}
    out: list[tuple[str, str | None]] = []
    computed_import = False
    for node in ast.walk(tree):
        if id(node) in in_shim and isinstance(node, (ast.Import, ast.ImportFrom)):
            if shims is not None:
                found = [m for m, _ in imported_names_of(node, package, files)]
                shims += [(mod, m) for m in found if m in files]
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out += imported_names_of(node, package, files)
        elif isinstance(node, ast.Call) and _is_import_module(node.func):
            arg = node.args[0] if node.args else None
            if id(node) in in_shim:   # a shim's import (nsq_spark._moved's loader, say)
                if shims is not None and isinstance(arg, ast.Constant) \
                        and arg.value in files:
                    shims.append((mod, arg.value))
                continue
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.append((arg.value, None))
            else:
                computed_import = True
    if computed_import:
        # a logger's name is no import, though it may read as a module's
        logger_names = {id(a) for c in ast.walk(tree)
                        if isinstance(c, ast.Call) and _is_get_logger(c.func) for a in c.args}
        out += [(c.value, None) for c in ast.walk(tree)
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in files
                and id(c) not in logger_names]
    return [(m, n) for m, n in out if m in files]


def imported_names_of(node: ast.Import | ast.ImportFrom, package: str,
                      files: dict[str, Path]) -> list[tuple[str, str | None]]:
    """The ``(module, name)`` pairs of one import statement (as :func:`imported_names`)."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return [(f"{base}.{a.name}", None) if f"{base}.{a.name}" in files else (base, a.name)
            for a in node.names]


def _is_get_logger(func: ast.expr) -> bool:
    names = ("getLogger", "get_logger")  # logging's, and nsq_spark._log's
    return (isinstance(func, ast.Attribute) and func.attr in names) or \
        (isinstance(func, ast.Name) and func.id in names)


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
        (isinstance(func, ast.Name) and func.id == "import_module")


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {mod: {m for m, _ in imported_names(mod, path, files) if m != mod}
            for mod, path in files.items()}


def unit_of(mod: str) -> str:
    """The top-level package or root module ``mod`` belongs to (``nsq_spark`` itself for
    the package's ``__init__``)."""
    return ".".join(mod.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with every module counted as its :func:`unit_of`."""
    out: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        out.setdefault(unit_of(mod), set()).update(
            unit_of(t) for t in targets if unit_of(t) != unit_of(mod))
    return out


def deprecated_shim_edges() -> set[tuple[str, str]]:
    files = module_files()
    found: list[tuple[str, str]] = []
    for mod, path in files.items():
        imported_names(mod, path, files, found)
    return set(found)


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
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


def _graph_of(source: str, tmp_path: Path) -> set[str]:
    """The edges of one module ``nsq_spark.probe`` with ``source``, against the real
    package's module names."""
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    files = {**module_files(), "nsq_spark.probe": probe}
    return {m for m, _ in imported_names("nsq_spark.probe", probe, files)}


# -- the walk itself ---------------------------------------------------------------------


def test_the_walk_sees_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]


def test_the_walk_resolves_relative_imports():
    graph = import_graph()
    assert "nsq_spark.protocol" in graph["nsq_spark._conn"]
    assert "nsq_spark._publish.direct" in graph["nsq_spark._publish.producer"]
    assert "nsq_spark.spool._format" in graph["nsq_spark.spool._store"]
    assert "nsq_spark._addresses" in graph["nsq_spark.testing.chaos"]
    assert "nsq_spark.testing.processes" in graph["nsq_spark.testing.chaos"]
    assert "nsq_spark.testing.processes" in graph["nsq_spark.testing"]  # its re-exports
    assert "nsq_spark.testing._binaries" in graph["nsq_spark.testing.install"]


def test_type_checking_function_level_and_import_module_imports_are_edges(tmp_path):
    edges = _graph_of(
        "from typing import TYPE_CHECKING\n"
        "import importlib\n"
        "if TYPE_CHECKING:\n"
        "    from nsq_spark._conn import Connection\n"
        "def f():\n"
        "    from nsq_spark import protocol\n"
        "    return importlib.import_module('nsq_spark._lookupd')\n", tmp_path)
    assert edges == {"nsq_spark._conn", "nsq_spark.protocol", "nsq_spark._lookupd"}


def test_a_computed_import_module_depends_on_every_module_named_in_the_file(tmp_path):
    edges = _graph_of(
        "import importlib\n"
        "import logging\n"
        "log = logging.getLogger('nsq_spark._lookupd')  # a logger's name: no edge\n"
        "TABLE = {'Reader': 'nsq_spark._consumer.reader', 'x': 'not a module'}\n"
        "def get(name):\n"
        "    return importlib.import_module(TABLE[name])\n", tmp_path)
    assert edges == {"nsq_spark._consumer.reader"}


def test_the_package_s_lazy_table_and_type_checking_block_are_edges():
    graph = import_graph()
    assert {"nsq_spark._consumer.reader", "nsq_spark.compat.writer"} <= graph["nsq_spark"]


# -- no cycle --------------------------------------------------------------------------------


def test_no_import_cycle_inside_nsq_spark():
    assert [sorted(c) for c in cycles(import_graph())] == []


def test_the_package_walk_sees_a_circle_no_module_cycle_shows():
    graph = {"nsq_spark.a.x": {"nsq_spark.b.y"}, "nsq_spark.b.y": set(),
             "nsq_spark.b.z": {"nsq_spark.a.w"}, "nsq_spark.a.w": set()}
    assert cycles(graph) == []
    assert cycles(package_graph(graph)) == [frozenset({"nsq_spark.a", "nsq_spark.b"})]


def test_no_package_level_circle_inside_nsq_spark():
    assert [sorted(c) for c in cycles(package_graph(import_graph()))] == []


# -- the layers: no import runs back up ------------------------------------------------------

#: The layers, bottom first. A module may import its own package, and the packages and root
#: modules of its own layer or the layers below; never one above (a same-layer pair is kept
#: acyclic by the package-level cycle test). Every root module and package has a place.
#:
#: * telemetry is a foundation: it keeps the providers and the shared helpers, and each
#:   instrument lives beside what it measures (consumer/, publish/, spark/ import it);
#: * the retry policy (``_retry``) is below both ``spool`` (the drain retries) and
#:   ``publish``; ``spool`` is below ``publish``: the Producer composes a spool, the spool
#:   never knows the Producer;
#: * ``spark`` is above the facades: its sink publishes through the Producer facade and its
#:   fetch tasks read through the Reader facade, as any application would;
#: * the entry points and the old paths kept for users are on top.
LAYERS: list[tuple[str, set[str]]] = [
    ("foundations: errors, values, wire format, telemetry providers, retry policy",
     {"errors", "_version", "envelope", "_validate", "_addresses", "_log", "_codecs",
      "_rdy_credit", "message", "protocol", "_loop", "telemetry", "_retry",
      "_strict_argparse", "_options"}),
    ("connections, HTTP clients, discovery, deduplicators",
     {"config", "_handshake", "_sync_conn", "_conn", "admin", "_lookupd", "dedup"}),
    ("the publish spool", {"spool"}),
    ("the facades and their parts", {"_publish", "_consumer"}),
    ("on the facades: pynsq's surface, contrib, Spark, the test harness, Prometheus",
     {"compat", "contrib", "spark", "testing", "metrics"}),
    ("entry points and the old paths kept for users",
     {"cli", "__main__", "", "reader", "writer", "producer", "rdy", "backoff", "install",
      "testing_chaos", "publish_spool", "_moved"}),
]

#: Deprecation shims that import up a layer (leaving the graph, see the module doc):
#: (module, what it imports) -> what they keep, and until when.
DEPRECATED_SHIM_EDGES = {
    ("nsq_spark.telemetry", "nsq_spark.spark.instrument"):
        "Telemetry.record_progress() / forget_query() of 0.1.0 (now "
        "nsq_spark.spark.ProgressInstrument): removed in the release after the next",
}


def _layer_of() -> dict[str, int]:
    return {f"nsq_spark.{name}" if name else "nsq_spark": i
            for i, (_, names) in enumerate(LAYERS) for name in names}


def test_every_package_and_root_module_has_one_layer():
    placed = [name for _, names in LAYERS for name in names]
    assert len(placed) == len(set(placed)), "a name is in two layers"
    units = {unit_of(m) for m in module_files()}
    assert sorted(units - set(_layer_of())) == [], "give each a place in LAYERS"
    assert sorted(set(_layer_of()) - units) == [], "LAYERS names what does not exist"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    layer = _layer_of()
    return sorted(f"{mod} imports {target} ({LAYERS[layer[unit_of(target)]][0]!r} is "
                  f"above {LAYERS[layer[unit_of(mod)]][0]!r})"
                  for mod, targets in graph.items() for target in targets
                  if layer[unit_of(target)] > layer[unit_of(mod)])


def test_the_layer_rule_sees_an_import_up_and_allows_one_down():
    graph = {"nsq_spark.spool._drain": {"nsq_spark._publish.stats", "nsq_spark._retry"},
             "nsq_spark.spark.sink": {"nsq_spark._publish.producer"}}
    assert [line.split(" (")[0] for line in upward_imports(graph)] == [
        "nsq_spark.spool._drain imports nsq_spark._publish.stats"]


def test_no_import_runs_back_up_the_layers():
    assert upward_imports(import_graph()) == []


def test_the_deprecation_shims_that_import_up_are_the_listed_ones():
    assert deprecated_shim_edges() == set(DEPRECATED_SHIM_EDGES)


def test_a_deprecation_shim_is_seen_only_inside_a_warning_function(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import warnings\n"
                     "def old():\n"
                     "    warnings.warn('gone soon', DeprecationWarning)\n"
                     "    from nsq_spark import _lookupd\n"
                     "def current():\n"
                     "    from nsq_spark import _conn\n")
    files = {**module_files(), "nsq_spark.probe": probe}
    shims: list[tuple[str, str]] = []
    edges = {m for m, _ in imported_names("nsq_spark.probe", probe, files, shims)}
    assert edges == {"nsq_spark._conn"}
    assert shims == [("nsq_spark.probe", "nsq_spark._lookupd")]


# -- parts never import their owner ------------------------------------------------------------

# facade -> the packages of its parts, which must never import it
OWNERS = {
    "nsq_spark._consumer.reader": ("nsq_spark._consumer.", "nsq_spark._loop"),
    "nsq_spark._publish.producer": ("nsq_spark._publish.", "nsq_spark.spool.", "nsq_spark._loop"),
}
FACADE_ALIASES = {"nsq_spark._consumer.reader": {"nsq_spark._consumer", "nsq_spark.reader"},
                  "nsq_spark._publish.producer": {"nsq_spark.producer", "nsq_spark.publish_spool",
                                                 "nsq_spark.writer", "nsq_spark.compat.writer"}}


@pytest.mark.parametrize("owner", sorted(OWNERS))
def test_parts_never_import_their_owner(owner):
    graph = import_graph()
    forbidden = {owner} | FACADE_ALIASES[owner]
    parts = [m for m in graph if m != owner and m.startswith(OWNERS[owner])]
    assert parts, f"no parts found for {owner}"
    bad = {part: sorted(graph[part] & forbidden) for part in parts if graph[part] & forbidden}
    assert bad == {}


# -- shims: for users only ---------------------------------------------------------------------

#: Old import paths kept for users -> the modules that now define what they export.
SHIMS = {
    "nsq_spark.reader": ("nsq_spark._consumer.reader", "nsq_spark._consumer.run",
                         "nsq_spark._consumer.pool", "nsq_spark.compat.reader_names",
                         "nsq_spark.compat.async_conn", "nsq_spark.compat.backoff_timer",
                         "nsq_spark.message"),
    "nsq_spark.writer": ("nsq_spark.compat.writer",),
    "nsq_spark.producer": ("nsq_spark._publish.producer", "nsq_spark.compat.writer",
                           "nsq_spark.errors"),
    "nsq_spark.rdy": ("nsq_spark._consumer.rdy", "nsq_spark._rdy_credit"),
    "nsq_spark.backoff": ("nsq_spark._consumer.backoff",),
    "nsq_spark.install": ("nsq_spark.testing.install",),
    "nsq_spark.testing_chaos": ("nsq_spark.testing.chaos",),
}
#: Single names a real module re-exports for users only: the project imports them from
#: where they are defined.
USER_REEXPORTS = {
    "nsq_spark._conn": {"SyncConnection": ("nsq_spark._sync_conn", "SyncConnection")},
    # the old name of the (host, port) alias, which shadowed nsq_spark.Producer
    "nsq_spark._lookupd": {"Producer": ("nsq_spark._lookupd", "ProducerAddress")},
}


def test_the_project_never_imports_its_own_shims():
    files = module_files()
    through_shims = sorted(
        f"{mod} imports {target}{'.' + name if name else ''}"
        for mod, path in files.items() if mod not in SHIMS
        for target, name in imported_names(mod, path, files)
        if target in SHIMS or name in USER_REEXPORTS.get(target, {}))
    assert through_shims == []


@pytest.mark.parametrize("shim", sorted(SHIMS))
def test_each_old_import_path_still_gives_users_the_same_objects(shim):
    old = importlib.import_module(shim)
    homes = [importlib.import_module(h) for h in SHIMS[shim]]
    exported = getattr(old, "__all__", None)
    assert exported, f"{shim} must list what it re-exports in __all__"
    for name in exported:
        defined = [getattr(h, name) for h in homes if name in vars(h)]
        assert defined, f"{shim}.{name} is not defined by any of {SHIMS[shim]}"
        assert getattr(old, name) is defined[0], f"{shim}.{name} is a copy, not a re-export"


@pytest.mark.parametrize("shim", sorted(SHIMS))
def test_a_shim_only_re_exports(shim):
    """A shim holds no code of its own: imports, ``__all__``, and at most the ``python -m``
    entry that calls its home's ``main``."""
    tree = ast.parse(Path(importlib.import_module(shim).__file__).read_text())
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            continue
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
            continue
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            continue
        pytest.fail(f"{shim} has code of its own: {ast.unparse(node)[:80]}")


@pytest.mark.parametrize("module, names", sorted(USER_REEXPORTS.items()))
def test_single_re_exported_names_are_the_objects_of_their_homes(module, names):
    mod = importlib.import_module(module)
    for name, (home_module, home_name) in names.items():
        assert getattr(mod, name) is getattr(importlib.import_module(home_module), home_name)


def test_the_old_paths_give_the_objects_the_package_root_gives():
    # each old path against its home (ensure_nsq, inject_periodically, SyncConnection, ...):
    # test_each_old_import_path_... and test_single_re_exported_names_... above
    from nsq_spark.reader import Reader, run
    from nsq_spark.writer import Writer

    assert Reader is nsq_spark.Reader and run is nsq_spark.run and Writer is nsq_spark.Writer


# -- public and private root modules -------------------------------------------------------------


def _public_modules_listed() -> set[str]:
    """The root modules the package docstring lists under "Public modules"."""
    doc = nsq_spark.__doc__ or ""
    lines = doc.partition("Public modules")[2].splitlines()[1:]
    section = lines[:lines.index("")] if "" in lines else lines
    return {m.group(1) for line in section for m in [re.match(r"\s*``(\w+)``", line)] if m}


def _is_private(mod: str) -> bool:
    return any(part.startswith("_") for part in mod.split(".")[1:])


def test_every_module_is_public_private_or_a_shim():
    """A module is private when a part of its dotted path starts with ``_``
    (``nsq_spark._consumer.pool``, ``nsq_spark.spool._store``); every other one is in a
    root module or package the package docstring lists as public, or is an old path kept
    for users."""
    # publish_spool: an old path that keeps the deprecated SpoolingProducer class
    shims = {s.rpartition(".")[2] for s in SHIMS} | {"publish_spool"}
    public = _public_modules_listed()
    assert public, "the package docstring must list its public modules"
    root = {unit_of(m).rpartition(".")[2] for m in module_files() if m != "nsq_spark"}
    assert public <= root, f"listed but missing: {sorted(public - root)}"
    assert not any(m.startswith("_") for m in public), "a private module listed as public"
    unclassified = sorted(m for m in module_files()
                          if m != "nsq_spark" and not _is_private(m)
                          and unit_of(m).rpartition(".")[2] not in public | shims)
    assert unclassified == [], ("name each root module or package in nsq_spark/__init__.py's "
                                "'Public modules' list, or make it private (_name)")
    assert not public & shims, f"shims listed as public: {sorted(public & shims)}"


def test_the_public_surface_is_the_one_decided():
    """Issue #37: the facades at the root, and these modules; the parts are private."""
    assert _public_modules_listed() == {
        "errors", "protocol", "message", "config", "envelope", "spool", "admin", "dedup",
        "compat", "contrib", "spark", "testing", "metrics", "telemetry", "cli"}
    public = {m for m in module_files() if not _is_private(m)}
    for part in ("nsq_spark._conn", "nsq_spark._sync_conn", "nsq_spark._handshake",
                 "nsq_spark._lookupd", "nsq_spark._consumer.pool", "nsq_spark._publish.tcp",
                 "nsq_spark.spool._store", "nsq_spark.spark._fetch_task",
                 "nsq_spark.spark._spool"):
        assert part in module_files() and part not in public
    # Spark's facade names and the modules its docs send users to; its parts are private
    assert sorted(m for m in public if m.startswith("nsq_spark.spark")) == [
        "nsq_spark.spark", "nsq_spark.spark.datasource", "nsq_spark.spark.instrument",
        "nsq_spark.spark.listener", "nsq_spark.spark.options", "nsq_spark.spark.progress",
        "nsq_spark.spark.sink"]


# -- the paths that became private: one table, an import hook ------------------------------------


def test_every_moved_path_is_gone_and_its_new_home_is_private():
    from nsq_spark._moved import MOVED

    files = module_files()
    for old, (new, use) in MOVED.items():
        assert old not in files, f"{old} is still a module: the hook would never see it"
        assert new in files and _is_private(new), (old, new)
        assert use


def test_the_longest_entry_wins_and_a_package_covers_its_submodules():
    from nsq_spark._moved import new_name

    assert new_name("nsq_spark.publish.retry")[0] == "nsq_spark._retry"
    assert new_name("nsq_spark.publish.tcp")[0] == "nsq_spark._publish.tcp"
    assert new_name("nsq_spark.publish")[0] == "nsq_spark._publish"
    assert new_name("nsq_spark.publisher") is None
    assert new_name("nsq_spark._publish.tcp") is None
    assert new_name("nsq_spark.protocol") is None


def _old_paths() -> list[str]:
    from nsq_spark._moved import MOVED

    return sorted([*MOVED, "nsq_spark.consumer.pool", "nsq_spark.publish.tcp"])


@pytest.mark.parametrize("old", _old_paths())
def test_an_old_path_warns_and_gives_the_module_at_its_new_path(old, monkeypatch):
    import sys

    from nsq_spark._moved import new_name

    monkeypatch.delitem(sys.modules, old, raising=False)
    new, use = new_name(old)
    with pytest.warns(DeprecationWarning) as warned:
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__spec__.name == new and module.__name__ == new  # its own, not the alias
    messages = [str(w.message) for w in warned]
    assert f"{old} is private since 0.2.0 (now {new}) and the old path goes in 0.3.0: " \
        f"use {use}" in messages
    # attributed to the importing line, so that the default filters show it in __main__
    assert {w.filename for w in warned} == {__file__}


def test_names_from_an_old_path_are_the_public_objects(monkeypatch):
    import sys

    for old in ("nsq_spark.conn", "nsq_spark.lookupd", "nsq_spark.consumer",
                "nsq_spark.consumer.reader", "nsq_spark.publish", "nsq_spark.publish.producer"):
        monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning):
        from nsq_spark.conn import Connection, SyncConnection
        from nsq_spark.consumer.reader import Reader
        from nsq_spark.lookupd import ProducerInfo
        from nsq_spark.publish.producer import Producer
    assert (Connection, Reader, Producer, ProducerInfo) == (
        nsq_spark.Connection, nsq_spark.Reader, nsq_spark.Producer, nsq_spark.ProducerInfo)
    assert SyncConnection is importlib.import_module("nsq_spark._sync_conn").SyncConnection


def test_the_hook_is_installed_once_and_first():
    import sys

    from nsq_spark._moved import MovedFinder, install

    install()
    finders = [f for f in sys.meta_path if isinstance(f, MovedFinder)]
    assert len(finders) == 1 and isinstance(sys.meta_path[0], MovedFinder)


#: where the project's own code is: none of it imports a path that moved
_PROJECT_PY = ("nsq_spark", "tests", "bench", "docs/hooks", "examples", "integration",
               "scripts")


def _fallbacks(tree: ast.AST) -> set[int]:
    """The nodes inside an ``except ModuleNotFoundError`` handler: a benchmark's import
    of an old path for the older revisions ``bench.ab`` runs it on, after the new path
    was tried first."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and isinstance(node.type, ast.Name) \
                and node.type.id == "ModuleNotFoundError":
            inside |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return inside


def _imports_in(source: str, filename: str) -> list[str]:
    """The absolute module names a Python source imports (statements, and
    ``import_module`` of a string constant); in bench/, not the fallbacks to an old path
    for older revisions (:func:`_fallbacks`)."""
    out = []
    tree = ast.parse(source, filename)
    skip = _fallbacks(tree) if filename.startswith("bench/") else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args \
                and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            out.append(node.args[0].value)
    return out


def test_only_a_benchmark_may_fall_back_to_an_old_path():
    source = ("try:\n    import nsq_spark.spark._backlog\n"
              "except ModuleNotFoundError:\n    import nsq_spark.spark.backlog\n")
    assert _imports_in(source, "bench/b.py") == ["nsq_spark.spark._backlog"]
    assert "nsq_spark.spark.backlog" in _imports_in(source, "tests/t.py")
    assert "nsq_spark.spark.backlog" in _imports_in(
        source.replace("ModuleNotFoundError", "ValueError"), "bench/b.py")


def test_the_project_never_imports_a_path_that_moved():
    from nsq_spark._moved import new_name

    top = ROOT.parent
    found = []
    for folder in _PROJECT_PY:
        for path in sorted((top / folder).rglob("*.py")):
            rel = path.relative_to(top)
            if rel == Path(__file__).relative_to(top):
                continue   # the tests of the hook above import old paths on purpose
            found += [f"{rel}: {name}" for name in _imports_in(path.read_text(), str(rel))
                      if name.startswith("nsq_spark.") and new_name(name)]
    for page in [top / "README.md", *sorted((top / "docs").rglob("*.md"))]:
        if page.name == "changelog.md":
            continue
        for m in re.finditer(r"(?:from|import)\s+(nsq_spark(?:\.\w+)+)"
                             r"|from nsq_spark import \(?([\w, ]+)", page.read_text()):
            names = [m.group(1)] if m.group(1) else [
                f"nsq_spark.{n.strip()}" for n in m.group(2).split(",") if n.strip()]
            found += [f"{page.relative_to(top)}: {n}" for n in names if new_name(n)]
    assert found == []


# -- every public attribute exists whatever __init__ chose -----------------------------------


def one_branch_attributes(cls: ast.ClassDef) -> list[str]:
    """Public ``self.x`` attributes that exist after some ways out of ``cls.__init__`` and
    not after others: set on one branch of an ``if`` only (an early ``return`` makes the
    rest of the block the other branch; a path that raises builds no object and does not
    count), in ``__init__`` or in a method of the class that it calls (``self._setup()``).
    A default in the class body makes the attribute exist on every path."""
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if "__init__" not in methods:
        return []
    defaults = {t.id for n in cls.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                if isinstance(t, ast.Name)
                and (isinstance(n, ast.Assign) or n.value is not None)}
    must, may = _AttributeFlow(methods).function("__init__")
    return sorted(a for a in may - must - defaults if not a.startswith("_"))


State = tuple[frozenset[str], frozenset[str]]  # (set on every path so far, on some path)


def _merge(states: list[State]) -> State | None:
    if not states:
        return None
    return (frozenset.intersection(*(m for m, _ in states)),
            frozenset.union(*(y for _, y in states)))


class _AttributeFlow:
    """Which ``self`` attributes a method sets on every path and on some path."""

    def __init__(self, methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]) -> None:
        self.methods = methods
        self.active: set[str] = set()

    def function(self, name: str) -> State:
        if name in self.active:  # recursion: assume nothing
            return frozenset(), frozenset()
        self.active.add(name)
        try:
            returns: list[State] = []
            end = self.block(self.methods[name].body, (frozenset(), frozenset()), returns)
            merged = _merge(returns + ([end] if end is not None else []))
            return merged or (frozenset(), frozenset())
        finally:
            self.active.discard(name)

    def block(self, stmts: list[ast.stmt], state: State | None,
              returns: list[State]) -> State | None:
        """The state after ``stmts`` (None: no path falls through); ``return`` paths are
        appended to ``returns``, raising paths dropped."""
        for stmt in stmts:
            if state is None:
                return None
            state = self.statement(stmt, state, returns)
        return state

    def statement(self, stmt: ast.stmt, state: State, returns: list[State]) -> State | None:
        if isinstance(stmt, ast.Return):
            returns.append(self.effects(stmt, state))
            return None
        if isinstance(stmt, ast.Raise):
            return None
        if isinstance(stmt, ast.If):
            state = self.effects(stmt.test, state)
            return _merge([s for s in (self.block(stmt.body, state, returns),
                                        self.block(stmt.orelse, state, returns))
                           if s is not None])
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            ran = self.block(stmt.body, state, returns)  # zero or more times
            after = _merge([state] + ([ran] if ran is not None else []))
            return self.block(stmt.orelse, after, returns) if after is not None else None
        if isinstance(stmt, (ast.Try, ast.TryStar)):
            ends = [self.block(stmt.body + stmt.orelse, state, returns)]
            ends += [self.block(h.body, state, returns) for h in stmt.handlers]
            merged = _merge([s for s in ends if s is not None])
            return self.block(stmt.finalbody, merged, returns) if merged is not None else None
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            return self.block(stmt.body, state, returns)
        if isinstance(stmt, ast.Match):
            ends = [self.block(c.body, state, returns) for c in stmt.cases]
            if not any(isinstance(c.pattern, ast.MatchAs) and c.pattern.pattern is None
                       for c in stmt.cases):
                ends.append(state)
            return _merge([s for s in ends if s is not None])
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return state
        return self.effects(stmt, state)

    def effects(self, node: ast.AST, state: State) -> State:
        """``state`` after the assignments to ``self.x`` and the calls of ``self.method()``
        inside one simple statement or expression."""
        must, may = set(state[0]), set(state[1])
        for n in ast.walk(node):
            targets: list[ast.expr] = []
            if isinstance(n, ast.Assign):
                targets = n.targets
            elif isinstance(n, ast.AugAssign) or (isinstance(n, ast.AnnAssign)
                                                  and n.value is not None):
                targets = [n.target]
            for t in targets:
                for e in ast.walk(t):
                    if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) \
                            and e.value.id == "self" and isinstance(e.ctx, ast.Store):
                        must.add(e.attr)
                        may.add(e.attr)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                    and isinstance(n.func.value, ast.Name) and n.func.value.id == "self" \
                    and n.func.attr in self.methods:
                m_must, m_may = self.function(n.func.attr)
                must |= m_must
                may |= m_may
        return frozenset(must), frozenset(may)


def test_the_branch_rule_sees_a_one_branch_attribute_and_accepts_the_fixes():
    def check(src: str) -> list[str]:
        cls = ast.parse(src).body[0]
        assert isinstance(cls, ast.ClassDef)
        return one_branch_attributes(cls)

    assert check("class A:\n def __init__(self, s):\n  if s:\n   self.spool = s\n"
                 "  else:\n   self.config = 1\n") == ["config", "spool"]
    assert check("class A:\n def __init__(self, s):\n  if s:\n   self.spool = s\n") == ["spool"]
    # both branches, a default in the class, an unconditional set, a raising branch,
    # private names: all fine
    assert check("class A:\n def __init__(self, s):\n  if s:\n   self.x = 1\n  else:\n"
                 "   self.x = 2\n") == []
    assert check("class A:\n spool = None\n def __init__(self, s):\n  if s:\n"
                 "   self.spool = s\n") == []
    assert check("class A:\n def __init__(self, s):\n  self.spool = None\n  if s:\n"
                 "   self.spool = s\n") == []
    assert check("class A:\n def __init__(self, s):\n  if not s:\n   raise ValueError\n"
                 "  else:\n   self.spool = s\n") == []
    assert check("class A:\n def __init__(self, s):\n  if s:\n   self._spool = s\n") == []
    # an early return makes the rest the other branch; a helper method counts as __init__
    assert check("class A:\n def __init__(self, s):\n  if s:\n   self._setup(s)\n   return\n"
                 "  self.config = 1\n def _setup(self, s):\n  self.spool = s\n"
                 ) == ["config", "spool"]
    assert check("class A:\n def __init__(self, s):\n  if s:\n   self._setup(s)\n   return\n"
                 "  self.spool = None\n def _setup(self, s):\n  self.spool = s\n") == []


def test_no_public_attribute_is_set_on_one_branch_of_an_init_only():
    found = {f"{module_name(path)}.{node.name}": attrs
             for path in sorted(ROOT.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ClassDef)
             for attrs in [one_branch_attributes(node)] if attrs}
    assert found == {}


# -- errors: every one an NSQError, one class per meaning -------------------------------------


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class nsq_spark defines, by qualified name (every module imported:
    the test venv has every extra)."""
    found: dict[str, type[BaseException]] = {}
    for mod in module_files():
        if mod.endswith("__main__"):
            continue
        module = importlib.import_module(mod)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException) \
                    and value.__module__ == mod:
                found[f"{mod}.{value.__qualname__}"] = value
    return found


def test_every_error_nsq_spark_raises_is_an_nsq_error():
    """A private exception (``_Name``) is control flow its module catches; every other is
    what a user may see, and ``except NSQError`` must catch it."""
    from nsq_spark.errors import NSQError

    classes = _exception_classes()
    assert len(classes) > 30, "the walk found too few exception classes to be right"
    outside = sorted(name for name, cls in classes.items()
                     if not issubclass(cls, NSQError)
                     and not name.rpartition(".")[2].startswith("_"))
    assert outside == []


def test_one_spool_error_per_meaning():
    """The Producer's publish spool and the Spark connector's write-ahead spool fail for
    different reasons and are caught apart: two classes, two names, neither a kind of the
    other. The Spark one's 0.1.0 name is the same class, for a release."""
    from nsq_spark.errors import NSQError, SparkSpoolError
    from nsq_spark.spark import _spool as spark_spool
    from nsq_spark.spool import SpoolError

    assert spark_spool.SpoolError is SparkSpoolError   # the old name, not a second class
    assert not issubclass(SparkSpoolError, SpoolError)
    assert not issubclass(SpoolError, SparkSpoolError)
    assert issubclass(SparkSpoolError, NSQError) and issubclass(SparkSpoolError, RuntimeError)
    spool_errors = sorted(name for name, cls in _exception_classes().items()
                          if name.rpartition(".")[2] == "SpoolError")
    assert spool_errors == ["nsq_spark.spool._format.SpoolError"]


# -- docstrings name methods that exist ---------------------------------------------------------


def _broken_method_references(mod: str, source: str) -> list[str]:
    """The ``:meth:`Class.name``` references in ``source`` (of the module ``mod``) to a
    class of that module or a dotted ``nsq_spark`` path, whose method does not exist."""
    module = importlib.import_module(mod)
    broken = []
    for ref in re.finditer(r":meth:`~?([\w.]+)`", source):
        parts = ref.group(1).split(".")
        if len(parts) < 2:
            continue   # a bare name, relative to the class the docstring is in
        if parts[0] == "nsq_spark":
            found = next(i for i in range(len(parts) - 1, 0, -1)
                         if _is_module(".".join(parts[:i])))
            obj: object = importlib.import_module(".".join(parts[:found]))
            rest = parts[found:]
        elif isinstance(vars(module).get(parts[0]), type):
            obj, rest = module, parts
        else:
            continue
        for name in rest:
            if not hasattr(obj, name):
                broken.append(f"{mod}: {ref.group(1)}")
                break
            obj = getattr(obj, name)
    return broken


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:   # a parent is no package
        return False


def test_the_method_reference_check_sees_a_method_that_does_not_exist():
    src = ":meth:`Answers._finish` and :meth:`Answers._fin_ids`, :meth:`bulk`"
    assert _broken_method_references("nsq_spark._consumer.answers", src) == [
        "nsq_spark._consumer.answers: Answers._fin_ids"]


def test_docstrings_name_methods_that_exist():
    broken = [b for mod, path in module_files().items() if not mod.endswith("__main__")
              for b in _broken_method_references(mod, path.read_text())]
    assert broken == []
