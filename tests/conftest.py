"""Shared test configuration. The NSQ/redis/memcached fixtures come from the
``nsq_spark.testing`` pytest plugin (registered by the package's entry point)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# No hypothesis deadline: a property holds or not whatever the machine's speed (a loaded
# machine made one example take 252 ms against the default 200 ms deadline: a failure
# that said nothing about the code).
settings.register_profile("nsq-spark", deadline=None)
settings.load_profile("nsq-spark")

# The helper modules beside the tests (conn_helpers, reader_helpers, ...) import by their
# plain names from any directory and in any pytest import mode: from a checkout, from an
# unpacked sdist, from tests/spark/.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

_SERVERS = {"nsqd", "nsqlookupd", "redis-server", "memcached", "nsqadmin",
            "toxiproxy-serve"}  # (comm is cut to 15 characters)


def _child_servers() -> list[str]:
    """Server processes that are still children of this test process."""
    me = os.getpid()
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        if ppid == me and comm in _SERVERS:
            found.append(f"{comm} (pid {stat.parent.name})")
    return found


# make test hands whole files to its xdist workers in the order collected
# (--dist loadfile --no-loadscope-reorder): the files of the tiers that start JVMs and
# venvs go first, so that the end of the run is short files on every worker instead of one
# worker running a minutes-long file alone (measured: the crash test's file started last
# and ran 2 minutes past every other). By marker, not by a table of seconds that goes
# stale: a file goes where its heaviest test's tier puts it; the rest keep their order.
_TIERS_FIRST = ("cluster", "versions", "pythons", "connect", "slow", "spark", "docs")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, tier in enumerate(_TIERS_FIRST) if item.get_closest_marker(tier)),
                    len(_TIERS_FIRST))

    file_rank: dict[str, int] = {}
    for item in items:
        path = str(item.path)
        file_rank[path] = min(file_rank.get(path, len(_TIERS_FIRST)), rank(item))
    items.sort(key=lambda item: file_rank[str(item.path)])  # stable: files stay whole


# servers leaked in xdist workers, reported to the controller (make test runs two workers)
_LEAKED_IN_WORKERS: list[str] = []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any test leaked a server process: the harness must reap them all.
    An xdist worker hands its finding to the controller, which fails the run."""
    leaked = _child_servers()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["leaked_servers"] = leaked
        return
    leaked += _LEAKED_IN_WORKERS
    if leaked:
        print(f"\nLEAKED server processes at the end of the test session: {', '.join(leaked)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist's controller: collect what a finished worker found leaked."""
    output = getattr(node, "workeroutput", None) or {}
    worker = getattr(getattr(node, "gateway", None), "id", "?")
    _LEAKED_IN_WORKERS.extend(f"{name} in worker {worker}"
                              for name in output.get("leaked_servers", []))
