"""The Spark source's numbers leave Spark: progress -> NSQSourceListener ->
SparkSourceMetrics -> NSQCollector (nsq_spark_source_*), and serve(). No Spark and no
sockets but serve()'s loopback port: progress events are the JSON the source reports."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

prometheus_client = pytest.importorskip("prometheus_client")
pytest.importorskip("pyspark")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from nsq_spark.metrics import NSQCollector, Watchable, serve  # noqa: E402
from nsq_spark.spark.listener import (NSQSourceListener, SourceBatch,  # noqa: E402
                                      SparkSourceMetrics)
from nsq_spark.spark.progress import lag_fields  # noqa: E402
from nsq_spark.spark._spool import BatchSummary, Spool  # noqa: E402

pytestmark = pytest.mark.unit


def report(batch: int, last_batch: int | None, rows: int = 0, **extra: Any) -> dict[str, Any]:
    """One nsq source's ``latestOffset`` report, as datasource.reportLatestOffset makes
    it (the flat fields from the real lag_fields)."""
    summary = None if last_batch is None else BatchSummary(
        rows=rows, bytes=10 * rows, oldest_timestamp_ns=1_000_000_000_000_000_000,
        newest_timestamp_ns=1_000_000_005_000_000_000, redeliveries_dropped=1,
        partitions=2, dead_lettered=extra.pop("dead", 0))
    out = {"query": "tok", "batch": batch, "v": 2, "channel": "ch", "topic": "orders",
           "topics": ["orders"], "redeliveriesDropped": 0}
    out.update(lag_fields(extra.pop("backlog", 7), 0, 0, last_batch, summary,
                          1_000_000_010.0))
    out.update(extra)
    return out


def progress(*reports: dict[str, Any], name: str | None = "orders-q",
             query_id: str = "0000-id") -> dict[str, Any]:
    return {"id": query_id, "name": name, "batchId": 3,
            "sources": [{"description": "nsq", "latestOffset": json.dumps(r)}
                        for r in reports] + [{"description": "rate", "latestOffset": "5"}]}


def scrape(registry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = prometheus_client.generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


LABELS = (("channel", "ch"), ("query", "orders-q"), ("topic", "orders"))


def test_a_batch_is_counted_once_however_many_progress_events_repeat_it():
    metrics = SparkSourceMetrics(clock=lambda: 1234.5)
    registry = prometheus_client.CollectorRegistry()
    NSQCollector([metrics]).register(registry)
    listener = NSQSourceListener(metrics)
    listener.publish(progress(report(1, None)))            # nothing ran yet
    listener.publish(progress(report(2, 1, rows=40, dead=3)))
    listener.publish(progress(report(2, 1, rows=40, dead=3)))  # idle: same numbers
    listener.publish(json.dumps(progress(report(3, 2, rows=2, backlog=0))))
    got = scrape(registry)
    assert got[("nsq_spark_source_batches_total", LABELS)] == 2
    assert got[("nsq_spark_source_rows_total", LABELS)] == 42
    assert got[("nsq_spark_source_bytes_total", LABELS)] == 420
    assert got[("nsq_spark_source_redeliveries_dropped_total", LABELS)] == 2
    assert got[("nsq_spark_source_dead_lettered_total", LABELS)] == 3
    assert got[("nsq_spark_source_backlog_messages", LABELS)] == 0
    assert got[("nsq_spark_source_lag_seconds", LABELS)] == 0.0  # caught up
    assert got[("nsq_spark_source_last_batch", LABELS)] == 2
    assert got[("nsq_spark_source_last_batch_oldest_age_seconds", LABELS)] == 10.0
    assert got[("nsq_spark_source_last_progress_timestamp_seconds", LABELS)] == 1234.5


def test_the_lag_is_the_age_of_the_newest_message_read_while_a_backlog_waits():
    metrics = SparkSourceMetrics()
    NSQSourceListener(metrics).publish(progress(report(2, 1, rows=5, backlog=9)))
    [totals] = metrics.totals()
    assert (totals.backlog_messages, totals.lag_seconds) == (9, 5.0)


def test_queries_without_a_name_are_labelled_by_id_and_forgotten_when_they_end():
    metrics = SparkSourceMetrics()
    listener = NSQSourceListener(metrics)
    listener.publish(progress(report(2, 1, rows=5), name=None, query_id="abc"))
    listener.publish(progress(report(2, 1, rows=5), query_id="named-id"))
    assert sorted(t.query for t in metrics.totals()) == ["abc", "orders-q"]

    class Terminated:
        id = "named-id"

    listener.onQueryTerminated(Terminated())
    assert [t.query for t in metrics.totals()] == ["abc"]


def test_an_idle_event_says_caught_up_and_alive_not_the_last_batch_s_backlog():
    """Spark 3.5+ posts a QueryIdleEvent, not a progress, when a trigger plans no batch:
    the last progress (a batch planned with a backlog) must not stay exported as if the
    query were stalled behind it."""
    from pyspark.sql.streaming.listener import QueryIdleEvent

    now = [1000.0]
    metrics = SparkSourceMetrics(clock=lambda: now[0])
    registry = prometheus_client.CollectorRegistry()
    NSQCollector([metrics]).register(registry)
    listener = NSQSourceListener(metrics)
    qid, run = "6f1c1a3e-1111-4222-8333-944455556666", "0e0e0e0e-1111-4222-8333-944455556666"
    listener.publish(progress(report(2, 1, rows=5, backlog=9), query_id=qid))
    now[0] = 1600.0
    listener.onQueryIdle(QueryIdleEvent.fromJson(
        {"id": qid, "runId": run, "timestamp": "2026-11-25T07:10:00.000Z"}))
    got = scrape(registry)
    assert got[("nsq_spark_source_backlog_messages", LABELS)] == 0
    assert got[("nsq_spark_source_lag_seconds", LABELS)] == 0.0
    assert got[("nsq_spark_source_last_progress_timestamp_seconds", LABELS)] == 1600.0
    assert got[("nsq_spark_source_batches_total", LABELS)] == 1   # counters untouched
    assert metrics.idle("no-such-query") == 0


def test_an_idle_source_with_a_minimum_may_hold_a_backlog_back_so_it_is_unknown():
    metrics = SparkSourceMetrics(clock=lambda: 5.0)
    listener = NSQSourceListener(metrics)
    listener.publish(progress(report(2, 1, rows=5, backlog=9, minMessagesPerTrigger=100),
                              query_id="q1"))
    [held] = metrics.totals()
    assert (held.backlog_messages, held.lag_seconds) == (9, 5.0)
    assert metrics.idle("q1") == 1
    [held] = metrics.totals()
    assert (held.backlog_messages, held.lag_seconds, held.updated_at) == (None, None, 5.0)
    # the next report without a minimum: an idle trigger means nothing waits again
    listener.publish(progress(report(3, 2, rows=1, backlog=4), query_id="q1"))
    metrics.idle("q1")
    [caught_up] = metrics.totals()
    assert (caught_up.backlog_messages, caught_up.lag_seconds) == (0, 0.0)


def test_a_multi_topic_source_is_labelled_with_its_topics_and_other_sources_are_skipped():
    metrics = SparkSourceMetrics()
    multi = report(2, 1, rows=3, topics=["a", "b"], backlogByTopic={"a": 1, "b": 2})
    del multi["topic"]
    got = NSQSourceListener(metrics).publish(progress(multi))
    assert [b.lag.topics for b in got] == [("a", "b")]
    assert [(t.topic, t.rows) for t in metrics.totals()] == [("a,b", 3)]


def test_the_callback_gets_every_source_and_a_failing_callback_is_logged(caplog):
    seen: list[SourceBatch] = []
    listener = NSQSourceListener(on_batch=seen.append)
    listener.publish(progress(report(2, 1, rows=5)))
    listener.publish(progress(report(2, 1, rows=5)))
    assert [(b.query, b.lag.last_batch_rows, b.new_batch) for b in seen] == [
        ("orders-q", 5, True), ("orders-q", 5, False)]

    def boom(batch: SourceBatch) -> None:
        raise RuntimeError("sink down")

    NSQSourceListener(on_batch=boom).publish(progress(report(2, 1)))
    assert "on_batch failed for query orders-q: sink down" in caplog.text


def test_a_listener_that_would_publish_nothing_is_refused():
    with pytest.raises(ValueError, match="pass a SparkSourceMetrics, a callback, or both"):
        NSQSourceListener()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 50)), max_size=30))
def test_totals_are_the_sum_over_distinct_consecutive_batches(events):
    """Events in Spark's order (batch numbers never go down), each batch's rows fixed:
    the totals count every batch once."""
    events = sorted(events, key=lambda e: e[0])
    rows_of = {}
    for batch, rows in events:
        rows_of.setdefault(batch, rows)
    metrics = SparkSourceMetrics()
    listener = NSQSourceListener(metrics)
    for batch, _ in events:
        listener.publish(progress(report(batch + 1, batch, rows=rows_of[batch])))
    totals = metrics.totals()
    if not events:
        assert totals == []
        return
    [t] = totals
    assert (t.batches, t.rows) == (len(rows_of), sum(rows_of.values()))


def test_dead_letters_go_from_the_partitions_completion_to_the_batch_summary(tmp_path):
    spool = Spool(str(tmp_path), "q")
    for index, dead in ((0, 2), (1, 3)):
        part = spool.partition(1, index)
        part.complete(1, 10, bytes=100, dead_lettered=dead)
    assert spool.batch_summary(1).dead_lettered == 5
    assert spool.batch_summary(1).partitions == 2


def test_serve_listens_on_loopback_and_serves_the_registry():
    metrics = SparkSourceMetrics()
    registry = prometheus_client.CollectorRegistry()
    watched: Watchable = metrics
    NSQCollector([watched]).register(registry)
    NSQSourceListener(metrics).publish(progress(report(2, 1, rows=5)))
    server = serve(0, registry=registry)
    try:
        assert server.host == "127.0.0.1" and server.port > 0
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            text = resp.read().decode()
    finally:
        server.close()
    assert 'nsq_spark_source_rows_total{channel="ch",query="orders-q",topic="orders"} 5.0' \
        in text


@pytest.mark.parametrize("port", [-1, 65536, "9100", True])
def test_serve_refuses_a_port_out_of_range(port):
    with pytest.raises(ValueError, match=r"serve\(port=.*\): the port must be an int"):
        serve(port)


def test_a_fetch_task_records_its_dead_letters_in_the_partitions_completion(tmp_path):
    """maxAttempts=2, three of six messages delivered three times: the partition's
    completion, and so the batch summary the driver reports, counts 3 dead letters."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "spark"))
    from stand_in_reader import Addr, StandInReader  # typed against ReaderPort

    from nsq_spark.message import Message
    from nsq_spark.spark._fetch import fetch_stream_partition
    from nsq_spark.spark.options import parse_read_options

    opts = parse_read_options({"topic": "t", "channel": "c", "nsqdTcpAddresses": "h:1",
                               "spoolPath": str(tmp_path), "maxInFlight": "4",
                               "idleTimeout": "0.05", "maxAttempts": "2"}, streaming=True)
    msgs = [Message(b"%016d" % i, b"body-%d" % i, 1_700_000_000_000_000_000 + i,
                    3 if i % 2 == 0 else 1, Addr()) for i in range(6)]
    queue: list[Message] = list(msgs)
    log: list[Any] = []
    spool = Spool(str(tmp_path), "q")
    rows = sum(rb.num_rows for rb in fetch_stream_partition(
        opts, spool, 1, 0, None, lambda _: StandInReader(queue, log)))
    assert rows == 3
    assert spool.partition(1, 0).completion().dead_lettered == 3
    summary = spool.batch_summary(1)
    assert (summary.rows, summary.dead_lettered) == (3, 3)
    assert lag_fields(0, 0, 0, 1, summary, 2e9)["lastBatchDeadLettered"] == 3


