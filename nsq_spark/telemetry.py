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

* metrics: ``messaging.client.sent.messages`` (counter, ``{message}``: per publish call,
  not for one refused before sending, a bad topic name or body; a spooling Producer's
  per send of its drain to nsqd, never for what is only spooled,
  :class:`~nsq_spark._publish.instrument.DrainSender`),
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

Where each part lives: this module holds the providers, the instruments' names and the
helpers every side shares (:class:`Where`, :func:`error_type`, :func:`link_to`,
:func:`traceparent_of`) and imports nothing above it; what measures a side lives beside
that side: :mod:`nsq_spark._consumer.instrument` (a Reader's),
:mod:`nsq_spark._publish.instrument` (a Producer's and its spool drain's),
:mod:`nsq_spark.spark.instrument` (a Spark query's, from its progress).

Chosen here: no settle span or duration (FIN/REQ of a whole chunk leave in one write per
loop turn, so a per-message settle time would measure nothing); the duration of an
awaitable a handler returns is the call's, not the awaitable's.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .errors import ConfigError, NSQServerError

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Link as SpanLink
    from opentelemetry.trace import Span, TracerProvider

__all__ = ["Telemetry", "checked", "SYSTEM", "SENT", "CONSUMED", "OPERATION_DURATION",
           "PROCESS_DURATION", "error_type", "DURATION_BUCKETS", "Where", "link_to",
           "traceparent_of"]

SYSTEM = "nsq"
SENT = "messaging.client.sent.messages"
CONSUMED = "messaging.client.consumed.messages"
OPERATION_DURATION = "messaging.client.operation.duration"
PROCESS_DURATION = "messaging.process.duration"
#: the conventions' advised bucket boundaries for both durations, in seconds
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0)
_SCOPE = "nsq_spark"


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
class Where:
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
        self.span_kind = trace.SpanKind
        self._progress: Any = None   # record_progress's ProgressInstrument (deprecated)
        self.use_span = trace.use_span
        self._status = trace.Status
        self._status_code = trace.StatusCode

    def __repr__(self) -> str:
        return f"<Telemetry trace_context={self.trace_context}>"

    # -- deprecated: the Spark side's instrument lives in nsq_spark.spark ----------------

    def _progress_instrument(self, name: str) -> Any:
        warnings.warn(f"Telemetry.{name}() is deprecated and will be removed: "
                      "count a Spark query's progress with "
                      "nsq_spark.spark.ProgressInstrument(telemetry)", DeprecationWarning,
                      stacklevel=3)
        # a shim for users for one release: the one import of this module above it
        from .spark.instrument import ProgressInstrument

        if self._progress is None:
            self._progress = ProgressInstrument(self)
        return self._progress

    def record_progress(self, progress: Any) -> int:
        """Deprecated: :meth:`nsq_spark.spark.ProgressInstrument.record` (one per
        Telemetry, made on the first call)."""
        counted: int = self._progress_instrument("record_progress").record(progress)
        return counted

    def forget_query(self, query_id: Any) -> None:
        """Deprecated: :meth:`nsq_spark.spark.ProgressInstrument.forget_query`."""
        self._progress_instrument("forget_query").forget_query(query_id)

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
