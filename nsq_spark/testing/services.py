"""The other servers tests need, as throwaway processes on free ports: ``redis-server``
and ``memcached`` (the dedup backends). Toxiproxy, the fault-injecting proxy, is
:mod:`.chaos` (with its client and its fault schedules)."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path
from typing import Callable, Self

from .processes import (DEFAULT_START_TIMEOUT, ServerProcess, find_binary, free_port,
                        start_with_port_retry)

__all__ = ["RedisServer", "MemcachedServer"]


def _tcp_connectable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class _ThrowawayServer(ServerProcess):
    """One server on a free port in a directory of its own (removed with it, unless the
    caller gave one), started by ``with`` and killed at its end."""

    def __init__(self, name: str, workdir: Path | None,
                 argv: Callable[[int, Path], list[str]]) -> None:
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix=f"nsq-spark-{name}-")
        wd = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.port = free_port()
        super().__init__(name, argv(self.port, wd), wd, None,
                         lambda: _tcp_connectable(self.port))

    def __enter__(self) -> Self:
        start_with_port_retry(self, DEFAULT_START_TIMEOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()


class RedisServer(_ThrowawayServer):
    """A throwaway redis-server on a free port, no persistence. ``url`` for clients."""

    def __init__(self, workdir: Path | None = None) -> None:
        super().__init__("redis-server", workdir, lambda port, wd: [
            find_binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", str(wd)])

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


class MemcachedServer(_ThrowawayServer):
    """A throwaway memcached on a free port. ``address`` is ``(host, port)``."""

    def __init__(self, workdir: Path | None = None, memory_mb: int = 64) -> None:
        super().__init__("memcached", workdir, lambda port, wd: [
            find_binary("memcached"), "-l", "127.0.0.1", "-p", str(port), "-U", "0",
            "-m", str(memory_mb), "-u", "root"])

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)
