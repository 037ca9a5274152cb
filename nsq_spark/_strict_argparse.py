"""The command-line parser of every ``nsq-spark`` command: no abbreviations, no secret echoed.

Standard library only (``install-nsq`` parses its options before the dependencies exist):
:mod:`nsq_spark._validate`, whose secret rule this uses, imports nothing else either.

Two things argparse does that a command taking secrets must not:

* **prefix matching.** ``allow_abbrev=False`` stops it for ``--long`` options only: on
  Python 3.11 a single-dash ``-auth X`` (or ``-auth-secret X``) is still taken for
  ``-auth-secret-file X``, and the file named by the secret is opened and named in the
  error. :class:`StrictParser` matches option names exactly, with either prefix (the Go
  tools' ``-topic`` and ``--topic`` are both registered names); ``-n5`` for ``-n 5`` goes
  with it.
* **echoing values in usage errors**: ``unrecognized arguments: --auth-secret=X``,
  ``invalid choice: 'X'``. :meth:`StrictParser.error` replaces the value of every option
  whose name looks secret (:func:`nsq_spark._validate.is_secret_name`, the project's one
  rule; a ``...-file`` option names a path, not a secret) and of every unknown option by
  ``***``.

Subparsers made with ``add_subparsers().add_parser`` are StrictParsers too (argparse makes
them of the parent's class).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, NoReturn, Sequence

from nsq_spark._validate import is_secret_name

__all__ = ["StrictParser", "redact"]

_HIDDEN = "***"


def _is_secret_option(name: str) -> bool:
    # a --x-file option names the file holding the secret: its path is shown
    return (name.startswith("-") and is_secret_name(name)
            and not re.search(r"[-_]file$", name))


def secret_values(argv: Sequence[str]) -> list[str]:
    """The values given to secret-looking options in ``argv`` (``--x=v`` or ``--x v``)."""
    out = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if not _is_secret_option(name):
            continue
        if eq:
            out.append(value)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            out.append(argv[i + 1])
    return [v for v in out if v]


def redact(message: str, argv: Sequence[str]) -> str:
    """``message`` with every secret value of ``argv`` replaced by ``***``."""
    for value in sorted(set(secret_values(argv)), key=len, reverse=True):
        message = re.sub(r"(?<![\w-])" + re.escape(value) + r"(?![\w-])", _HIDDEN, message)
    return message


def _unknown_shown(extras: Sequence[str]) -> str:
    """Unrecognized arguments as the error shows them: option names, never their values
    (an unknown option's value may be the secret of a misspelled secret option)."""
    shown = []
    hidden = after_option = False
    for arg in extras:
        if arg.startswith("-"):
            name, eq, _ = arg.partition("=")
            shown.append(f"{name}={_HIDDEN}" if eq else name)
            hidden = hidden or bool(eq)
            after_option = not eq
        else:
            shown.append(_HIDDEN if after_option else arg)
            hidden = hidden or after_option
            after_option = False
    return " ".join(shown) + (" (values not shown)" if hidden else "")


class StrictParser(argparse.ArgumentParser):
    """An ArgumentParser that takes no abbreviation and shows no secret (module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self._argv: list[str] = []

    def _get_option_tuples(self, option_string: str) -> list[Any]:
        # argparse's prefix matching (of --long and, whatever allow_abbrev says on 3.11,
        # of -single-dash names): none. Exact names are found before this is asked.
        return []

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self._argv, namespace)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {_unknown_shown(extras)}")
        return parsed

    def error(self, message: str) -> NoReturn:
        super().error(redact(message, self._argv))
