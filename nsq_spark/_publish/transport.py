"""The port between the :class:`~nsq_spark._publish.producer.Producer` facade and the way it
publishes: a ``Transport``, chosen once when the producer is made.

Two implement it: :class:`~.direct.DirectTransport` (nsqd over TCP -- the blocking fast
path and the pipelined loop -- or over HTTP) and :class:`~.spooled.SpooledTransport` (a
durable local spool, drained through a direct transport). The facade validates the
arguments, owns the public attributes (the same in both modes) and hands every call to
its transport; nothing below asks "is there a spool?" again.

Both transports take already-validated ``defer_ms`` and body lists (``nsq_spark._validate``
ran in the facade) and apply the one body and topic rule themselves (the direct one while
encoding, the spooled one before appending), so both accept, and refuse with the same
error, the same calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Awaitable, Callable, Protocol, Sequence

from nsq_spark.errors import NSQTimeoutError

__all__ = ["Transport", "publish_timed_out", "within", "all_of", "done_future"]


class Transport(Protocol):
    """What the Producer facade needs of the way it publishes."""

    def publish(self, topic: str, body: bytes, defer_ms: int | None) -> None: ...

    def mpublish(self, topic: str, bodies: Sequence[bytes]) -> None: ...

    def publish_async(self, topic: str, body: bytes, defer_ms: int | None
                      ) -> concurrent.futures.Future[bytes]: ...

    def mpublish_async(self, topic: str, bodies: Sequence[bytes]
                       ) -> concurrent.futures.Future[Any]: ...

    async def apublish(self, topic: str, body: bytes, defer_ms: int | None) -> None: ...

    async def ampublish(self, topic: str, bodies: Sequence[bytes]) -> None: ...

    def publish_nowait(self, topic: str, body: bytes, defer_ms: int | None
                       ) -> "asyncio.Future[bytes]": ...

    def flush(self, timeout: float | None) -> bool: ...

    def redrive(self) -> int: ...

    @property
    def published(self) -> int: ...

    @property
    def last_error(self) -> BaseException | None: ...

    def pending_bytes(self) -> int: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self, timeout: float | None) -> None: ...

    async def aclose(self) -> None: ...

    async def enter_async(self) -> None:
        """``async with`` begins (the direct transport binds to the running loop)."""

    async def exit_async(self) -> None:
        """``async with`` ends: close, from the loop or through a thread."""


def publish_timed_out(timeout: float | None) -> NSQTimeoutError:
    return NSQTimeoutError(f"publish did not complete within publish_timeout={timeout}s "
                           "(retries included; raise publish_timeout to wait longer)")


async def within(coro: Awaitable[Any], timeout: float | None) -> Any:
    """``coro`` within publish_timeout (the HTTP path; the TCP pools bound themselves)."""
    if timeout is None:
        return await coro
    try:
        return await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        raise publish_timed_out(timeout) from None


def all_of(futs: list[concurrent.futures.Future[Any]]) -> concurrent.futures.Future[Any]:
    """One future for several: the first failure, else the last result."""
    out: concurrent.futures.Future[Any] = concurrent.futures.Future()
    remaining = [len(futs)]
    lock = threading.Lock()

    def done(f: concurrent.futures.Future[Any]) -> None:
        exc = f.exception()
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if exc is not None:
            if not out.done():
                out.set_exception(exc)
        elif last and not out.done():
            out.set_result(f.result())

    for f in futs:
        f.add_done_callback(done)
    return out


def done_future(fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    """A future already settled by ``fn()``: ``b"OK"``, or what it raised."""
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's future
        fut.set_exception(exc)
    else:
        fut.set_result(b"OK")
    return fut
