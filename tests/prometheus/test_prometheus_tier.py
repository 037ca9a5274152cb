"""A real Prometheus scrapes a running Reader, Producer and Spark query through
nsq_spark.metrics, and the series and their values are read back through Prometheus's own
query API (/api/v1/query). The example alert rules are loaded by that Prometheus and each
rule's expression is evaluated by it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from promserver import PrometheusServer

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]

RULES = Path(__file__).resolve().parents[2] / "examples" / "prometheus" / "nsq-alerts.yml"


def one(values: list[float], expected: float) -> bool:
    return values == [expected]


def test_prometheus_scrapes_the_exporter(prom: PrometheusServer, exporter: Any) -> None:
    prom.wait_for(f'up{{job="nsq-spark",instance="{exporter.target}"}}',
                  lambda v: one(v, 1.0), 20, "the exporter scraped")


@pytest.mark.nsq_cluster(lookupd=0)
def test_a_readers_and_a_producers_figures_reach_prometheus(nsq_cluster, prom, exporter):
    import nsq_spark as nsq

    from nsq_spark.testing import free_port

    addr = nsq_cluster.nsqd_tcp_addresses[0]
    down = f"127.0.0.1:{free_port()}"  # an nsqd the producer is given that is not there
    bodies = [b"prom-%03d" % i for i in range(120)]
    with nsq.Producer([addr, down]) as producer, \
            nsq.Reader("prom_tier", "c", nsqd_tcp_addresses=[addr],
                       max_in_flight=200) as reader:
        exporter.collector.watch(producer, name="tier-producer")
        exporter.collector.watch(reader, name="tier-reader")
        producer.mpublish("prom_tier", bodies[:100])
        for body in bodies[100:]:
            producer.publish("prom_tier", body)
        got: list[bytes] = []
        for batch in reader.iter_batches(max_messages=200, timeout=1.0):
            got += [m.body for m in batch]
            reader.finish(batch)
            if len(got) >= len(bodies):
                break
        assert sorted(got) == bodies
        rl = 'reader="tier-reader",topic="prom_tier",channel="c"'
        prom.wait_for(f"nsq_reader_messages_received_total{{{rl}}}",
                      lambda v: one(v, 120.0), 20, "messages received")
        prom.wait_for(f"nsq_reader_messages_finished_total{{{rl}}}",
                      lambda v: one(v, 120.0), 20, "messages finished")
        assert prom.values(f"nsq_reader_connections{{{rl}}}") == [1.0]
        assert prom.values(f"nsq_reader_connections_subscribed{{{rl}}}") == [1.0]
        assert prom.values(f'nsq_reader_connection_messages_received_total{{{rl},'
                           f'nsqd="{addr}"}}') == [120.0]
        assert prom.values(f"nsq_reader_max_in_flight{{{rl}}}") == [200.0]
        pl = 'producer="tier-producer"'
        prom.wait_for(f"nsq_producer_commands_total{{{pl}}}",
                      lambda v: one(v, 21.0), 20, "1 MPUB + 20 PUB acknowledged")
        if "messages" in producer.stats():
            assert prom.values(f"nsq_producer_messages_total{{{pl}}}") == [120.0]
        assert prom.values(f'nsq_producer_nsqd_up{{{pl},nsqd="{addr}"}}') == [1.0]
        prom.wait_for(f'nsq_producer_nsqd_up{{{pl},nsqd="{down}"}}',
                      lambda v: one(v, 0.0), 20, "the missing nsqd seen down")
        # the example rule for it is pending (its `for:` is 2 minutes) for that nsqd only
        deadline = time.monotonic() + 20
        while True:
            alerts = [{**a["labels"], "state": a["state"]} for a in prom.api("alerts")["alerts"]
                      if a["labels"].get("alertname") == "NSQProducerNsqdDown"
                      and a["labels"].get("producer") == "tier-producer"]
            if alerts or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert [(a["nsqd"], a["state"]) for a in alerts] == [(down, "pending")]
        # a rule over these series, evaluated by Prometheus: no reader gave up
        assert prom.values(f"increase(nsq_reader_messages_given_up_total{{{rl}}}[1m]) > 0") \
            == []
        exporter.collector.unwatch(producer)
        exporter.collector.unwatch(reader)


@pytest.mark.spark
@pytest.mark.timeout(180)
def test_a_spark_querys_source_numbers_reach_prometheus(nsq_cluster, prom, exporter,
                                                        spark_session, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spark"))
    from sparkutil import http_mpub

    from nsq_spark.spark.listener import NSQSourceListener, SparkSourceMetrics

    spark = spark_session
    metrics = SparkSourceMetrics()
    exporter.collector.watch(metrics)
    listener = NSQSourceListener(metrics)
    spark.streams.addListener(listener)
    node = nsq_cluster.nsqds[0]
    http_mpub(node.http_address, "prom_spark", [b"x" * 50] * 300)
    df = (spark.readStream.format("nsq").option("channel", "prom")
          .option("lookupdHttpAddresses", ",".join(nsq_cluster.lookupd_http_addresses))
          .option("topic", "prom_spark").option("idleTimeout", 0.3)
          .option("spoolPath", str(tmp_path / "spool")).load())
    q = (df.writeStream.format("noop").queryName("prom_tier")
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(processingTime="500 milliseconds").start())
    sl = 'query="prom_tier",topic="prom_spark",channel="prom"'
    try:
        # the first batch's progress: the backlog it was planned on, no numbers yet
        prom.wait_for(f"nsq_spark_source_backlog_messages{{{sl}}}",
                      lambda v: one(v, 300.0), 90, "the backlog of the first batch")
        # a batch's numbers come with the next batch's progress: publish one more
        deadline = time.monotonic() + 60
        while not q.lastProgress or q.lastProgress.get("numInputRows", 0) < 300:
            assert time.monotonic() < deadline, q.lastProgress
            time.sleep(0.2)
        http_mpub(node.http_address, "prom_spark", [b"y" * 50])
        prom.wait_for(f"nsq_spark_source_rows_total{{{sl}}}",
                      lambda v: one(v, 300.0), 60, "the rows of the first batch")
        assert prom.values(f"nsq_spark_source_batches_total{{{sl}}}") == [1.0]
        assert prom.values(f"nsq_spark_source_bytes_total{{{sl}}}") == [300 * 50.0]
        assert prom.values(f"nsq_spark_source_redeliveries_dropped_total{{{sl}}}") == [0.0]
        assert prom.values(f"nsq_spark_source_dead_lettered_total{{{sl}}}") == [0.0]
        assert prom.values(f"nsq_spark_source_backlog_messages{{{sl}}}") == [1.0]
        [lag] = prom.values(f"nsq_spark_source_lag_seconds{{{sl}}}")
        assert 0 <= lag < 120  # the age of the newest message of batch 1
        [at] = prom.values(f"nsq_spark_source_last_progress_timestamp_seconds{{{sl}}}")
        assert abs(time.time() - at) < 60
    finally:
        q.stop()
        try:
            # the listener forgets a terminated query: a stopped query exports no stale
            # lag (Spark's listener bus delivers the event asynchronously)
            deadline = time.monotonic() + 20
            while metrics.totals() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert metrics.totals() == []
        finally:
            spark.streams.removeListener(listener)
            exporter.collector.unwatch(metrics)


def test_the_example_alert_rules_load_and_every_expression_evaluates(prom):
    rules = prom.api("rules")
    loaded = {r["name"]: r for g in rules["groups"] for r in g["rules"]}
    text = RULES.read_text()
    names = [line.split(":", 1)[1].strip() for line in text.splitlines()
             if line.strip().startswith("- alert:")]
    assert sorted(loaded) == sorted(names) and len(names) >= 10
    deadline = time.monotonic() + 20
    while any(r.get("health") != "ok" for r in loaded.values()):
        assert time.monotonic() < deadline, {n: (r.get("health"), r.get("lastError"))
                                             for n, r in loaded.items()}
        time.sleep(0.5)
        loaded = {r["name"]: r for g in prom.api("rules")["groups"] for r in g["rules"]}
    for name, rule in loaded.items():
        prom.query(rule["query"])  # raises PrometheusError on an error
