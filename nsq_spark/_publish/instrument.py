"""OpenTelemetry of publishing, beside what it measures (the providers, the shared
attributes and the span helpers are :mod:`nsq_spark.telemetry`'s; what is recorded, and
under which names, is said there).

* :class:`TracedTransport`: a Producer's transport with each publish call measured (a
  ``send <topic>`` span, and with ``trace_context`` the span's W3C context in the
  envelope of every body);
* :func:`drain_sender`: a spooling Producer's drain sender with each send to nsqd counted
  (:class:`DrainSender`, and the two that keep the sender's optional methods).

The Producer picks them once, in its constructor, and only when it is given a
``Telemetry``: without one none of this is imported or called.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Sequence, TypeVar

from nsq_spark.envelope import with_trace
from nsq_spark.errors import InvalidBodyError, InvalidNameError
from nsq_spark.telemetry import Telemetry, Where, error_type, traceparent_of

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .transport import Transport

__all__ = ["TracedTransport", "DrainSender", "AsyncDrainSender", "ReplicaDrainSender",
           "drain_sender"]

R = TypeVar("R")
#: a send whose span is still open: (span, its metric attributes, start time, messages)
_Open = tuple["Span", dict[str, Any], float, int]


def _refused_before_sending(exc: BaseException | None) -> bool:
    """A publish the client refused before any byte left (a bad topic name, an empty or
    too large body): no send was attempted, so ``sent.messages`` does not count it (the
    span and ``operation.duration`` still say it failed, with ``error.type``)."""
    return isinstance(exc, (InvalidNameError, InvalidBodyError))


class TracedTransport:
    """A Producer's transport with each publish call measured: a ``send <topic>`` span,
    ``messaging.client.operation.duration``, ``messaging.client.sent.messages`` (counted
    whether nsqd took them or not, as the conventions say: attempts, ``error.type`` on a
    failure; a publish refused before anything was sent, a bad name or body, is no
    attempt and is not counted). With a spool (``measure=False``) the span ends once the message is in the
    spool and the two metrics are left to the drain's :class:`DrainSender` (a message
    only spooled is not sent yet). Implements
    :class:`~nsq_spark._publish.transport.Transport`."""

    def __init__(self, telemetry: Telemetry, inner: "Transport",
                 server: tuple[str, int] | None, *, measure: bool = True) -> None:
        self.t = telemetry
        self.inner = inner
        self.server = server
        self.measure = measure
        self._where: dict[str, Where] = {}

    # -- the measuring ---------------------------------------------------------------------

    def _start(self, topic: str, count: int) -> tuple["Span", dict[str, Any], float]:
        where = self._where.get(topic)
        if where is None:
            where = self._where[topic] = Where(topic, server=self.server)
        attrs = where.attributes("send")
        span_attrs = dict(attrs)
        if count != 1:
            span_attrs["messaging.batch.message_count"] = count
        span = self.t.start_span(f"send {topic}", self.t.span_kind.PRODUCER, span_attrs)
        return span, attrs, time.perf_counter()

    def _end(self, span: "Span", attrs: dict[str, Any], start: float, count: int,
             exc: BaseException | None) -> None:
        if exc is not None:
            self.t.fail(span, attrs, exc)
        if self.measure:
            self.t.operation_duration.record(time.perf_counter() - start, attrs)
            if not _refused_before_sending(exc):   # nothing went out: no send attempt
                self.t.sent.add(count, attrs)
        span.end()

    def _bodies(self, span: "Span", bodies: Iterable[bytes]) -> list[bytes]:
        if not self.t.trace_context:
            return list(bodies)
        context = traceparent_of(span)
        if context is None:
            return list(bodies)
        parent, state = context
        return [with_trace(b, parent, state) for b in bodies]

    def _body(self, span: "Span", body: bytes) -> bytes:
        return self._bodies(span, (body,))[0] if self.t.trace_context else body

    def _settle_on(self, fut: Any, span: "Span", attrs: dict[str, Any], start: float,
                   count: int) -> None:
        def done(f: Any) -> None:
            exc = None if f.cancelled() else f.exception()
            if f.cancelled():
                exc = concurrent.futures.CancelledError()
            self._end(span, attrs, start, count, exc)
        fut.add_done_callback(done)

    # -- Transport -------------------------------------------------------------------------

    def _call(self, topic: str, count: int, send: Callable[["Span"], R]
              ) -> tuple[R, "_Open"]:
        """Start the span, run ``send`` with it; a call that raises ends the span with
        the error (and re-raises), one that returns leaves it open for the caller."""
        span, attrs, start = self._start(topic, count)
        try:
            result = send(span)
        except BaseException as exc:
            self._end(span, attrs, start, count, exc)
            raise
        return result, (span, attrs, start, count)

    def publish(self, topic: str, body: bytes, defer_ms: int | None) -> None:
        _, opened = self._call(topic, 1, lambda s: self.inner.publish(
            topic, self._body(s, body), defer_ms))
        self._end(*opened, None)

    def mpublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        _, opened = self._call(topic, len(bodies), lambda s: self.inner.mpublish(
            topic, self._bodies(s, bodies)))
        self._end(*opened, None)

    def publish_async(self, topic: str, body: bytes, defer_ms: int | None
                      ) -> concurrent.futures.Future[bytes]:
        fut, opened = self._call(topic, 1, lambda s: self.inner.publish_async(
            topic, self._body(s, body), defer_ms))
        self._settle_on(fut, *opened)
        return fut

    def mpublish_async(self, topic: str, bodies: Sequence[bytes]
                       ) -> concurrent.futures.Future[Any]:
        fut, opened = self._call(topic, len(bodies), lambda s: self.inner.mpublish_async(
            topic, self._bodies(s, bodies)))
        self._settle_on(fut, *opened)
        return fut

    async def apublish(self, topic: str, body: bytes, defer_ms: int | None) -> None:
        await self._awaited(topic, 1, lambda s: self.inner.apublish(
            topic, self._body(s, body), defer_ms))

    async def ampublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        await self._awaited(topic, len(bodies), lambda s: self.inner.ampublish(
            topic, self._bodies(s, bodies)))

    async def _awaited(self, topic: str, count: int,
                       call: Callable[["Span"], Awaitable[None]]) -> None:
        span, attrs, start = self._start(topic, count)
        try:
            await call(span)
        except BaseException as exc:
            self._end(span, attrs, start, count, exc)
            raise
        self._end(span, attrs, start, count, None)

    def publish_nowait(self, topic: str, body: bytes, defer_ms: int | None
                       ) -> "asyncio.Future[bytes]":
        fut, opened = self._call(topic, 1, lambda s: self.inner.publish_nowait(
            topic, self._body(s, body), defer_ms))
        self._settle_on(fut, *opened)
        return fut

    def flush(self, timeout: float | None) -> bool:
        return self.inner.flush(timeout)

    def redrive(self) -> int:
        return self.inner.redrive()

    @property
    def published(self) -> int:
        return self.inner.published

    @property
    def last_error(self) -> BaseException | None:
        return self.inner.last_error

    def pending_bytes(self) -> int:
        return self.inner.pending_bytes()

    def stats(self) -> dict[str, Any]:
        return self.inner.stats()

    def close(self, timeout: float | None) -> None:
        self.inner.close(timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def enter_async(self) -> None:
        await self.inner.enter_async()

    async def exit_async(self) -> None:
        await self.inner.exit_async()


def drain_sender(telemetry: Telemetry, sender: Any, server: tuple[str, int] | None
                 ) -> "DrainSender":
    """A spool drain's ``sender`` with each send to nsqd counted
    (``messaging.client.sent.messages``, ``operation.duration``, ``error.type``)."""
    # chosen once: the drain sends without waiting only when its sender has
    # mpublish_async, and keeps batches until every replica has them only when it
    # has replicate, so the wrapper has each exactly when the sender does
    if callable(getattr(sender, "replicate", None)):
        return ReplicaDrainSender(telemetry, sender, server)
    if callable(getattr(sender, "mpublish_async", None)):
        return AsyncDrainSender(telemetry, sender, server)
    return DrainSender(telemetry, sender, server)


class DrainSender:
    """The sender a spooled, instrumented Producer's drain sends through: each send to
    nsqd records ``messaging.client.operation.duration`` and
    ``messaging.client.sent.messages`` (operation ``send``; every attempt, retries too,
    ``error.type`` when it fails or nsqd refuses). No span: a message's ``send`` span is
    its publish call's (its traceparent is already in the spooled envelope). Anything
    else (``stats``, ``published``...) is the wrapped sender's."""

    def __init__(self, telemetry: Telemetry, inner: Any, server: tuple[str, int] | None
                 ) -> None:
        self.t = telemetry
        self.inner = inner
        self.server = server
        self._attrs: dict[str, dict[str, Any]] = {}

    def __getattr__(self, name: str) -> Any:
        if name == "inner":   # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _attributes(self, topic: str) -> dict[str, Any]:
        attrs = self._attrs.get(topic)
        if attrs is None:
            attrs = self._attrs[topic] = Where(topic, server=self.server).attributes("send")
        return attrs

    def _record(self, topic: str, count: int, start: float,
                exc: BaseException | None) -> None:
        attrs = self._attributes(topic)
        if exc is not None:
            attrs = {**attrs, "error.type": error_type(exc)}
        self.t.operation_duration.record(time.perf_counter() - start, attrs)
        self.t.sent.add(count, attrs)

    def _measured(self, topic: str, count: int, call: Callable[[], R]) -> R:
        start = time.perf_counter()
        try:
            result = call()
        except BaseException as exc:
            self._record(topic, count, start, exc)
            raise
        self._record(topic, count, start, None)
        return result

    def publish(self, topic: str, body: bytes, defer_ms: int | None = None) -> Any:
        # called as the drain calls a sender: defer_ms only when there is a delay (a
        # producer_factory's sender may take two arguments)
        if defer_ms is None:
            return self._measured(topic, 1, lambda: self.inner.publish(topic, body))
        return self._measured(topic, 1, lambda: self.inner.publish(topic, body,
                                                                   defer_ms=defer_ms))

    def mpublish(self, topic: str, bodies: Sequence[bytes]) -> Any:
        return self._measured(topic, len(bodies), lambda: self.inner.mpublish(topic, bodies))

    def close(self) -> Any:
        return self.inner.close()


