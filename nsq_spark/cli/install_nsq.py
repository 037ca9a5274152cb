"""``nsq-spark install-nsq``: find nsq v1.3.0 on PATH or in the cache, or build it once
with Go, and print the directory (for ``NSQ_BIN_DIR``). Its parser is
:mod:`nsq_spark.testing.install`'s own, standard library only: it runs before the
dependencies exist; the one here only lists the command in ``nsq-spark --help``.
"""

from __future__ import annotations

import argparse
from typing import IO, Any, Sequence


def add_parser(sub: Any) -> argparse.ArgumentParser:
    i: argparse.ArgumentParser = sub.add_parser(
        "install-nsq", help="provide the nsqd/nsqlookupd binaries",
        description="Find nsq v1.3.0 on PATH or in the cache, or build it once with Go, "
        "and print the directory (for NSQ_BIN_DIR).", add_help=False)
    i.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return i


def run(argv: Sequence[str], stderr: IO[str] | None) -> int:
    """``nsq-spark install-nsq ARGS``."""
    from nsq_spark.testing import install
    return install.main(list(argv), stderr=stderr)
