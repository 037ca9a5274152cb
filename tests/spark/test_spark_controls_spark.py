"""Kafka's controls and the lag numbers on a real local Spark against real nsqd and
nsqlookupd: several topics by pattern (listed again at each trigger), the minimum per
trigger with its delay, and a real ``StreamingQueryListener`` reading the lag with
:func:`nsq_spark.spark.progress.source_lag`.

The lag test reads what the fetch tasks wrote in their ``_COMPLETE`` records
(``Spool.batch_summary``); the pattern test, that the fetch tasks take the partition's
``topic``.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from typing import Any, Callable

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import http_mpub  # noqa: E402

pytestmark = [pytest.mark.spark]


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def listed(cluster, topic: str) -> bool:
    from nsq_spark.spark._backlog import list_topics

    return topic in list_topics(cluster.lookupd_http_addresses, [])[0]


def reader(spark, cluster, spool: str, **options: Any):
    r = (spark.readStream.format("nsq").option("channel", "ctl")
         .option("lookupdHttpAddresses", ",".join(cluster.lookupd_http_addresses))
         .option("idleTimeout", 0.3).option("spoolPath", spool))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_a_pattern_reads_its_topics_and_one_created_later(spark, nsq_cluster, tmp_path):
    node = nsq_cluster.nsqds[0]
    published = {"ctl_a": [b"a%d" % i for i in range(300)],
                 "ctl_b": [b"b%d" % i for i in range(200)],
                 "other": [b"o%d" % i for i in range(50)]}
    for topic, bodies in published.items():
        http_mpub(node.http_address, topic, bodies)
    wait_for(lambda: all(listed(nsq_cluster, t) for t in published), 15, "topics listed")
    df = reader(spark, nsq_cluster, str(tmp_path / "spool"), topicPattern="ctl_.*")
    q = (df.writeStream.format("memory").queryName("ctl_pattern")
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(processingTime="300 milliseconds").start())
    try:
        count = lambda: spark.sql("select count(*) from ctl_pattern").first()[0]  # noqa: E731
        wait_for(lambda: count() >= 500, 90, "ctl_a and ctl_b read")
        # a topic that appears while the query runs is matched at a later trigger
        late = [b"c%d" % i for i in range(100)]
        http_mpub(node.http_address, "ctl_c", late)
        wait_for(lambda: count() >= 600, 90, "ctl_c read")
        time.sleep(1)  # nothing more comes
        rows = spark.sql("select topic, body from ctl_pattern").collect()
        reports = [p["sources"][0].get("latestOffset") for p in q.recentProgress]
    finally:
        q.stop()
    got = collections.Counter((r["topic"], bytes(r["body"])) for r in rows)
    want = collections.Counter((t, b) for t, bodies in
                               {**published, "ctl_c": late}.items() if t != "other"
                               for b in bodies)
    assert got == want  # every message of the matched topics once, none of "other"
    import json

    parsed = [json.loads(r) for r in reports if r]
    assert any(r.get("topicPattern") == "ctl_.*" and "ctl_c" in r["topics"] for r in parsed)
    assert all("other" not in r["topics"] for r in parsed)
    assert any(len(r.get("plan", [])) == 2 for r in parsed)  # two topics in one batch


def test_no_batch_below_the_minimum_before_max_trigger_delay(spark, nsq_cluster, tmp_path):
    node = nsq_cluster.nsqds[0]
    http_mpub(node.http_address, "ctl_min", [b"m%d" % i for i in range(40)])
    df = reader(spark, nsq_cluster, str(tmp_path / "spool"), topic="ctl_min",
                minMessagesPerTrigger=100, maxTriggerDelay=4)
    started = time.monotonic()
    q = (df.writeStream.format("memory").queryName("ctl_min")
         .option("checkpointLocation", str(tmp_path / "ckpt")).start())  # default trigger
    try:
        count = lambda: spark.sql("select count(*) from ctl_min").first()[0]  # noqa: E731
        time.sleep(2.5)
        assert count() == 0  # 40 < 100 and 4 s have not passed
        wait_for(lambda: count() == 40, 30, "the held-back batch after maxTriggerDelay")
        waited = time.monotonic() - started
        # 100 messages at once: no wait
        http_mpub(node.http_address, "ctl_min", [b"n%d" % i for i in range(100)])
        t = time.monotonic()
        wait_for(lambda: count() == 140, 30, "a batch at the minimum")
        quick = time.monotonic() - t
    finally:
        q.stop()
    assert waited >= 4, waited
    assert quick < 4, quick


def test_a_listener_gets_the_lag_as_numbers(spark, nsq_cluster, tmp_path):
    from pyspark.sql.streaming import StreamingQueryListener

    from nsq_spark.spark.progress import SourceLag, source_lag

    lags: list[SourceLag] = []
    seen = threading.Event()

    class Lag(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            lag = source_lag(event.progress)
            if lag is not None:
                lags.append(lag)
                if lag.last_batch_rows:
                    seen.set()

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    node = nsq_cluster.nsqds[0]
    http_mpub(node.http_address, "ctl_lag", [b"x" * 100] * 1000)
    listener = Lag()
    spark.streams.addListener(listener)
    df = reader(spark, nsq_cluster, str(tmp_path / "spool"), topic="ctl_lag",
                maxMessagesPerTrigger=400)
    q = (df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(processingTime="500 milliseconds").start())
    def rows_reported() -> int:
        return sum({lag.last_batch: lag.last_batch_rows or 0 for lag in lags
                    if lag.last_batch is not None}.values())

    try:
        # batches of 400, 400, 200: the progress of batch N+1 carries batch N's numbers
        wait_for(lambda: rows_reported() >= 800, 90, "the numbers of the first two batches")
        # an idle query's trigger is no progress event (Spark's onQueryIdle): the last
        # batch's numbers come with the next batch
        http_mpub(node.http_address, "ctl_lag", [b"y" * 100])
        wait_for(lambda: rows_reported() >= 1000, 90, "the numbers of the third batch")
    finally:
        q.stop()
        spark.streams.removeListener(listener)
    assert seen.is_set()
    assert all(lag.topics == ("ctl_lag",) and lag.channel == "ctl" for lag in lags)
    # each batch's numbers once, in order: the progress of batch N+1 carries batch N's
    batches = {lag.last_batch: lag for lag in lags if lag.last_batch is not None}
    assert sum(lag.last_batch_rows or 0 for lag in batches.values()) in (1000, 1001)
    assert all(lag.last_batch_bytes == 100 * (lag.last_batch_rows or 0)
               for lag in batches.values())
    assert all(lag.last_batch_redeliveries_dropped == 0 for lag in batches.values())
    # the backlog measured when the batch was planned: after the previous one ran
    first_three = [lag.backlog_messages or 0 for lag in lags[:3]]
    assert first_three[0] == 1000 and first_three == sorted(first_three, reverse=True)
    for lag in lags[1:3]:  # what waits = what was published - what the batches read
        assert lag.backlog_messages == 1000 - sum(
            b.last_batch_rows or 0 for n, b in batches.items() if n <= (lag.last_batch or 0))
    assert lags[0].last_batch is None and lags[0].lag_seconds is None  # no batch ran yet
    # behind, the lag is the age of the newest message read (published before the query)
    assert all(lag.lag_seconds is not None and 0 <= lag.lag_seconds < 120
               for lag in batches.values())
    assert all((lag.last_batch_oldest_age_seconds or 0) >= (lag.lag_seconds or 0)
               for lag in batches.values())
    assert all(lag.paused_nsqds == 0 and lag.unreachable_nsqds == 0 for lag in lags)


def fetch_takes_max_bytes() -> bool:
    import inspect

    from nsq_spark.spark._fetch import fetch_stream_partition

    return "max_bytes" in inspect.signature(fetch_stream_partition).parameters


@pytest.mark.skipif(not fetch_takes_max_bytes(),
                    reason="the fetch tasks do not take their byte share yet (issue 24's "
                           "fetch side)")
def test_max_bytes_per_trigger_splits_the_backlog_into_batches(spark, nsq_cluster, tmp_path):
    """The fetch tasks stop at their byte share; the batches of a backlog follow."""
    node = nsq_cluster.nsqds[0]
    bodies = [b"%099d" % i for i in range(1000)]  # 99 bytes each
    http_mpub(node.http_address, "ctl_bytes", bodies)
    df = reader(spark, nsq_cluster, str(tmp_path / "spool"), topic="ctl_bytes",
                maxBytesPerTrigger=20_000, maxInFlight=20)
    q = (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(120), "AvailableNow query did not finish in time"
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert collections.Counter(bytes(r["body"]) for r in rows) == collections.Counter(bodies)
    # 20,000 bytes a batch (202 bodies of 99 bytes), and at most one message over per
    # fetch task (2): what nsqd sent beyond a task's share stays in its Reader for the
    # next batch
    size = len(bodies[0])
    assert len(sizes) >= 4 and all(n * size <= 20_000 + 2 * size for n in sizes), sizes


def test_max_bytes_per_trigger_holds_for_bodies_larger_than_the_cap(spark, nsq_cluster,
                                                                    tmp_path):
    """The issue's case: 2,000 bodies of 5,000 bytes, a cap of 1,000 bytes, 2 partitions.
    Each task's share (500 bytes) is reached by its first message: every batch is at
    most 2 messages (cap + one message per task), where it was 57, 1,513 and 430 before
    RDY followed the byte share. The query runs a few batches and stops; what it did not
    read is back on nsqd, nothing in flight."""
    from sparkutil import channel_counts

    node = nsq_cluster.nsqds[0]
    topic = "ctl_big"
    bodies = [b"%05d" % i + b"x" * 4995 for i in range(2000)]
    for at in range(0, 2000, 500):  # an MPUB within nsqd's 5 MiB --max-body-size
        http_mpub(node.http_address, topic, bodies[at:at + 500])
    df = reader(spark, nsq_cluster, str(tmp_path / "spool"), topic=topic,
                maxBytesPerTrigger=1000, numPartitions=2)
    rows: list[bytes] = []
    sizes: list[int] = []

    def keep(batch, batch_id: int) -> None:
        got = [bytes(r["body"]) for r in batch.select("body").collect()]
        sizes.append(len(got))
        rows.extend(got)

    q = (df.writeStream.foreachBatch(keep).option("checkpointLocation",
                                                  str(tmp_path / "ckpt")).start())
    try:
        wait_for(lambda: len([n for n in sizes if n]) >= 6 or any(n > 2 for n in sizes),
                 120, "six batches with rows")
    finally:
        q.stop()
    assert all(n <= 2 for n in sizes), sizes
    assert len(rows) == len(set(rows)) == sum(sizes)
    # nothing lost: the rest is queued again on nsqd (a cached Reader held none, or gave
    # it back when it was closed)
    wait_for(lambda: channel_counts(node, topic, "ctl")["in_flight"] == 0, 30,
             "nothing in flight after the stop")
    assert channel_counts(node, topic, "ctl")["depth"] == 2000 - len(rows)
