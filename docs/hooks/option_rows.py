"""A griffe extension (mkdocs.yml, the mkdocstrings handler's ``extensions``, before
``SphinxRoles``): a class decorated with ``@documented(...)`` (``nsq_spark._options``)
gets the ``Args:`` of its options from their rows when it is imported, and its
signature's defaults are its rows' (``max_tries: int = _R.max_tries``), which griffe's
reading of the source cannot see. On the site its docstring and its ``__init__``'s
defaults are the ones it has at run time, so the Reader's and the Producer's reference
pages describe every argument with its default value.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe


class OptionRows(griffe.Extension):
    """Replace the docstring of each ``@documented`` class by its run-time one."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()

        def walk(obj: Any) -> None:
            if obj.is_alias or id(obj) in seen:
                return
            seen.add(id(obj))
            if obj.is_class and obj.docstring is not None and any(
                    str(d.value).startswith("documented(") for d in obj.decorators):
                runtime = getattr(importlib.import_module(obj.module.path), obj.name)
                obj.docstring.value = inspect.cleandoc(runtime.__doc__ or "")
                defaults = inspect.signature(runtime.__init__).parameters
                for param in obj.members["__init__"].parameters:
                    default = defaults[param.name].default
                    if default is not inspect.Parameter.empty:
                        param.default = repr(default)
            for member in list(obj.members.values()):
                walk(member)

        walk(pkg)
