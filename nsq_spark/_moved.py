"""The import paths that became private in 0.2.0, kept for one release: the one table
(:data:`MOVED`) and the import hook that serves it.

``import nsq_spark.conn`` (or ``from nsq_spark.consumer.pool import Pool``) still works:
:class:`MovedFinder`, installed by ``nsq_spark/__init__.py``, answers the old name with the
module at its new path (the same module object, so every class and function is the same
object under both names) and warns ``DeprecationWarning`` once per old path, naming the
new path and the public name to use. A package's entry covers its submodules:
``nsq_spark.publish.tcp`` is ``nsq_spark._publish.tcp``; an entry of its own wins
(``nsq_spark.publish.retry`` is ``nsq_spark._retry``). The old paths go in 0.3.0.

The project itself never imports an old path (``tests/test_structure.py`` checks the
package, the tests, the benchmarks and the docs' code).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Sequence

__all__ = ["MOVED", "REMOVED_IN", "MovedFinder", "install", "new_name"]

#: The release that drops the old paths.
REMOVED_IN = "0.3.0"

#: old dotted path -> (its new path, what to use instead). An entry for a package covers
#: its submodules.
MOVED: dict[str, tuple[str, str]] = {
    "nsq_spark.conn": ("nsq_spark._conn", "nsq_spark.Connection"),
    "nsq_spark.sync_conn": ("nsq_spark._sync_conn", "nsq_spark.SyncConn (pynsq's blocking "
                            "connection)"),
    "nsq_spark.handshake": ("nsq_spark._handshake", "nsq_spark.Connection (the handshake is "
                            "its part)"),
    "nsq_spark.lookupd": ("nsq_spark._lookupd", "nsq_spark.Reader(lookupd_http_addresses=...), "
                          "nsq_spark.ProducerInfo, and nsq_spark.admin.LookupdClient"),
    "nsq_spark.addresses": ("nsq_spark._addresses", "an address string 'host:port' "
                            "(IPv6 in brackets) where an option takes one"),
    "nsq_spark.validate": ("nsq_spark._validate", "the options of each class (every one is "
                           "checked where it is given)"),
    "nsq_spark.consumer": ("nsq_spark._consumer", "nsq_spark.Reader and nsq_spark.run"),
    "nsq_spark.publish": ("nsq_spark._publish", "nsq_spark.Producer"),
    "nsq_spark.publish.retry": ("nsq_spark._retry", "the Producer's retry_* options"),
    "nsq_spark.spool.format": ("nsq_spark.spool._format", "nsq_spark.spool"),
    "nsq_spark.spool.store": ("nsq_spark.spool._store", "nsq_spark.spool"),
    "nsq_spark.spool.drain": ("nsq_spark.spool._drain", "nsq_spark.spool"),
    # the Spark connector's parts: its facade is nsq_spark.spark
    **{f"nsq_spark.spark.{part}": (f"nsq_spark.spark._{part}", "nsq_spark.spark")
       for part in ("admission", "backlog", "chunking", "copies", "fetch", "fetch_task",
                    "filters", "logs", "reader_cache", "schema", "seen")},
    "nsq_spark.spark.spool": ("nsq_spark.spark._spool",
                              "nsq_spark.errors.SparkSpoolError (was SpoolError here)"),
}


def new_name(old: str) -> tuple[str, str] | None:
    """``(new path, what to use)`` for an old dotted path, else None: the longest entry of
    :data:`MOVED` that is ``old`` or a package above it."""
    parts = old.split(".")
    for cut in range(len(parts), 1, -1):
        entry = MOVED.get(".".join(parts[:cut]))
        if entry is not None:
            new, use = entry
            return ".".join([new, *parts[cut:]]), use
    return None


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A meta-path finder (first on ``sys.meta_path``, so that no other finder loads a
    second copy of a module under its old name) and the loader of the old names."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("nsq_spark.") or new_name(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        found = new_name(spec.name)
        assert found is not None  # find_spec checked it
        new, use = found
        warnings.warn(f"{spec.name} is private since 0.2.0 (now {new}) and the old path goes "
                      f"in {REMOVED_IN}: use {use}", DeprecationWarning, stacklevel=_user_frame())
        module = importlib.import_module(new)
        # the import system sets __spec__ of what this returns to the old name's spec; the
        # module keeps its own (pickling, reload and tracebacks read it)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = self._specs.pop(module.__spec__.name if module.__spec__ else "", None)
        if spec is not None:
            module.__spec__ = spec

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}


def _user_frame() -> int:
    """The ``stacklevel`` of the first frame outside the import system and this module (the
    user's ``import`` line), so that the default filters show the warning in ``__main__``.
    ``warnings`` itself does not count the frames of ``importlib._bootstrap``."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and (frame.f_code.co_filename == __file__
                                        or _in_import_system(frame.f_code.co_filename)
                                        or frame.f_globals.get("__name__") == "importlib"):
        if not _in_import_system(frame.f_code.co_filename):
            level += 1
        frame = frame.f_back
    return level


def _in_import_system(filename: str) -> bool:
    return "importlib" in filename and "_bootstrap" in filename


def install() -> None:
    """Put one :class:`MovedFinder` first on ``sys.meta_path`` (again: no second one)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
