"""Publish ids against a real nsqd, read back raw (tests/replica_helpers.py): two
publishes of equal bytes carry two ids, in every mode; an idempotency key carries the
same id in every mode; a publish retried after its answer was lost carries the same id
twice; and with telemetry the one envelope holds the publish id and the trace context."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from nsq_spark.envelope import open_body, publish_id_for
from nsq_spark._publish.producer import Producer
from nsq_spark.telemetry import Telemetry
from nsq_spark.testing import NSQCluster
from replica_helpers import LosingProxy, drain, ids_of, make_channel

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def nsqd() -> Iterator[NSQCluster]:
    with NSQCluster(nsqd=1, lookupd=0) as cluster:
        yield cluster


def sent(reader: InMemoryMetricReader) -> int:
    """``messaging.client.sent.messages`` so far, over every attribute set."""
    data = reader.get_metrics_data()
    return sum(int(point.value) for rm in (data.resource_metrics if data else [])
               for sm in rm.scope_metrics for m in sm.metrics
               if m.name == "messaging.client.sent.messages" for point in m.data.data_points)


def new_topic(cluster: NSQCluster) -> str:
    t = "ids" + uuid.uuid4().hex[:10]
    make_channel(cluster.nsqd_http_addresses[0], t)
    return t


def test_equal_bodies_published_twice_carry_two_ids_in_every_mode(nsqd: NSQCluster,
                                                                  tmp_path: Path) -> None:
    t = new_topic(nsqd)
    tcp, http = nsqd.nsqd_tcp_addresses[0], nsqd.nsqd_http_addresses[0]
    with Producer(tcp, publish_ids=True) as p:
        p.publish(t, b"click")
        p.publish(t, b"click")
        p.mpublish(t, [b"click", b"click"])
        p.publish_async(t, b"click").result(10)
        p.mpublish_async(t, [b"click"]).result(10)

    async def on_a_loop() -> None:
        async with Producer(tcp, publish_ids=True) as q:
            await q.apublish(t, b"click")
            await q.ampublish(t, [b"click"])
            await q.publish_nowait(t, b"click")
    asyncio.run(on_a_loop())
    with Producer(tcp, publish_ids=True, spool_dir=tmp_path) as s:
        s.publish(t, b"click")
        s.publish(t, b"click")
        assert s.flush(10)
    with Producer(nsqd_http_addresses=http, publish_ids=True) as h:
        h.publish(t, b"click")
        h.mpublish(t, [b"click"])
    bodies = drain(nsqd, 0, t)
    assert len(bodies) == 13
    assert {open_body(b).body for b in bodies} == {b"click"}
    assert set(ids_of(bodies).values()) == {1}              # 13 publishes, 13 ids


def test_an_idempotency_key_gives_the_same_id_in_every_mode(nsqd: NSQCluster,
                                                            tmp_path: Path) -> None:
    t = new_topic(nsqd)
    tcp = nsqd.nsqd_tcp_addresses[0]
    with Producer(tcp, publish_ids=True) as p:
        p.publish(t, b"order", idempotency_key="order-1")
        p.publish_async(t, b"order", idempotency_key=b"order-1").result(10)
        p.mpublish(t, [b"order", b"other"], idempotency_keys=["order-1", "order-2"])
        p.mpublish_async(t, [b"other"], idempotency_keys=["order-2"]).result(10)

    async def on_a_loop() -> None:
        async with Producer(tcp, publish_ids=True) as q:
            await q.apublish(t, b"order", idempotency_key="order-1")
            await q.ampublish(t, [b"other"], idempotency_keys=["order-2"])
            await q.publish_nowait(t, b"order", idempotency_key="order-1")
    asyncio.run(on_a_loop())
    with Producer(tcp, replicas=1, spool_dir=tmp_path) as s:   # replicas: ids implied
        s.publish(t, b"order", idempotency_key="order-1")
        assert s.flush(10)
    ids = ids_of(drain(nsqd, 0, t))
    assert ids == Counter({publish_id_for("order-1"): 6, publish_id_for("order-2"): 3})


@pytest.mark.parametrize("mode", ["blocking", "futures"])
def test_a_publish_retried_after_its_answer_was_lost_carries_the_same_id(
        nsqd: NSQCluster, mode: str) -> None:
    t = new_topic(nsqd)
    host, port = nsqd.nsqd_tcp_addresses[0].rsplit(":", 1)
    proxy = LosingProxy((host, int(port)), f"PUB {t}".encode())
    try:
        with Producer(proxy.address, publish_ids=True, retry_wait=0.01) as p:
            if mode == "blocking":
                p.publish(t, b"once")
            else:
                p.publish_async(t, b"once").result(10)
            assert p.stats()["retries"] >= 1
        assert proxy.lost == 1
    finally:
        proxy.close()
    bodies = drain(nsqd, 0, t)
    assert len(bodies) == 2                                  # nsqd took it twice ...
    assert len(ids_of(bodies)) == 1                          # ... as one publish
    assert {open_body(b).body for b in bodies} == {b"once"}


def test_with_telemetry_one_envelope_carries_the_publish_id_and_the_trace(
        nsqd: NSQCluster, tmp_path: Path) -> None:
    t = new_topic(nsqd)
    tcp = nsqd.nsqd_tcp_addresses[0]
    metrics = InMemoryMetricReader()
    telemetry = Telemetry(MeterProvider(metric_readers=[metrics]), TracerProvider(),
                          trace_context=True)
    with Producer(tcp, publish_ids=True, telemetry=telemetry) as p:
        p.publish(t, b"traced", idempotency_key="k-1")
        p.mpublish(t, [b"traced", b"traced"])
    assert sent(metrics) == 3
    with Producer(tcp, replicas=1, telemetry=telemetry, spool_dir=tmp_path,
                  message_id_digest=True) as s:
        s.publish(t, b"traced", idempotency_key="k-2")
        assert s.flush(10)
    assert sent(metrics) == 4          # the replicating drain's send is counted too
    opened = [open_body(b) for b in drain(nsqd, 0, t)]
    assert len(opened) == 4
    for e in opened:   # facade (id) -> telemetry (trace) -> transport: one version-3 envelope
        assert (e.version, e.body, e.damaged) == (3, b"traced", None)
        assert e.traceparent is not None and e.traceparent.startswith("00-")
    ids = [e.publish_id for e in opened]
    assert ids[0] == publish_id_for("k-1") and ids[3] == publish_id_for("k-2")
    assert len(set(ids)) == 4
