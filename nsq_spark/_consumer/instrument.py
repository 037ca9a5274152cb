"""OpenTelemetry of consuming, beside what it measures (the providers, the shared
attributes and the span helpers are :mod:`nsq_spark.telemetry`'s; what is recorded, and
under which names, is said there).

:class:`ConsumerInstrument` is one Reader's: it wraps the handler (a ``process <topic>``
span per call, linked to the producers' spans) and the delivery sink (consumed
messages counted), and measures what the pull queue hands out (``receive``). The Reader
makes it once, in its constructor, and only when it is given a ``Telemetry``: without one
none of this is imported or called.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence

from ..envelope import TRACED_ENVELOPE_MAGIC, open_traced_envelope
from ..telemetry import Telemetry, Where, link_to

if TYPE_CHECKING:
    from opentelemetry.trace import Link as SpanLink
    from opentelemetry.trace import Span

    from ..message import Message
    from ..protocol import MessageBlock
    from .answers import Link
    from .handlers import HandlerInstrument

__all__ = ["ConsumerInstrument"]

_MAGIC_SIZE = len(TRACED_ENVELOPE_MAGIC)


def _server_of(m: "Message | MessageBlock") -> tuple[str, int] | None:
    responder = m.responder
    host, port = getattr(responder, "host", None), getattr(responder, "port", None)
    return (host, port) if isinstance(host, str) and isinstance(port, int) else None


def _common_server(items: "Sequence[Message | MessageBlock]") -> tuple[str, int] | None:
    """The nsqd all of a hand-out's messages or blocks came from; None when several."""
    servers = {_server_of(x) for x in items}
    return servers.pop() if len(servers) == 1 else None


def _open(m: "Message") -> "SpanLink | None":
    """The link to the producer's span: the trace context of the publish envelope the
    Reader opened, or of a version-2 envelope, replaced here by its inner body."""
    if m.trace is not None:
        return link_to(*m.trace)
    body = m.body
    if body[:_MAGIC_SIZE] != TRACED_ENVELOPE_MAGIC:
        return None
    opened = open_traced_envelope(body)
    m.body = opened.body
    return link_to(opened.traceparent, opened.tracestate)