class AsyncDrainSender(DrainSender):
    """A :class:`DrainSender` for a sender with ``mpublish_async`` (the drain's pipelined
    send)."""

    def mpublish_async(self, topic: str, bodies: Sequence[bytes]
                       ) -> "concurrent.futures.Future[Any]":
        """Measured until the future settles (the drain reads on meanwhile)."""
        start = time.perf_counter()
        try:
            fut: concurrent.futures.Future[Any] = self.inner.mpublish_async(topic, bodies)
        except BaseException as exc:
            self._record(topic, len(bodies), start, exc)
            raise

        def done(f: "concurrent.futures.Future[Any]") -> None:
            exc = concurrent.futures.CancelledError() if f.cancelled() else f.exception()
            self._record(topic, len(bodies), start, exc)
        fut.add_done_callback(done)
        return fut


class ReplicaDrainSender(AsyncDrainSender):
    """A :class:`DrainSender` for a replicating sender (``Producer(replicas=N,
    spool_dir=...)``): each round of :meth:`replicate` is measured as one send of the
    batch's messages, whatever the number of copies (``error.type`` when the round fell
    short and is retried)."""

    def replicate(self, topic: str, bodies: Sequence[bytes], defer_ms: int | None = None,
                  have: frozenset[str] = frozenset(), need: int | None = None
                  ) -> frozenset[str]:
        result: frozenset[str] = self._measured(
            topic, len(bodies), lambda: self.inner.replicate(topic, bodies, defer_ms, have,
                                                             need))
        return result


if TYPE_CHECKING:
    # mypy checks the traced transport against the port it is handed through: a drift
    # of either side fails `mypy -p nsq_spark`
    def _conforms(t: TracedTransport) -> "Transport":
        return t
