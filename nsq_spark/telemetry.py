"""OpenTelemetry metrics and spans for Readers and Producers, under OpenTelemetry's
messaging semantic conventions (``pip install 'nsq-spark[otel]'``: the API package only;
an SDK and an exporter are the application's choice).

Off by default, chosen once: a Reader or Producer is instrumented only when it is given
``telemetry=Telemetry(...)``. Without it no OpenTelemetry module is imported, no meter or
tracer is asked for, and the delivery and publish paths run exactly the code they run
without this module (the Reader and Producer decide in their constructor, never per
message). With it, the providers are read once, in :class:`Telemetry`'s constructor (the
global ones unless given), and the instruments are made there.

What is recorded (names and attributes exactly as the conventions spell them):

* metrics: ``messaging.client.sent.messages`` (counter, ``{message}``: per publish call;
  a spooling Producer's per send of its drain to nsqd, never for what is only spooled,
  :class:`DrainSender`),
  ``messaging.client.consumed.messages`` (counter, ``{message}``: counted once per
  delivery, when the gate hands it to a handler, or when a pull call hands it to the
  caller: never while it is only prefetched in the pull queue, so messages requeued by
  ``close()`` unseen count not), ``messaging.client.operation.duration`` (histogram,
  ``s``: publish calls, and each pull call that hands something out, its wait
  included), ``messaging.process.duration`` (histogram, ``s``: one handler call, per
  message or per batch);
* attributes: ``messaging.system`` = ``nsq``, ``messaging.operation.name`` and
  ``messaging.operation.type`` (``send``, ``receive``, ``process``),
  ``messaging.destination.name`` (the topic), ``messaging.consumer.group.name`` (the
  channel), ``server.address`` / ``server.port`` (the nsqd; for a Producer only when it
  has one nsqd: with several, which one took a message is the transport's choice), and
  ``error.type`` on failures (the exception's qualified name, nsqd's error code such as
  ``E_BAD_TOPIC``, or ``requeued`` when a handler returned False);
* spans: ``send <topic>`` (kind PRODUCER) per publish call, ``process <topic>`` (kind
  CONSUMER) per handler call, ``receive <topic>`` (kind CONSUMER) per pull call that hands
  messages out (``get_batch``, each batch of ``iter_batches`` and ``batches()``, each
  message of ``async for``; ``get_blocks``: counted and spanned, but no links and the
  blocks' bodies are not opened). A process or receive span is *linked* to the send span of every message that
  carried trace context (the conventions' advice for consumers: the consumer's trace is
  its own, the link leads to the producer's).

Propagation: NSQ messages have no headers, so the trace context travels in the body
(:mod:`nsq_spark.envelope`), and only when the producer asks:
``Telemetry(trace_context=True)``: in version 2 of the message-id envelope, or in the
publish envelope (version 3) when the Producer stamps publish ids. An instrumented Reader
opens version-2 envelopes before the handler or puller sees the message (``message.body``
is the inner body; every Reader opens version 3 and keeps its context in
``message.trace``), not in MessageBlocks (``get_blocks`` hands out the bytes as received:
open them with :func:`nsq_spark.envelope.open_body`); the Spark source returns the inner
body and the ``trace_parent`` column.

Chosen here: no settle span or duration (FIN/REQ of a whole chunk leave in one write per
loop turn, so a per-message settle time would measure nothing); the duration of an
awaitable a handler returns is the call's, not the awaitable's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Sequence, TypeVar

from .errors import ConfigError, NSQServerError
from .envelope import TRACED_ENVELOPE_MAGIC, open_traced_envelope, with_trace

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Link as SpanLink
    from opentelemetry.trace import Span, TracerProvider

    from .consumer.answers import Link
    from .consumer.handlers import HandlerInstrument
    from .message import Message
    from .protocol import MessageBlock
    from .publish.transport import Transport

__all__ = ["Telemetry", "checked", "SYSTEM", "SENT", "CONSUMED", "OPERATION_DURATION",
           "PROCESS_DURATION", "error_type", "DURATION_BUCKETS"]

SYSTEM = "nsq"
SENT = "messaging.client.sent.messages"
CONSUMED = "messaging.client.consumed.messages"
OPERATION_DURATION = "messaging.client.operation.duration"
PROCESS_DURATION = "messaging.process.duration"
#: the conventions' advised bucket boundaries for both durations, in seconds
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0)
_MAGIC_SIZE = len(TRACED_ENVELOPE_MAGIC)
_SCOPE = "nsq_spark"
R = TypeVar("R")
#: a send whose span is still open: (span, its metric attributes, start time, messages)
_Open = tuple["Span", dict[str, Any], float, int]


def error_type(exc: BaseException) -> str:
    """``error.type`` of a failure: nsqd's error code when nsqd refused, else the
    exception's fully qualified type name (the conventions' rule)."""
    if isinstance(exc, NSQServerError) and exc.code:
        return exc.code
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _version() -> str:
    from ._version import __version__
    return __version__


@dataclass(frozen=True)
class _Where:
    """The attributes every measurement of one Reader or Producer shares."""
    topic: str
    channel: str | None = None
    server: tuple[str, int] | None = None

    def attributes(self, operation: str, server: tuple[str, int] | None = None
                   ) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": operation,
            "messaging.operation.type": operation,
            "messaging.destination.name": self.topic,
        }
        if self.channel is not None:
            attrs["messaging.consumer.group.name"] = self.channel
        host_port = server or self.server
        if host_port is not None:
            attrs["server.address"], attrs["server.port"] = host_port
        return attrs


class Telemetry:
    """OpenTelemetry instrumentation for a Reader or a Producer: give it as
    ``Reader(..., telemetry=t)`` / ``Producer(..., telemetry=t)``. One object may serve
    several of them (its instruments are made once, here).

    Args:
        meter_provider: where the metrics go; default: OpenTelemetry's global provider
            (read once, now: set yours before making this object).
        tracer_provider: where the spans go; default: the global one (read now).
        trace_context: Producers only: carry the W3C trace context of each publish in the
            body (message-id envelope version 2, about 80 bytes more per message and one
            BLAKE2b digest of the body) so that consumers link their spans to it. Default
            False: bodies are sent as given. Consumers with an older nsq-spark see the
            envelope in the body: upgrade them first.

    Raises:
        ConfigError: the ``opentelemetry-api`` package is missing (install the extra:
            ``pip install 'nsq-spark[otel]'``), a provider is not one, or
            ``trace_context`` is not a bool.
    """

    def __init__(self, meter_provider: "MeterProvider | None" = None,
                 tracer_provider: "TracerProvider | None" = None, *,
                 trace_context: bool = False) -> None:
        try:
            from opentelemetry import metrics, trace
        except ImportError as exc:   # pragma: no cover - depends on the install
            raise ConfigError("telemetry= needs the OpenTelemetry API: pip install "
                              "'nsq-spark[otel]' (or pass telemetry=None)") from exc
        if not isinstance(trace_context, bool):
            raise ConfigError(f"trace_context must be True or False, not {trace_context!r}")
        for given, name, method in ((meter_provider, "meter_provider", "get_meter"),
                                    (tracer_provider, "tracer_provider", "get_tracer")):
            if given is not None and not callable(getattr(given, method, None)):
                raise ConfigError(f"Telemetry({name}=...) takes an OpenTelemetry "
                                  f"{name.replace('_', ' ')} (with {method}()), not "
                                  f"{given!r}; leave it out for the global one")
        self.trace_context = trace_context
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(
            _SCOPE, _version())
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(
            _SCOPE, _version())
        self.sent = meter.create_counter(
            SENT, "{message}", "Number of messages producer attempted to send to the broker.")
        self.consumed = meter.create_counter(
            CONSUMED, "{message}", "Number of messages that were delivered to the application.")
        self.operation_duration = _histogram(
            meter, OPERATION_DURATION,
            "Duration of messaging operation initiated by a producer or consumer client.")
        self.process_duration = _histogram(meter, PROCESS_DURATION,
                                           "Duration of processing operation.")
        self._span_kind = trace.SpanKind
        # Spark: the last batch counted per (query id, run id, topics, channel), see
        # record_progress
        self._recorded_batches: dict[tuple[str, str, tuple[str, ...], str], int] = {}
        self.use_span = trace.use_span
        self._status = trace.Status
        self._status_code = trace.StatusCode

    def __repr__(self) -> str:
        return f"<Telemetry trace_context={self.trace_context}>"

    # -- the two sides ---------------------------------------------------------------------

    def producer_transport(self, transport: "Transport", server: tuple[str, int] | None,
                           *, measure: bool = True) -> "TracedTransport":
        """``transport`` with a ``send`` span per publish (and, with ``trace_context``, its
        bodies enveloped); ``server``: the Producer's one nsqd, when it has one.
        ``measure``: also record ``sent.messages`` and ``operation.duration`` here (False
        for a spooled transport: :meth:`drain_sender` records them)."""
        return TracedTransport(self, transport, server, measure=measure)

    def drain_sender(self, sender: Any, server: tuple[str, int] | None) -> "DrainSender":
        """A spool drain's ``sender`` with each send to nsqd counted
        (``messaging.client.sent.messages``, ``operation.duration``, ``error.type``)."""
        # chosen once: the drain sends without waiting only when its sender has
        # mpublish_async, and keeps batches until every replica has them only when it
        # has replicate, so the wrapper has each exactly when the sender does
        if callable(getattr(sender, "replicate", None)):
            return ReplicaDrainSender(self, sender, server)
        if callable(getattr(sender, "mpublish_async", None)):
            return AsyncDrainSender(self, sender, server)
        return DrainSender(self, sender, server)

    def consumer(self, topic: str, channel: str) -> "ConsumerInstrument":
        """The instrument of one Reader (its handler wrappers and delivery sinks)."""
        return ConsumerInstrument(self, topic, channel)

    def record_progress(self, progress: Any) -> int:
        """Count the rows of each ``nsq`` source's last batch in ``progress`` (a
        listener's ``event.progress``, ``query.lastProgress`` or its JSON) as
        ``messaging.client.consumed.messages`` (operation ``receive``, the source's topic
        and channel), once per batch however often the same batch is reported. Returns
        the rows counted now. A batch is known by the query's ``id`` and ``runId`` (a
        restart is a new run, a fresh checkpoint starts again at batch 0; two queries on
        one topic and channel are two queries); batch numbers only grow within a run, so
        a report of a batch at or below the last one counted for that run (``recentProgress``
        read again, a listener and ``lastProgress`` both reporting) counts nothing.

        Why here and not in the source: the source's driver side runs in a Python worker
        the JVM starts, and its fetch tasks in executors, not in the process that holds
        your meter provider; the progress is what reaches the application's process
        (pyspark 4.2 and later: on 4.0/4.1 the source reports nothing and this counts 0).
        Call it from a ``StreamingQueryListener.onQueryProgress``, and
        :meth:`forget_query` from its ``onQueryTerminated``."""
        import json

        from .spark.progress import source_lags

        if isinstance(progress, (str, bytes)):
            progress = json.loads(progress)
        query = (str(_field(progress, "id") or ""), str(_field(progress, "runId") or ""))
        counted = 0
        for lag in source_lags(progress):
            if lag.last_batch is None or not lag.last_batch_rows:
                continue
            key = (*query, lag.topics, lag.channel)
            counted_up_to = self._recorded_batches.get(key)
            if counted_up_to is not None and counted_up_to >= lag.last_batch:
                continue   # this batch or a later one of this run was counted already
            self._recorded_batches[key] = lag.last_batch
            attrs: dict[str, Any] = {
                "messaging.system": SYSTEM, "messaging.operation.name": "receive",
                "messaging.operation.type": "receive",
                "messaging.consumer.group.name": lag.channel}
            if len(lag.topics) == 1:   # several topics: no one destination name
                attrs["messaging.destination.name"] = lag.topics[0]
            self.consumed.add(lag.last_batch_rows, attrs)
            counted += lag.last_batch_rows
        return counted

    def forget_query(self, query_id: Any) -> None:
        """Drop what :meth:`record_progress` remembers of the query ``query_id`` (every
        run): call it from a listener's ``onQueryTerminated`` (``event.id``)."""
        qid = str(query_id)
        for key in [k for k in self._recorded_batches if k[0] == qid]:
            del self._recorded_batches[key]

    # -- shared ----------------------------------------------------------------------------

    def start_span(self, name: str, kind: Any, attributes: dict[str, Any],
                   links: "Sequence[SpanLink] | None" = None,
                   start_time: int | None = None) -> "Span":
        return self.tracer.start_span(name, kind=kind, attributes=attributes, links=links,
                                      start_time=start_time)

    def fail(self, span: "Span", attrs: dict[str, Any], exc: BaseException | str) -> str:
        """Mark ``span`` failed; put ``error.type`` into ``attrs`` (a copy's caller's)."""
        kind = exc if isinstance(exc, str) else error_type(exc)
        attrs["error.type"] = kind
        span.set_attribute("error.type", kind)
        if isinstance(exc, BaseException):
            span.record_exception(exc)
        span.set_status(self._status(self._status_code.ERROR, kind))
        return kind


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def checked(telemetry: object, owner: str) -> Telemetry | None:
    """``telemetry`` if it is a :class:`Telemetry` or None; ConfigError naming the fix
    otherwise (``owner``: ``"Reader"`` or ``"Producer"``)."""
    if telemetry is None or isinstance(telemetry, Telemetry):
        return telemetry
    raise ConfigError(f"{owner}(telemetry=...) takes a nsq_spark.telemetry.Telemetry or "
                      f"None, not {telemetry!r}: e.g. telemetry=Telemetry() for "
                      "OpenTelemetry's global providers")