class ConsumerInstrument:
    """One Reader's instrumentation: wraps its handler (``process`` spans and durations,
    a :class:`~nsq_spark._consumer.handlers.HandlerInstrument`) and its delivery sink
    (``messaging.client.consumed.messages``); for pullers, what the pull queue hands out
    (:meth:`received`: envelopes opened, a ``receive`` span linking the producers;
    :meth:`received_blocks`: counted, bodies not opened)."""

    def __init__(self, telemetry: Telemetry, topic: str, channel: str) -> None:
        self.t = telemetry
        self.where = Where(topic, channel)
        self._attrs: dict[tuple[str, tuple[str, int] | None], dict[str, Any]] = {}

    def attributes(self, operation: str, server: tuple[str, int] | None) -> dict[str, Any]:
        """Shared per (operation, nsqd): built once, never mutated (copy to add to it)."""
        key = (operation, server)
        attrs = self._attrs.get(key)
        if attrs is None:
            attrs = self._attrs[key] = self.where.attributes(operation, server)
        return attrs

    # -- delivery sink (handlers: loop thread, once per chunk) ----------------------------

    def deliveries(self, sink: Callable[["Link", list["Message"]], None]
                   ) -> Callable[["Link", list["Message"]], None]:
        """``sink`` (a handler Reader's) with consumed messages counted as they go to the
        handler (operation ``process``)."""
        consumed = self.t.consumed

        def counted(link: "Link", msgs: list["Message"]) -> None:
            consumed.add(len(msgs), self.attributes("process", (link.host, link.port)))
            sink(link, msgs)
        return counted

    # -- pull hand-outs (the getter's thread: ReceivedPullQueue) ---------------------------

    def received(self, msgs: list["Message"], start: float) -> None:
        """A pull call handed ``msgs`` to the caller (``start``: its ``perf_counter()``
        when called): envelopes opened, a ``receive`` span linked to their producers,
        ``messaging.client.operation.duration`` and ``consumed.messages``. Only what is
        handed out: messages queued and requeued unseen (close, disconnect) count not."""
        links = [x for x in map(_open, msgs) if x is not None]
        self._receive(len(msgs), _common_server(msgs), start, links,
                      msgs[0].id.decode("ascii", "replace") if len(msgs) == 1 else None)

    def received_blocks(self, blocks: Sequence[Any], start: float) -> None:
        """A ``get_blocks`` call handed out ``blocks``: counted with a ``receive`` span and
        duration; no links and no envelope opened (the bytes are handed out as received)."""
        self._receive(sum(map(len, blocks)), _common_server(blocks), start, None, None)

    def _receive(self, count: int, server: tuple[str, int] | None, start: float,
                 links: "list[SpanLink] | None", message_id: str | None) -> None:
        attrs = self.attributes("receive", server)
        span_attrs = dict(attrs)
        if message_id is not None:
            span_attrs["messaging.message.id"] = message_id
        else:
            span_attrs["messaging.batch.message_count"] = count
        elapsed = time.perf_counter() - start
        span = self.t.start_span(f"receive {self.where.topic}", self.t.span_kind.CONSUMER,
                                 span_attrs, links,
                                 start_time=time.time_ns() - int(elapsed * 1e9))
        self.t.operation_duration.record(elapsed, attrs)
        self.t.consumed.add(count, attrs)
        span.end()

    # -- handler wrappers (HandlerInstrument) ---------------------------------------------

    def message_handler(self, f: Callable[..., Any], coroutine: bool) -> Callable[..., Any]:
        """``f(message)`` inside a ``process <topic>`` span, its duration recorded."""
        return self._traced(f, coroutine, lambda m: [m])

    def batch_handler(self, g: Callable[..., Any], coroutine: bool) -> Callable[..., Any]:
        """``g(messages)`` inside one ``process <topic>`` span linked to every producer."""
        return self._traced(g, coroutine, list)

    def _traced(self, f: Callable[..., Any], coroutine: bool,
                messages: Callable[[Any], list["Message"]]) -> Callable[..., Any]:
        """``f(arg)`` inside a ``process <topic>`` span linked to ``messages(arg)``'s
        producers; a handler's False (requeue) is the span's outcome."""
        name = f"process {self.where.topic}"
        if coroutine:
            async def traced_coroutine(arg: Any) -> Any:
                span, attrs, start = self._begin(name, messages(arg))
                try:
                    r = await self._within(span, f, arg)
                except BaseException as exc:
                    self._finish(span, attrs, start, exc)
                    raise
                self._finish(span, attrs, start, "requeued" if r is False else None)
                return r
            return traced_coroutine

        def traced(arg: Any) -> Any:
            span, attrs, start = self._begin(name, messages(arg))
            try:
                r = self._within_sync(span, f, arg)
            except BaseException as exc:
                self._finish(span, attrs, start, exc)
                raise
            self._finish(span, attrs, start, "requeued" if r is False else None)
            return r
        return traced

    def _within_sync(self, span: "Span", call: Callable[[Any], Any], arg: Any) -> Any:
        # the span is the current one while the handler runs: its own spans nest under it
        with self.t.use_span(span, end_on_exit=False, record_exception=False,
                             set_status_on_exception=False):
            return call(arg)

    async def _within(self, span: "Span", call: Callable[[Any], Awaitable[Any]],
                      arg: Any) -> Any:
        with self.t.use_span(span, end_on_exit=False, record_exception=False,
                             set_status_on_exception=False):
            return await call(arg)

    def _begin(self, name: str, msgs: list["Message"]
               ) -> tuple["Span", dict[str, Any], float]:
        links = [x for x in map(_open, msgs) if x is not None]
        attrs = self.attributes("process", _server_of(msgs[0]) if msgs else None)
        span_attrs = dict(attrs)
        if len(msgs) == 1:
            span_attrs["messaging.message.id"] = msgs[0].id.decode("ascii", "replace")
        else:
            span_attrs["messaging.batch.message_count"] = len(msgs)
        span = self.t.start_span(name, self.t.span_kind.CONSUMER, span_attrs, links)
        return span, attrs, time.perf_counter()

    def _finish(self, span: "Span", attrs: dict[str, Any], start: float,
                failure: BaseException | str | None) -> None:
        if failure is not None:
            attrs = dict(attrs)
            self.t.fail(span, attrs, failure)
        self.t.process_duration.record(time.perf_counter() - start, attrs)
        span.end()


if TYPE_CHECKING:
    # mypy checks the instrument against the port the handlers are handed: a drift of
    # either side fails `mypy -p nsq_spark`
    def _conforms(c: ConsumerInstrument) -> "HandlerInstrument":
        return c
