"""The measuring transport and the consumer's handler wrappers without sockets: a fake
transport typed against the Producer's port, hand-made messages, the SDK's in-memory
readers."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nsq_spark._consumer.instrument import ConsumerInstrument
from nsq_spark.errors import NSQServerError
from nsq_spark.message import Message
from nsq_spark._publish.instrument import TracedTransport, drain_sender
from nsq_spark._publish.transport import Transport
from nsq_spark.spool import open_traced_envelope, wrap_envelope
from nsq_spark.telemetry import Telemetry, error_type

pytestmark = pytest.mark.unit


class FakeTransport:
    """Records what it is asked to send; ``fail`` is raised by every call."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail = fail
        self.sent: list[tuple[str, list[bytes]]] = []
        self.futures: list[concurrent.futures.Future[Any]] = []

    def _send(self, topic: str, bodies: Sequence[bytes]) -> None:
        if self.fail is not None:
            raise self.fail
        self.sent.append((topic, list(bodies)))

    def publish(self, topic: str, body: bytes, defer_ms: int | None) -> None:
        self._send(topic, [body])

    def mpublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        self._send(topic, bodies)

    def publish_async(self, topic: str, body: bytes, defer_ms: int | None
                      ) -> concurrent.futures.Future[bytes]:
        self.sent.append((topic, [body]))
        fut: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        self.futures.append(fut)
        return fut

    def mpublish_async(self, topic: str, bodies: Sequence[bytes]
                       ) -> concurrent.futures.Future[Any]:
        return self.publish_async(topic, b"".join(bodies), None)

    async def apublish(self, topic: str, body: bytes, defer_ms: int | None) -> None:
        self._send(topic, [body])

    async def ampublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        self._send(topic, bodies)

    def publish_nowait(self, topic: str, body: bytes, defer_ms: int | None
                       ) -> "asyncio.Future[bytes]":
        raise NotImplementedError

    def flush(self, timeout: float | None) -> bool:
        return True

    def redrive(self) -> int:
        return 0

    @property
    def published(self) -> int:
        return len(self.sent)

    @property
    def last_error(self) -> BaseException | None:
        return None

    def pending_bytes(self) -> int:
        return 0

    def stats(self) -> dict[str, Any]:
        return {}

    def close(self, timeout: float | None) -> None:
        pass

    async def aclose(self) -> None:
        pass

    async def enter_async(self) -> None:
        pass

    async def exit_async(self) -> None:
        pass


def _port(t: FakeTransport) -> Transport:
    return t   # mypy checks the fake against the port here


