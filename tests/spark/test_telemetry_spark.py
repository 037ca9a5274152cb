"""A Spark query over traced messages: ``body`` is the inner body, ``trace_parent`` the
producer's send span, and the query's progress gives the consumed-messages metric."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nsq_spark._publish.producer import Producer
from nsq_spark.spark.instrument import ProgressInstrument
from nsq_spark.telemetry import Telemetry

pytestmark = [pytest.mark.spark, pytest.mark.nsqd]


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_a_query_returns_inner_bodies_the_trace_parent_and_counts_its_rows(
        spark, nsq_cluster, tmp_path):
    topic, channel = "spark_otel", "traced"
    address = nsq_cluster.nsqd_tcp_addresses[0]
    exporter = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(exporter))
    metric_reader = InMemoryMetricReader()
    telemetry = Telemetry(MeterProvider(metric_readers=[metric_reader]), tracers,
                          trace_context=True)
    with Producer(address, telemetry=telemetry) as p:
        p.mpublish(topic, [b"m%d" % i for i in range(5)])
        p.publish(topic, b"plain-looking")
    sends = {s.context.span_id: s for s in exporter.get_finished_spans()}
    assert len(sends) == 2

    df = (spark.readStream.format("nsq").option("topic", topic).option("channel", channel)
          .option("nsqdTcpAddresses", address).option("numPartitions", 1)
          .option("idleTimeout", 0.3).option("spoolPath", str(tmp_path / "spool")).load())
    assert df.schema["trace_parent"].nullable
    q = (df.writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "ck"))
         .option("path", str(tmp_path / "out")).trigger(availableNow=True).start())
    assert q.awaitTermination(120), "AvailableNow query did not finish in time"
    assert q.exception() is None
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(bytes(r["body"]) for r in rows) == sorted(
        [b"m%d" % i for i in range(5)] + [b"plain-looking"])
    for r in rows:
        version, trace_id, span_id, flags = r["trace_parent"].split("-")
        send = sends[int(span_id, 16)]
        assert int(trace_id, 16) == send.context.trace_id and version == "00"

    progress = ProgressInstrument(telemetry)
    counted = sum(progress.record(p) for p in q.recentProgress)
    assert counted == 6
    (metric,) = [m for rm in metric_reader.get_metrics_data().resource_metrics
                 for sm in rm.scope_metrics for m in sm.metrics
                 if m.name == "messaging.client.consumed.messages"]
    (point,) = metric.data.data_points
    assert point.value == 6
    assert point.attributes["messaging.destination.name"] == topic
    assert point.attributes["messaging.consumer.group.name"] == channel
    assert point.attributes["messaging.operation.name"] == "receive"
