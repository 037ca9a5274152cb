"""The other servers tests need, as throwaway processes on free ports: ``redis-server``
and ``memcached`` (the dedup backends). Toxiproxy, the fault-injecting proxy, is
:mod:`.chaos` (with its client and its fault schedules)."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

from .processes import (DEFAULT_START_TIMEOUT, ServerProcess, find_binary, free_port,
                        start_with_port_retry)

__all__ = ["RedisServer", "MemcachedServer"]


def _tcp_connectable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class RedisServer(ServerProcess):
    """A throwaway redis-server on a free port, no persistence. ``url`` for clients."""

    def __init__(self, workdir: Path | None = None) -> None:
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="nsq-spark-redis-")
        wd = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.port = free_port()
        argv = [find_binary("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(wd)]
        super().__init__("redis-server", argv, wd, None, lambda: _tcp_connectable(self.port))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> "RedisServer":
        start_with_port_retry(self, DEFAULT_START_TIMEOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()


class MemcachedServer(ServerProcess):
    """A throwaway memcached on a free port. ``address`` is ``(host, port)``."""

    def __init__(self, workdir: Path | None = None, memory_mb: int = 64) -> None:
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="nsq-spark-memcached-")
        wd = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.port = free_port()
        argv = [find_binary("memcached"), "-l", "127.0.0.1", "-p", str(self.port), "-U", "0",
                "-m", str(memory_mb), "-u", "root"]
        super().__init__("memcached", argv, wd, None, lambda: _tcp_connectable(self.port))

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def __enter__(self) -> "MemcachedServer":
        start_with_port_retry(self, DEFAULT_START_TIMEOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()
