"""OpenTelemetry for the Reader and the Producer against a real nsqd, read through the
SDK's in-memory metric reader and span exporter: the messaging conventions' metric
names and attributes, the send span as the link of the process span through the traced
envelope, ``error.type`` on failures, and nothing at all when telemetry is off."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nsq_spark import Producer, Reader, errors
from nsq_spark.spool import TRACED_ENVELOPE_MAGIC, open_traced_envelope
from nsq_spark.telemetry import Telemetry
from nsq_spark.testing import NSQCluster, wait_until

pytestmark = pytest.mark.nsqd

CONSUMED = "messaging.client.consumed.messages"
SENT = "messaging.client.sent.messages"
OPERATION = "messaging.client.operation.duration"
PROCESS = "messaging.process.duration"


@pytest.fixture(scope="module")
def nsqd() -> Iterator[NSQCluster]:
    with NSQCluster(nsqd=1, lookupd=0, max_msg_size=4096) as cluster:
        yield cluster


class Otel:
    """An SDK meter and tracer provider with in-memory readers, and what they saw."""

    def __init__(self) -> None:
        self.metric_reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.metric_reader])
        self.exporter = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.exporter))

    def telemetry(self, **kwargs: Any) -> Telemetry:
        return Telemetry(self.meters, self.tracers, **kwargs)

    def points(self) -> dict[str, list[Any]]:
        """metric name -> its data points (counters: sums; histograms: counts/sums)."""
        data = self.metric_reader.get_metrics_data()
        out: dict[str, list[Any]] = {}
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out.setdefault(m.name, []).extend(m.data.data_points)
        return out

    def spans(self, name: str) -> list[Any]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]


@pytest.fixture
def otel() -> Otel:
    return Otel()


def topic() -> str:
    return "t" + uuid.uuid4().hex[:12]


def host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def only(points: list[Any], **attrs: Any) -> Any:
    match = [p for p in points if all(p.attributes.get(k) == v for k, v in attrs.items())]
    assert len(match) == 1, (attrs, [dict(p.attributes) for p in points])
    return match[0]


def test_a_producer_records_sent_messages_duration_and_send_spans(nsqd, otel):
    t = topic()
    address = nsqd.nsqd_tcp_addresses[0]
    host, port = host_port(address)
    with Producer(address, telemetry=otel.telemetry()) as p:
        p.publish(t, b"one")
        p.mpublish(t, [b"two", b"three"])
        p.publish_async(t, b"four").result(10)
    points = otel.points()
    common = {"messaging.system": "nsq", "messaging.operation.name": "send",
              "messaging.operation.type": "send", "messaging.destination.name": t,
              "server.address": host, "server.port": port}
    assert only(points[SENT], **common).value == 4
    assert only(points[OPERATION], **common).count == 3
    assert "error.type" not in only(points[SENT], **common).attributes
    spans = otel.spans(f"send {t}")
    assert len(spans) == 3 and {s.kind for s in spans} == {trace.SpanKind.PRODUCER}
    assert sorted(s.attributes.get("messaging.batch.message_count", 1) for s in spans) == [1, 1, 2]
    assert all(s.attributes["messaging.destination.name"] == t for s in spans)


def test_a_refused_publish_records_nsqds_error_code(nsqd, otel):
    t = topic()
    with Producer(nsqd.nsqd_tcp_addresses[0], telemetry=otel.telemetry(), max_tries=1) as p:
        with pytest.raises(errors.NSQServerError):
            p.publish(t, b"x" * 5000)   # over nsqd's --max-msg-size 4096
    failed = only(otel.points()[SENT], **{"error.type": "E_BAD_MESSAGE"})
    assert failed.value == 1 and failed.attributes["messaging.destination.name"] == t
    assert only(otel.points()[OPERATION], **{"error.type": "E_BAD_MESSAGE"}).count == 1
    (span,) = otel.spans(f"send {t}")
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.attributes["error.type"] == "E_BAD_MESSAGE"


def test_the_send_span_is_the_link_of_the_process_span_through_the_envelope(
        nsqd, otel, running_reader):
    t, c = topic(), "audit"
    address = nsqd.nsqd_tcp_addresses[0]
    host, port = host_port(address)
    got: list[bytes] = []
    r = running_reader.start(t, c, lambda m: got.append(m.body), nsqd_tcp_addresses=address,
                             max_in_flight=10, telemetry=otel.telemetry())
    with Producer(address, telemetry=otel.telemetry(trace_context=True)) as p:
        p.publish(t, b"hello")
        p.mpublish(t, [b"a", b"b"])
    wait_until(lambda: len(got) == 3, 15, "3 messages")
    running_reader.stop(r)
    assert sorted(got) == [b"a", b"b", b"hello"]   # the handler sees the inner bodies
    sends = {s.context.span_id: s for s in otel.spans(f"send {t}")}
    processes = otel.spans(f"process {t}")
    assert len(sends) == 2 and len(processes) == 3
    for span in processes:
        assert span.kind == trace.SpanKind.CONSUMER
        (link,) = span.links
        send = sends[link.context.span_id]
        assert link.context.trace_id == send.context.trace_id
        assert span.attributes["messaging.consumer.group.name"] == c
        assert len(span.attributes["messaging.message.id"]) == 16
    common = {"messaging.system": "nsq", "messaging.operation.name": "process",
              "messaging.operation.type": "process", "messaging.destination.name": t,
              "messaging.consumer.group.name": c, "server.address": host,
              "server.port": port}
    points = otel.points()
    assert only(points[CONSUMED], **common).value == 3
    assert only(points[PROCESS], **common).count == 3


def test_a_failed_handler_records_error_type_and_a_requeue(nsqd, otel, running_reader):
    t, c = topic(), "ch"
    calls: list[bytes] = []

    def handler(m):
        calls.append(m.body)
        if m.attempts > 1:
            return True
        if m.body == b"raise":
            raise ValueError("boom")
        return False

    from nsq_spark.testing import publish
    publish(nsqd.nsqd_http_addresses[0], t, [b"raise", b"false"])
    r = running_reader.start(t, c, handler, nsqd_tcp_addresses=nsqd.nsqd_tcp_addresses,
                             max_in_flight=5, requeue_delay=0, max_backoff_duration=0,
                             telemetry=otel.telemetry())
    wait_until(lambda: len(calls) >= 4, 15, "2 messages, each twice")
    running_reader.stop(r)
    process = otel.points()[PROCESS]
    assert only(process, **{"error.type": "ValueError"}).count == 1
    assert only(process, **{"error.type": "requeued"}).count == 1
    ok = [p for p in process if "error.type" not in p.attributes]
    assert sum(p.count for p in ok) == 2
    failed = [s for s in otel.spans(f"process {t}") if s.status.status_code == trace.StatusCode.ERROR]
    assert sorted(s.attributes["error.type"] for s in failed) == ["ValueError", "requeued"]
    assert any(e.name == "exception" for s in failed for e in s.events)


def test_pulled_messages_are_opened_counted_and_linked_by_a_receive_span(nsqd, otel):
    t, c = topic(), "pull"
    address = nsqd.nsqd_tcp_addresses[0]
    with Producer(address, telemetry=otel.telemetry(trace_context=True)) as p:
        p.mpublish(t, [b"x", b"y"])
    reader = Reader(t, c, nsqd_tcp_addresses=address, max_in_flight=10,
                    telemetry=otel.telemetry())
    try:
        got: list[Any] = []
        wait_until(lambda: got.extend(reader.get_batch(10, 0.2)) or len(got) >= 2, 15,
                   "2 pulled messages")
        reader.finish(got)
    finally:
        reader.close()
    assert sorted(m.body for m in got) == [b"x", b"y"]
    (send,) = otel.spans(f"send {t}")
    receives = otel.spans(f"receive {t}")
    assert receives and all(s.kind == trace.SpanKind.CONSUMER for s in receives)
    assert {link.context.span_id for s in receives for link in s.links} == {send.context.span_id}
    consumed = only(otel.points()[CONSUMED], **{"messaging.operation.name": "receive"})
    assert consumed.value == 2 and consumed.attributes["messaging.consumer.group.name"] == c


def test_prefetched_messages_count_when_handed_out_not_when_queued(nsqd, otel):
    """The conventions: no receive span for a prefetched message until it is forwarded to
    the caller. Messages queued in the Reader and requeued by close() unseen count not."""
    t, c = topic(), "prefetch"
    address = nsqd.nsqd_tcp_addresses[0]
    with Producer(address, telemetry=otel.telemetry(trace_context=True)) as p:
        p.mpublish(t, [b"a", b"b", b"c"])
    reader = Reader(t, c, nsqd_tcp_addresses=address, max_in_flight=10,
                    telemetry=otel.telemetry())
    try:
        reader.start()
        wait_until(lambda: reader.stats()["pull_queued"] == 3, 15, "3 prefetched messages")
        assert otel.spans(f"receive {t}") == [] and CONSUMED not in otel.points()
        got = reader.get_batch(2, 1.0)
        reader.finish(got)
    finally:
        reader.close()   # the third, never handed out, is requeued
    assert sorted(m.body for m in got) in ([b"a", b"b"], [b"a", b"c"], [b"b", b"c"])
    (receive,) = otel.spans(f"receive {t}")
    assert receive.attributes["messaging.batch.message_count"] == 2
    (send,) = otel.spans(f"send {t}")   # a link per message, to the mpublish's span
    assert [link.context.span_id for link in receive.links] == [send.context.span_id] * 2
    consumed = only(otel.points()[CONSUMED], **{"messaging.operation.name": "receive"})
    assert consumed.value == 2
    duration = only(otel.points()[OPERATION], **{"messaging.operation.name": "receive"})
    assert duration.count == 1


def test_async_iteration_and_blocks_are_recorded_per_hand_out(nsqd, otel):
    import asyncio

    t, tb = topic(), topic()   # a topic each: the first channel takes a topic's backlog
    address = nsqd.nsqd_tcp_addresses[0]
    with Producer(address, telemetry=otel.telemetry(trace_context=True)) as p:
        p.publish(t, b"one")
        p.mpublish(t, [b"x", b"y"])
        p.mpublish(tb, [b"x", b"y", b"z"])

    async def first() -> Any:
        reader = Reader(t, "aiter", nsqd_tcp_addresses=address, telemetry=otel.telemetry())
        try:
            async for m in reader:
                m.finish()
                return m
        finally:
            reader.close()
    m = asyncio.run(first())
    aiter_receives = [s for s in otel.spans(f"receive {t}")
                      if s.attributes["messaging.consumer.group.name"] == "aiter"]
    assert [s.attributes["messaging.message.id"] for s in aiter_receives] == [m.id.decode()]
    assert m.body in (b"one", b"x", b"y")   # opened
    blocks_reader = Reader(tb, "blocks", nsqd_tcp_addresses=address, max_in_flight=10,
                           telemetry=otel.telemetry())
    try:
        blocks: list[Any] = []
        wait_until(lambda: blocks.extend(blocks_reader.get_blocks(10, 0.2)) or
                   sum(map(len, blocks)) >= 3, 15, "3 messages in blocks")
        blocks_reader.finish_blocks(blocks)
    finally:
        blocks_reader.close()
    bodies = [m.body for b in blocks for m in b.messages()]
    assert all(body.startswith(TRACED_ENVELOPE_MAGIC) for body in bodies)  # not opened
    block_receives = otel.spans(f"receive {tb}")
    assert block_receives and all(not s.links for s in block_receives)
    assert sum(s.attributes["messaging.batch.message_count"] for s in block_receives) == 3
    consumed = only(otel.points()[CONSUMED], **{"messaging.operation.name": "receive",
                                                "messaging.consumer.group.name": "blocks"})
    assert consumed.value == 3


def test_a_reader_without_telemetry_hands_the_envelope_over_as_it_came(nsqd, otel, running_reader):
    t = topic()
    address = nsqd.nsqd_tcp_addresses[0]
    got: list[bytes] = []
    r = running_reader.start(t, "plain", lambda m: got.append(m.body),
                             nsqd_tcp_addresses=address)
    with Producer(address, telemetry=otel.telemetry(trace_context=True)) as p:
        p.publish(t, b"inner")
    wait_until(lambda: got, 15, "1 message")
    running_reader.stop(r)
    assert got[0].startswith(TRACED_ENVELOPE_MAGIC)
    assert open_traced_envelope(got[0]).body == b"inner"


def test_telemetry_off_creates_no_instrument_and_no_span(nsqd, running_reader, monkeypatch):
    """With SDK providers as OpenTelemetry's global ones, a Reader and a Producer built
    without telemetry= record nothing: they never ask for a provider, meter or tracer.
    (The globals are patched for this test only: the SDK allows setting them once per
    process, and other test files share the process.)"""
    metric_reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    asked: list[str] = []

    class Watching(MeterProvider):
        def get_meter(self, *a: Any, **k: Any) -> Any:
            asked.append("meter")
            return super().get_meter(*a, **k)

    class WatchingTracers(TracerProvider):
        def get_tracer(self, *a: Any, **k: Any) -> Any:
            asked.append("tracer")
            return super().get_tracer(*a, **k)
    meters = Watching(metric_readers=[metric_reader])
    tracers = WatchingTracers()
    tracers.add_span_processor(SimpleSpanProcessor(exporter))

    def global_meters() -> MeterProvider:
        asked.append("global meter provider")
        return meters

    def global_tracers() -> TracerProvider:
        asked.append("global tracer provider")
        return tracers
    monkeypatch.setattr(metrics, "get_meter_provider", global_meters)
    monkeypatch.setattr(trace, "get_tracer_provider", global_tracers)
    t = topic()
    address = nsqd.nsqd_tcp_addresses[0]
    got: list[bytes] = []
    r = running_reader.start(t, "off", lambda m: got.append(m.body), nsqd_tcp_addresses=address)
    with Producer(address) as p:
        p.publish(t, b"quiet")
        p.mpublish(t, [b"still", b"quiet"])
    wait_until(lambda: len(got) == 3, 15, "3 messages")
    running_reader.stop(r)
    assert got == [b"quiet", b"still", b"quiet"]
    assert asked == [] and exporter.get_finished_spans() == ()
    assert metric_reader.get_metrics_data() is None or not any(
        sm.metrics for rm in metric_reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics)
    # the same watchers see Telemetry() ask, at construction only (so they can see)
    telemetry = Telemetry()
    assert {"global meter provider", "meter", "global tracer provider", "tracer"} <= set(asked)
    at_construction = len(asked)
    with Producer(address, telemetry=telemetry) as p:
        p.publish(t, b"loud")
    assert len(asked) == at_construction
    (scope,) = metric_reader.get_metrics_data().resource_metrics[0].scope_metrics
    sent = {m.name: m for m in scope.metrics}[SENT]
    assert sent.data.data_points[0].value == 1 and len(exporter.get_finished_spans()) == 1


def test_telemetry_must_be_a_telemetry_object():
    with pytest.raises(errors.ConfigError, match="telemetry=Telemetry()"):
        Producer("127.0.0.1:4150", telemetry=True)
    with pytest.raises(errors.ConfigError, match="takes a nsq_spark.telemetry.Telemetry"):
        Reader("t", "c", nsqd_tcp_addresses="127.0.0.1:4150", telemetry=object())
    with pytest.raises(errors.ConfigError, match="trace_context must be True or False"):
        Telemetry(trace_context="yes")  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigError, match=r"Telemetry\(meter_provider=...\) takes an "
                       "OpenTelemetry meter provider"):
        Telemetry(meter_provider="http://collector:4317")  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigError, match="tracer provider .with get_tracer"):
        Telemetry(tracer_provider=MeterProvider())  # type: ignore[arg-type]


def test_async_publishes_are_measured_when_they_settle(nsqd, otel):
    import asyncio

    t = topic()
    address = nsqd.nsqd_tcp_addresses[0]

    async def main() -> None:
        async with Producer(address, telemetry=otel.telemetry()) as p:
            await p.apublish(t, b"a")
            await p.ampublish(t, [b"b", b"c"])
            await p.publish_nowait(t, b"d")
    asyncio.run(main())
    sent = only(otel.points()[SENT], **{"messaging.destination.name": t})
    assert sent.value == 4 and "error.type" not in sent.attributes
    assert len(otel.spans(f"send {t}")) == 3


def test_coroutine_and_batch_handlers_get_process_spans_linked_to_every_producer(
        nsqd, otel, running_reader):
    t = topic()
    address = nsqd.nsqd_tcp_addresses[0]
    with Producer(address, telemetry=otel.telemetry(trace_context=True)) as p:
        for body in (b"1", b"2", b"3"):
            p.publish(t, body)
    sends = {s.context.span_id for s in otel.spans(f"send {t}")}
    batches: list[list[bytes]] = []

    def batch(msgs):
        batches.append([m.body for m in msgs])
        assert trace.get_current_span().name == f"process {t}"   # the handler's own spans nest
        return True

    r = running_reader.start(t, "batch", None, batch_handler=batch, nsqd_tcp_addresses=address,
                             max_in_flight=10, telemetry=otel.telemetry())
    wait_until(lambda: sum(map(len, batches)) >= 3, 15, "3 messages in batches")
    running_reader.stop(r)
    assert sorted(b for chunk in batches for b in chunk) == [b"1", b"2", b"3"]
    processes = otel.spans(f"process {t}")
    assert {link.context.span_id for s in processes for link in s.links} == sends
    assert only(otel.points()[PROCESS], **{"messaging.consumer.group.name": "batch"}).count \
        == len(batches)

    got: list[bytes] = []

    async def coroutine(m):
        got.append(m.body)
        return True
    r = running_reader.start(t, "coro", coroutine, nsqd_tcp_addresses=address,
                             telemetry=otel.telemetry())
    # subscribed first: nsqd copies a message only into the channels that exist
    wait_until(lambda: nsqd.nsqds[0].channel_stats(t, "coro"), 15, "the coro channel")
    with Producer(address, telemetry=otel.telemetry(trace_context=True)) as p:
        p.publish(t, b"4")
    wait_until(lambda: got, 15, "1 message")
    running_reader.stop(r)
    assert got == [b"4"]
    coro_spans = [s for s in otel.spans(f"process {t}")
                  if s.attributes["messaging.consumer.group.name"] == "coro"]
    assert len(coro_spans) == 1 and len(coro_spans[0].links) == 1


def test_a_spooling_producer_that_traces_and_digests_wraps_each_body_once(
        nsqd, otel, running_reader, tmp_path):
    t = topic()
    address = nsqd.nsqd_tcp_addresses[0]
    got: list[bytes] = []
    r = running_reader.start(t, "raw", lambda m: got.append(m.body), nsqd_tcp_addresses=address)
    with Producer(address, spool_dir=tmp_path / "spool", message_id_digest=True,
                  telemetry=otel.telemetry(trace_context=True)) as p:
        p.publish(t, b"once")
        assert p.flush(10)
    wait_until(lambda: got, 15, "1 message")
    running_reader.stop(r)
    opened = open_traced_envelope(got[0])
    assert opened.body == b"once" and opened.traceparent is not None
    (send,) = otel.spans(f"send {t}")
    assert opened.traceparent.split("-")[2] == f"{send.context.span_id:016x}"


def test_a_spooling_producer_counts_what_the_drain_sends_to_nsqd_not_what_it_spools(
        nsqd, otel, tmp_path):
    """The conventions: sent.messages must not count messages created but not sent. The
    send span is the publish call's; the count, the duration and error.type are the
    drain's sends to nsqd."""
    from nsq_spark.testing import free_port

    t = topic()
    telemetry = otel.telemetry(trace_context=True)
    # nowhere to send: spooled, never sent (attempts fail, with their error.type)
    nowhere = Producer(f"127.0.0.1:{free_port()}", spool_dir=tmp_path / "held",
                       telemetry=telemetry)
    try:
        nowhere.publish(t, b"held")
        assert not nowhere.flush(0.5)
    finally:
        nowhere.close(timeout=1)
    assert len(otel.spans(f"send {t}")) == 1
    assert all("error.type" in p.attributes for p in otel.points().get(SENT, []))
    # sent: counted when nsqd took it; refused by nsqd (over its max_msg_size): error.type
    address = nsqd.nsqd_tcp_addresses[0]
    with Producer(address, spool_dir=tmp_path / "spool", max_msg_size=1 << 20,
                  telemetry=telemetry) as p:
        p.publish(t, b"ok")
        assert p.flush(10)
        p.publish(t, b"x" * 8192)
        p.flush(10)   # False: the refused message went to rejected/, not to nsqd
        wait_until(lambda: any(pt.attributes.get("error.type") == "E_BAD_MESSAGE"
                               for pt in otel.points().get(SENT, [])), 15, "the refusal")
        # the spool's counters are there with telemetry too (its transport is wrapped)
        stats = p.spool_stats
        assert stats is not None and stats.appended == 2 and stats.acked == 1
        wait_until(lambda: stats.rejected == 1, 15, "the refusal in the spool's counters")
    host, port = host_port(address)
    ok = only(otel.points()[SENT], **{"server.address": host, "error.type": None})
    assert ok.value == 1 and ok.attributes["server.port"] == port
    refused = only(otel.points()[SENT], **{"server.address": host,
                                           "error.type": "E_BAD_MESSAGE"})
    assert refused.value == 1
    assert only(otel.points()[OPERATION], **{"server.address": host,
                                             "error.type": "E_BAD_MESSAGE"}).count == 1
    assert len(otel.spans(f"send {t}")) == 3   # one per publish call, at the call
