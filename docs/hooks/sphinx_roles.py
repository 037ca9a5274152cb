"""A griffe extension (mkdocs.yml, the mkdocstrings handler's ``extensions``): the
project's docstrings cross-reference in reST, ``:meth:`Reader.close```, ``:class:`~x.Y```,
``:mod:`.calls```, which mkdocstrings' Markdown would print as literal text. Each role
becomes a cross-reference that mkdocs-autorefs turns into a link when its target is on
the site, and into the plain name when it is not (``optional``: no warning, no role
text either way).

A target is resolved as Sphinx does, from where the docstring is: a dotted path as it
stands (``nsq_spark.admin.calls.Call``), a leading ``.`` relative to the enclosing
module, else the name in scope of the object, its class, its module (their members and
imports). An alias (``nsq_spark.Reader``) is followed to where the object is defined,
which is where mkdocstrings anchors it. ``~`` shows the last part only.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?P<role>meth|func|class|mod|attr|data|exc|obj|const|type):"
                  r"`(?P<target>[^`]+)`")


def _lookup(collection: Any, path: str) -> str | None:
    """The canonical path of ``path`` if the loaded modules have it."""
    try:
        obj = collection[path]
    except (KeyError, ValueError, AttributeError, griffe.AliasResolutionError,
            griffe.CyclicAliasError):
        return None
    try:
        return str(obj.final_target.path) if obj.is_alias else str(obj.path)
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def resolve(obj: Any, target: str, collection: Any) -> str | None:
    """The canonical path ``target`` names in ``obj``'s docstring, or None."""
    name = target.rstrip("()")
    if not name:
        return None
    module = obj if obj.is_module else obj.module
    if name.startswith("."):
        rest = name.lstrip(".")
        scope: Any = module
        while scope is not None:
            found = _lookup(collection, f"{scope.path}.{rest}")
            if found:
                return found
            scope = scope.parent
        return None
    found = _lookup(collection, name)
    if found:
        return found
    first, _, tail = name.partition(".")
    scope = obj
    while scope is not None:
        if first in getattr(scope, "members", {}):
            found = _lookup(collection, f"{scope.path}.{name}")
            if found:
                return found
        imported = getattr(scope, "imports", {}).get(first)
        if imported:
            found = _lookup(collection, imported + (f".{tail}" if tail else ""))
            if found:
                return found
        scope = scope.parent
    return None


def convert(text: str, obj: Any, collection: Any) -> str:
    """``text`` with every reST role replaced by an optional autoref."""

    def one(m: re.Match[str]) -> str:
        target = m.group("target").strip()
        short = target.startswith("~")
        target = target.lstrip("~")
        shown = target.rsplit(".", 1)[-1] if short else target
        if m.group("role") in ("meth", "func") and not shown.endswith(")"):
            shown += "()"
        identifier = resolve(obj, target, collection) or target
        return (f'<autoref optional identifier="{html.escape(identifier)}">'
                f"<code>{html.escape(shown)}</code></autoref>")

    return ROLE.sub(one, text)


class SphinxRoles(griffe.Extension):
    """Rewrite reST roles in every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        seen: set[int] = set()

        def walk(obj: Any) -> None:
            if obj.is_alias or id(obj) in seen:
                return
            seen.add(id(obj))
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = convert(obj.docstring.value, obj,
                                              loader.modules_collection)
            for member in list(obj.members.values()):
                walk(member)

        walk(pkg)
