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


def publish_by(producer: Any, path: str, topic: str, body: bytes,
               timeout: float = 30.0) -> None:
    """One publish through one of the Producer's call styles: ``"blocking"``
    (``publish``), ``"future"`` (``publish_async(...).result``) or ``"asyncio"``
    (``apublish`` on a fresh loop, which then closes the producer: it is bound to that
    loop)."""
    if path == "blocking":
        producer.publish(topic, body)
    elif path == "future":
        producer.publish_async(topic, body).result(timeout)
    else:
        async def main() -> None:
            try:
                await producer.apublish(topic, body)
            finally:
                await producer.aclose()
        run(main(), timeout)


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


class FakePeer:
    """One client connection to :class:`FakeNsqd`, as its script sees it."""

    def __init__(self, sock: Any, closed: Any) -> None:
        self.sock = sock
        self.closed = closed  # threading.Event: the server is shutting down

    def recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("client closed")
            buf += chunk
        return buf

    def read_command(self) -> tuple[bytes, bytes]:
        """The next plain (uncompressed) command line and its body, if it has one."""
        line = b""
        while not line.endswith(b"\n"):
            line += self.recv_exact(1)
        name = line.split(b" ", 1)[0].strip()
        body = b""
        if name in (b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB"):
            body = self.recv_exact(int.from_bytes(self.recv_exact(4), "big"))
        return line, body

    def handshake(self) -> dict[str, Any]:
        """Read the magic and IDENTIFY; returns the client's IDENTIFY JSON."""
        assert self.recv_exact(4) == b"  V2"
        line, body = self.read_command()
        assert line.startswith(b"IDENTIFY"), line
        return dict(json.loads(body))

    def send_frame(self, data: bytes, frame_type: int = 0) -> None:
        self.sock.sendall(frame(data, frame_type))

    def drip(self, data: bytes, interval: float) -> None:
        """Send ``data`` one byte every ``interval`` seconds (until the server closes)."""
        for i in range(len(data)):
            if self.closed.wait(interval):
                return
            self.sock.sendall(data[i:i + 1])


def frame(data: bytes, frame_type: int = 0) -> bytes:
    """An NSQ frame (0 response, 1 error, 2 message)."""
    return (len(data) + 4).to_bytes(4, "big") + frame_type.to_bytes(4, "big") + data


class FakeNsqd:
    """A scripted NSQ server on 127.0.0.1, in threads: ``script(peer)`` runs for every
    accepted connection (``accepted`` counts them); when it returns, the connection is
    closed. For hostile-server tests: wrong IDENTIFY answers, drips, compression bombs."""

    def __init__(self, script: Callable[[FakePeer], None]) -> None:
        import socket
        import threading

        self.script = script
        self.accepted = 0
        self.closed = threading.Event()
        self._socks: list[Any] = []
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        import threading

        while not self.closed.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            self._socks.append(sock)
            t = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, sock: Any) -> None:
        try:
            self.script(FakePeer(sock, self.closed))
        except (OSError, ConnectionError, AssertionError, ValueError):
            pass  # the client went away (or spoke nonsense): end this connection
        finally:
            sock.close()

    def close(self) -> None:
        import socket

        self.closed.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (Linux)
        except OSError:
            pass
        self._listener.close()
        for sock in self._socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> "FakeNsqd":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def peak_rss_mib() -> float:
    """This process's own peak RSS in MiB (``VmHWM``). Not ``ru_maxrss``: Linux carries
    that across ``execve``, so a child forked from a large pytest worker (pyspark and
    pyarrow loaded: ~250 MiB) would report the worker's size, not its own."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


class _Responder:
    address = "127.0.0.1:4150"


def message_blocks(bodies: list[bytes]) -> list[Any]:
    """``bodies`` as nsqd frames (ids ``%016d`` of their index), decoded into the
    MessageBlocks a Reader's block path gives."""
    from nsq_spark.protocol import FrameDecoder, encode_message_frame

    data = b"".join(encode_message_frame(b"%016d" % i, b, 1_700_000_000_000_000_000, 1)
                    for i, b in enumerate(bodies))
    got, _ = FrameDecoder(_Responder()).feed_blocks(data)
    return list(got)
