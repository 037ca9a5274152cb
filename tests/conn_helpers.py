"""Helpers for the protocol/conn/producer tests (no tests here)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")


def run(coro: Awaitable[T], timeout: float = 30.0) -> T:
    """Run a coroutine on a fresh event loop, bounded in time."""
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


def http_pub(http_address: str, topic: str, bodies: list[bytes]) -> None:
    """Publish through nsqd's HTTP /mpub?binary=true (length-prefixed bodies)."""
    payload = len(bodies).to_bytes(4, "big") + b"".join(
        len(b).to_bytes(4, "big") + b for b in bodies)
    req = urllib.request.Request(f"http://{http_address}/mpub?topic={topic}&binary=true",
                                 data=payload)
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.read() == b"OK"


def channel_stats(http_address: str, topic: str, channel: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http_address}/stats?format=json&topic={topic}",
                                timeout=5) as resp:
        stats = json.loads(resp.read())
    for t in stats["topics"] or []:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return c
    return {}


def topic_message_count(http_address: str, topic: str) -> int:
    with urllib.request.urlopen(f"http://{http_address}/stats?format=json&topic={topic}",
                                timeout=5) as resp:
        stats = json.loads(resp.read())
    return sum(t["message_count"] for t in stats["topics"] or [] if t["topic_name"] == topic)


async def wait_for(pred: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class CuttingProxy:
    """A TCP proxy in threads in front of nsqd: once the client has sent ``trigger``, it
    passes on half of nsqd's next chunk and closes both sides (nsqd 'closes mid-frame')."""

    def __init__(self, target: tuple[str, int], trigger: bytes) -> None:
        import socket
        import threading

        self.target = target
        self.trigger = trigger
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.cuts = 0
        self._threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            seen = threading.Event()

            def up(c: socket.socket = client, u: socket.socket = upstream, s: threading.Event = seen) -> None:
                try:
                    while data := c.recv(65536):
                        if self.trigger in data:
                            s.set()
                        u.sendall(data)
                except OSError:
                    pass

            def down(c: socket.socket = client, u: socket.socket = upstream, s: threading.Event = seen) -> None:
                try:
                    while data := u.recv(65536):
                        if s.is_set():
                            c.sendall(data[: max(1, len(data) // 2)])
                            self.cuts += 1
                            break
                        c.sendall(data)
                except OSError:
                    pass
                for x in (c, u):
                    try:
                        x.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    x.close()

            for fn in (up, down):
                th = threading.Thread(target=fn, daemon=True)
                th.start()
                self._threads.append(th)

    def close(self) -> None:
        self.sock.close()