class Otel:
    def __init__(self, **kwargs: Any) -> None:
        self.metrics = InMemoryMetricReader()
        self.spans = InMemorySpanExporter()
        tracers = TracerProvider()
        tracers.add_span_processor(SimpleSpanProcessor(self.spans))
        self.telemetry = Telemetry(MeterProvider(metric_readers=[self.metrics]), tracers,
                                   **kwargs)

    def points(self, name: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        assert data is not None, "nothing was measured"
        return [p for rm in data.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics if m.name == name for p in m.data.data_points]


def test_bodies_carry_the_send_spans_context_only_when_asked():
    for trace_context in (False, True):
        otel = Otel(trace_context=trace_context)
        fake = FakeTransport()
        traced = TracedTransport(otel.telemetry, _port(fake), ("10.0.0.1", 4150))
        traced.publish("t", b"one", None)
        traced.mpublish("t", [b"a", b"b"])
        bodies = [b for _, bs in fake.sent for b in bs]
        spans = otel.spans.get_finished_spans()
        if not trace_context:
            assert bodies == [b"one", b"a", b"b"]
            continue
        opened = [open_traced_envelope(b) for b in bodies]
        assert [o.body for o in opened] == [b"one", b"a", b"b"]
        span_ids = [f"{s.context.span_id:016x}" for s in spans]
        assert [o.traceparent.split("-")[2] for o in opened] == \
            [span_ids[0], span_ids[1], span_ids[1]]
        (sent,) = otel.points("messaging.client.sent.messages")
        assert sent.value == 3 and sent.attributes["server.address"] == "10.0.0.1"
        assert sent.attributes["server.port"] == 4150


def test_a_failing_call_records_error_type_and_raises_unchanged():
    otel = Otel()
    refusal = NSQServerError("E_BAD_TOPIC", "bad topic")
    traced = TracedTransport(otel.telemetry, _port(FakeTransport(refusal)), None)
    with pytest.raises(NSQServerError) as raised:
        traced.publish("t", b"x", None)
    assert raised.value is refusal
    with pytest.raises(NSQServerError):
        asyncio.run(traced.ampublish("t", [b"x", b"y"]))
    (sent,) = otel.points("messaging.client.sent.messages")
    assert sent.value == 3 and sent.attributes["error.type"] == "E_BAD_TOPIC"
    assert "server.address" not in sent.attributes   # several nsqd: not known
    assert {s.status.status_code for s in otel.spans.get_finished_spans()} == \
        {trace.StatusCode.ERROR}


def test_a_future_is_measured_when_it_settles_not_when_it_is_made():
    otel = Otel()
    fake = FakeTransport()
    traced = TracedTransport(otel.telemetry, _port(fake), None)
    ok = traced.publish_async("t", b"x", None)
    bad = traced.mpublish_async("t", [b"y", b"z"])
    assert otel.spans.get_finished_spans() == ()
    ok.set_result(b"OK")
    bad.set_exception(TimeoutError("no answer"))
    points = otel.points("messaging.client.sent.messages")
    assert sorted((p.value, p.attributes.get("error.type")) for p in points) == \
        [(1, None), (2, "TimeoutError")]
    assert len(otel.spans.get_finished_spans()) == 2


def test_error_type_is_the_code_or_the_qualified_name():
    assert error_type(NSQServerError("E_PUB_FAILED")) == "E_PUB_FAILED"
    assert error_type(KeyError("k")) == "KeyError"
    assert error_type(NSQServerError("")) == "nsq_spark.errors.NSQServerError"


class Responder:
    host, port, address = "127.0.0.1", 4150, "127.0.0.1:4150"


def message(body: bytes, mid: bytes = b"0123456789abcdef") -> Message:
    return Message(mid, body, 0, 1, Responder())  # type: ignore[arg-type]


def test_the_handler_wrapper_opens_the_envelope_links_and_times_the_call():
    otel = Otel()
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    instrument = ConsumerInstrument(otel.telemetry, "orders", "billing")
    seen: list[bytes] = []
    handle = instrument.message_handler(lambda m: seen.append(m.body) or False, False)
    assert handle(message(wrap_envelope(b"inner", parent))) is False
    assert seen == [b"inner"]
    (span,) = otel.spans.get_finished_spans()
    assert span.name == "process orders" and span.kind == trace.SpanKind.CONSUMER
    assert f"{span.links[0].context.span_id:016x}" == parent.split("-")[2]
    assert span.attributes["messaging.message.id"] == "0123456789abcdef"
    (point,) = otel.points("messaging.process.duration")
    assert point.count == 1 and point.attributes["error.type"] == "requeued"
    assert point.attributes["server.address"] == "127.0.0.1"
    assert point.attributes["messaging.consumer.group.name"] == "billing"


def test_a_malformed_traceparent_costs_the_link_not_the_message():
    otel = Otel()
    instrument = ConsumerInstrument(otel.telemetry, "orders", "billing")
    seen: list[bytes] = []
    handle = instrument.message_handler(lambda m: seen.append(m.body), False)
    handle(message(wrap_envelope(b"inner", "not-a-traceparent")))
    assert seen == [b"inner"]
    (span,) = otel.spans.get_finished_spans()
    assert list(span.links) == []


# mypy checks FakeTransport against the port (``_port`` above), with a drifted one that
# must fail: tests/test_typing.py (the suite's one mypy run)


def test_the_drain_sender_calls_the_sender_as_the_drain_does():
    """A producer_factory's sender with a two-argument publish works without telemetry;
    measured, it must too (a TypeError would keep its messages in the spool for ever)."""

    class TwoArguments:
        def __init__(self) -> None:
            self.calls: list[tuple[Any, ...]] = []

        def publish(self, topic: str, body: bytes) -> None:
            self.calls.append((topic, body))

        def close(self) -> None:
            pass

    class Deferring(TwoArguments):
        def publish(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:  # type: ignore[override]
            self.calls.append((topic, body, defer_ms))

    reader = InMemoryMetricReader()
    t = Telemetry(MeterProvider(metric_readers=[reader]))
    plain = TwoArguments()
    drain_sender(t, plain, None).publish("t", b"x")
    assert plain.calls == [("t", b"x")]
    deferring = Deferring()
    drain_sender(t, deferring, None).publish("t", b"y", defer_ms=250)
    assert deferring.calls == [("t", b"y", 250)]
    assert not hasattr(drain_sender(t, plain, None), "mpublish_async")  # the drain's test
    (sent,) = [m for rm in reader.get_metrics_data().resource_metrics
               for sm in rm.scope_metrics for m in sm.metrics
               if m.name == "messaging.client.sent.messages"]
    assert sum(p.value for p in sent.data.data_points) == 2


def test_importing_the_facades_and_their_instruments_loads_no_opentelemetry_module():
    """Off by default: the instruments sit beside the Reader and the Producer, and
    importing them (as the facades do) asks nothing of OpenTelemetry until a
    ``Telemetry`` is made."""
    import subprocess
    import sys

    code = ("import sys, nsq_spark._consumer.reader, nsq_spark._publish.producer, "
            "nsq_spark._consumer.instrument, nsq_spark._publish.instrument, "
            "nsq_spark.spark.instrument, nsq_spark.telemetry\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"