def test_events_as_a_spark_connect_client_builds_them_are_published_and_forgotten():
    """A Connect client (pyspark >= 4.0) runs listeners in its own process, on events it
    rebuilds from the server's JSON with ``fromJson``; in Spark's JSON a source's
    ``latestOffset`` is a nested object, not a string. (No server here: the end-to-end
    path through a Connect server is not tested.)"""
    from pyspark.sql.streaming.listener import QueryProgressEvent, QueryTerminatedEvent

    qid, run = "6f1c1a3e-1111-4222-8333-944455556666", "0e0e0e0e-1111-4222-8333-944455556666"
    source = {"description": "NSQMicroBatchStream", "startOffset": {"batch": 1},
              "endOffset": {"batch": 2}, "latestOffset": report(2, 1, rows=9),
              "numInputRows": 9, "inputRowsPerSecond": 1.0, "processedRowsPerSecond": 1.0}
    progress_json = {"id": qid, "runId": run, "name": "connect-q",
                     "timestamp": "2026-11-25T07:00:00.000Z", "batchId": 2,
                     "batchDuration": 10, "stateOperators": [], "sources": [source],
                     "sink": {"description": "noop", "numOutputRows": 9}}
    metrics = SparkSourceMetrics()
    listener = NSQSourceListener(metrics)
    listener.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json}))
    [totals] = metrics.totals()
    assert (totals.query, totals.topic, totals.rows, totals.batches) == (
        "connect-q", "orders", 9, 1)
    listener.onQueryTerminated(QueryTerminatedEvent.fromJson(
        {"id": qid, "runId": run, "exception": None, "errorClassOnException": None}))
    assert metrics.totals() == []