def _histogram(meter: Any, name: str, description: str) -> Any:
    try:
        return meter.create_histogram(name, "s", description,
                                      explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
    except TypeError:   # opentelemetry-api before 1.23 has no advisory
        return meter.create_histogram(name, "s", description)


def traceparent_of(span: "Span") -> tuple[str, str | None] | None:
    """The W3C ``traceparent`` (and ``tracestate``) of ``span``; None when it is not a
    valid (recording or sampled-out but real) span context."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    state = ctx.trace_state.to_header() if ctx.trace_state else None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}", state or None


def link_to(traceparent: str | None, tracestate: str | None = None) -> "SpanLink | None":
    """A span link to the producer's span a message's envelope names (None for no or a
    malformed traceparent: a bad header costs the link, never the message)."""
    if not traceparent:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    ctx = trace.get_current_span(TraceContextTextMapPropagator().extract(carrier)
                                 ).get_span_context()
    return trace.Link(ctx) if ctx.is_valid else None


# ---------------------------------------------------------------------------------------
# producer side


class TracedTransport:
    """A Producer's transport with each publish call measured: a ``send <topic>`` span,
    ``messaging.client.operation.duration``, ``messaging.client.sent.messages`` (counted
    whether nsqd took them or not, as the conventions say: attempts, ``error.type`` on a
    failure). With a spool (``measure=False``) the span ends once the message is in the
    spool and the two metrics are left to the drain's :class:`DrainSender` (a message
    only spooled is not sent yet). Implements
    :class:`~nsq_spark.publish.transport.Transport`."""

    def __init__(self, telemetry: Telemetry, inner: "Transport",
                 server: tuple[str, int] | None, *, measure: bool = True) -> None:
        self.t = telemetry
        self.inner = inner
        self.server = server
        self.measure = measure
        self._where: dict[str, _Where] = {}

    # -- the measuring ---------------------------------------------------------------------

    def _start(self, topic: str, count: int) -> tuple["Span", dict[str, Any], float]:
        where = self._where.get(topic)
        if where is None:
            where = self._where[topic] = _Where(topic, server=self.server)
        attrs = where.attributes("send")
        span_attrs = dict(attrs)
        if count != 1:
            span_attrs["messaging.batch.message_count"] = count
        span = self.t.start_span(f"send {topic}", self.t._span_kind.PRODUCER, span_attrs)
        return span, attrs, time.perf_counter()

    def _end(self, span: "Span", attrs: dict[str, Any], start: float, count: int,
             exc: BaseException | None) -> None:
        if exc is not None:
            self.t.fail(span, attrs, exc)
        if self.measure:
            self.t.operation_duration.record(time.perf_counter() - start, attrs)
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
            attrs = self._attrs[topic] = _Where(topic, server=self.server).attributes("send")
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


# ---------------------------------------------------------------------------------------
# consumer side


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
    a :class:`~nsq_spark.consumer.handlers.HandlerInstrument`) and its delivery sink
    (``messaging.client.consumed.messages``); for pullers, what the pull queue hands out
    (:meth:`received`: envelopes opened, a ``receive`` span linking the producers;
    :meth:`received_blocks`: counted, bodies not opened)."""

    def __init__(self, telemetry: Telemetry, topic: str, channel: str) -> None:
        self.t = telemetry
        self.where = _Where(topic, channel)
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
        span = self.t.start_span(f"receive {self.where.topic}", self.t._span_kind.CONSUMER,
                                 span_attrs, links,
                                 start_time=time.time_ns() - int(elapsed * 1e9))
        self.t.operation_duration.record(elapsed, attrs)
        self.t.consumed.add(count, attrs)
        span.end()

    # -- handler wrappers (HandlerInstrument) ---------------------------------------------

    def message_handler(self, f: Callable[..., Any], coroutine: bool) -> Callable[..., Any]:
        """``f(message)`` inside a ``process <topic>`` span, its duration recorded."""
        name = f"process {self.where.topic}"
        if coroutine:
            async def traced_coroutine(m: "Message") -> Any:
                span, attrs, start = self._begin(name, [m])
                try:
                    r = await self._within(span, f, m)
                except BaseException as exc:
                    self._finish(span, attrs, start, exc)
                    raise
                self._finish(span, attrs, start, "requeued" if r is False else None)
                return r
            return traced_coroutine

        def traced(m: "Message") -> Any:
            span, attrs, start = self._begin(name, [m])
            try:
                r = self._within_sync(span, f, m)
            except BaseException as exc:
                self._finish(span, attrs, start, exc)
                raise
            self._finish(span, attrs, start, "requeued" if r is False else None)
            return r
        return traced

    def batch_handler(self, g: Callable[..., Any], coroutine: bool) -> Callable[..., Any]:
        """``g(messages)`` inside one ``process <topic>`` span linked to every producer."""
        name = f"process {self.where.topic}"
        if coroutine:
            async def traced_batch_coroutine(msgs: list["Message"]) -> Any:
                span, attrs, start = self._begin(name, msgs)
                try:
                    r = await self._within(span, g, msgs)
                except BaseException as exc:
                    self._finish(span, attrs, start, exc)
                    raise
                self._finish(span, attrs, start, "requeued" if r is False else None)
                return r
            return traced_batch_coroutine

        def traced_batch(msgs: list["Message"]) -> Any:
            span, attrs, start = self._begin(name, msgs)
            try:
                r = self._within_sync(span, g, msgs)
            except BaseException as exc:
                self._finish(span, attrs, start, exc)
                raise
            self._finish(span, attrs, start, "requeued" if r is False else None)
            return r
        return traced_batch

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
        span = self.t.start_span(name, self.t._span_kind.CONSUMER, span_attrs, links)
        return span, attrs, time.perf_counter()

    def _finish(self, span: "Span", attrs: dict[str, Any], start: float,
                failure: BaseException | str | None) -> None:
        if failure is not None:
            attrs = dict(attrs)
            self.t.fail(span, attrs, failure)
        self.t.process_duration.record(time.perf_counter() - start, attrs)
        span.end()


if TYPE_CHECKING:
    # mypy checks the two classes against the ports they are handed through: a drift of
    # either side fails `mypy -p nsq_spark`
    def _conforms(t: TracedTransport, c: ConsumerInstrument
                  ) -> tuple["Transport", "HandlerInstrument"]:
        return t, c
