"""Command-line tools: ``nsq-spark publish``, ``nsq-spark tail``, ``nsq-spark stat``,
``nsq-spark topic|channel create|delete|pause|unpause|empty``, ``nsq-spark spool
redrive``, ``nsq-spark install-nsq`` (``python -m nsq_spark ...`` is the same program;
``nsq-spark --version`` prints the version). One module per command, each with its
parser (``add_parser``) and its ``run``:

* :mod:`.publish`: to_nsq with a progress bar and an optional durable spool;
* :mod:`.tail`: nsq_tail;
* :mod:`.stat`: nsq_stat, one view of the channels every ``--interval``;
* :mod:`.admin`: ``topic`` and ``channel``, nsqd's operations on every nsqd given or
  listed by lookupd (``delete`` as nsqadmin does);
* :mod:`.spool`: ``spool redrive``, the messages nsqd refused for good sent again;
* :mod:`.install_nsq`: the nsqd/nsqlookupd binaries.

``publish`` and ``tail`` take TLS (``--tls``, ``--tls-ca-file``, ...) and AUTH options;
the AUTH secret comes from a file or the ``NSQ_AUTH_SECRET`` variable, never from the
command line (``ps`` would show it), and is never printed. A flag that is a library option
(``--batch-size``, ``--max-in-flight``, ...) is read and bounded by that option's row
(:mod:`nsq_spark.config`), the commands' own numbers by rows of their own.

Every command accepts the Go tools' single-dash spellings (``-topic``,
``-nsqd-tcp-address``, ...). Exit status: 0 done, 1 error (the message says what and how
to fix it; an operation that failed on any nsqd, or through lookupd with a lookupd not
answering; also ``tail`` ending without ever having connected to an nsqd, ``stat``
finding no such topic or channel, as nsq_stat, and ``spool redrive`` keeping damaged bytes
back), 2 bad usage, 3 ``publish`` ended with messages still in the spool, 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import IO, Sequence

# standard library and the option rows only below them (the parser works before the
# dependencies exist); each command imports what it needs when it runs
from nsq_spark._strict_argparse import StrictParser

from . import admin, install_nsq, publish, spool, stat, tail
from ._common import (AUTH_SECRET_ENV, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_SPOOLED,
                      EXIT_USAGE)
from .publish import Progress

__all__ = ["main", "build_parser", "Progress", "AUTH_SECRET_ENV", "EXIT_OK", "EXIT_ERROR",
           "EXIT_USAGE", "EXIT_SPOOLED", "EXIT_INTERRUPTED"]


def _version() -> str:
    from nsq_spark._version import __version__
    return f"nsq-spark {__version__}"


def build_parser(prog: str = "nsq-spark") -> argparse.ArgumentParser:
    # every parser and subparser: exact option names only (`-auth X` must not be taken for
    # -auth-secret-file X), no secret echoed by a usage error (see _strict_argparse)
    parser = StrictParser(prog=prog, description="NSQ command-line tools of nsq_spark")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{publish,tail,stat,topic,channel,spool,install-nsq}")
    publish.add_parser(sub)
    tail.add_parser(sub)
    stat.add_parser(sub)
    admin.add_parsers(sub)
    spool.add_parser(sub)
    install_nsq.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None, *, stdin: IO[bytes] | None = None,
         stdout: IO[bytes] | None = None, stderr: IO[str] | None = None,
         prog: str = "nsq-spark") -> int:
    """The ``nsq-spark`` command (console script) and ``python -m nsq_spark``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["install-nsq"]:
        # its own parser: it needs only the standard library (runs before deps exist)
        return install_nsq.run(argv[1:], stderr)
    parser = build_parser(prog)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    stderr = stderr or sys.stderr
    logging.basicConfig(level=args.log_level.upper(), stream=stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "publish":
            return publish.run(args, stdin or sys.stdin.buffer, stderr)
        if args.command == "spool":
            return spool.run(args, stderr)
        if args.command == "stat":
            return stat.run(args, stdout or sys.stdout.buffer, stderr)
        if args.command in ("topic", "channel"):
            return admin.run(args, stdout or sys.stdout.buffer, stderr)
        return tail.run(args, stdout or sys.stdout.buffer, stderr)
    except KeyboardInterrupt:
        stderr.write("\ninterrupted\n")
        return EXIT_INTERRUPTED
    except (ValueError, OSError, RuntimeError) as exc:   # NSQError derives from these
        stderr.write(f"nsq-spark {args.command}: error: {exc}\n")
        return EXIT_ERROR
    except Exception as exc:
        from nsq_spark.errors import NSQError
        if isinstance(exc, NSQError):
            stderr.write(f"nsq-spark {args.command}: error: {exc}\n")
            return EXIT_ERROR
        raise
