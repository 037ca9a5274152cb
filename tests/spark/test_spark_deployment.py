"""Issue #12: what a user meets in a real deployment, against real nsqd / nsqlookupd and a
real local Spark: a new channel of a topic that already has one, misconfiguration that
must fail loudly (misspelled option, unreachable nsqd, lookupd down, HTTP port given as
the TCP port), requeues in fault-free running, and a clean spool after a clean stop.
"""

from __future__ import annotations

import collections
import os
import sys
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import channel_counts, http_mpub  # noqa: E402

from nsq_spark.testing import free_port

pytestmark = [pytest.mark.spark, pytest.mark.nsqd]


def bodies_of(rows) -> list[bytes]:
    return [bytes(r["body"]) for r in rows]


def create_channel(http_address: str, topic: str, channel: str) -> None:
    for path in (f"topic/create?topic={topic}", f"channel/create?topic={topic}&channel={channel}"):
        req = urllib.request.Request(f"http://{http_address}/{path}", data=b"", method="POST")
        urllib.request.urlopen(req, timeout=5).read()


def channel_exists(node, topic: str, channel: str) -> bool:
    return any(c["channel_name"] == channel for t in node.stats(topic).get("topics", [])
               if t["topic_name"] == topic for c in t.get("channels") or [])


# -- a new channel ----------------------------------------------------------------------------


@pytest.mark.parametrize("via", ["lookupd", "nsqd"])
def test_a_new_channel_reads_what_is_published_after_the_query_starts(
        spark, nsq_cluster, tmp_path, via):
    """The topic already has a channel (the normal case): its messages go to that channel
    only, so the query's channel has no depth until it exists. The driver creates it at
    query start; then every message published afterwards is read."""
    topic, channel = f"spark_newch_{via}", "spark"
    node = nsq_cluster.nsqds[0]
    create_channel(node.http_address, topic, "other")
    http_mpub(node.http_address, topic, [b"before-%d" % i for i in range(10)])
    if via == "lookupd":  # wait until lookupd lists the topic's producer
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                p["tcp_port"] == node.tcp_port for p in nsq_cluster.lookupds[0].nodes()
                if topic in p.get("topics", [])):
            time.sleep(0.1)
    r = (spark.readStream.format("nsq").option("topic", topic).option("channel", channel)
         .option("idleTimeout", 0.3).option("spoolPath", str(tmp_path / "spool")))
    if via == "lookupd":
        r = r.option("lookupdHttpAddresses", ",".join(nsq_cluster.lookupd_http_addresses))
    else:
        r = (r.option("nsqdTcpAddresses", node.tcp_address)
             .option("nsqdHttpAddresses", node.http_address))
    q = (r.load().writeStream.format("memory").queryName(f"newch_{via}")
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(processingTime="200 milliseconds").start())
    published = [b"after-%04d" % i for i in range(1000)]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not channel_exists(node, topic, channel):
            assert q.exception() is None, q.exception()
            time.sleep(0.1)
        assert channel_exists(node, topic, channel), "the driver did not create the channel"
        http_mpub(node.http_address, topic, published)
        n = 0
        while time.monotonic() < deadline and n < len(published):
            n = spark.sql(f"select count(*) from newch_{via}").first()[0]
            time.sleep(0.2)
        rows = spark.sql(f"select body from newch_{via}").collect()
    finally:
        q.stop()
    # what was published before the channel existed went to 'other' only
    assert collections.Counter(bodies_of(rows)) == collections.Counter(published)
    # a clean stop leaves no batch spool behind (no batch, no batch marker): only the
    # query's redelivery index, kept for redeliveryWindow past the commit, and its query
    # marker, kept for the query's life (a restart tells a deleted spool by it), and the
    # batches' records' directory, empty
    left = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "spool") for f in fs + [""]]
    for query in os.listdir(tmp_path / "spool"):
        assert sorted(set(os.listdir(tmp_path / "spool" / query)) - {"_started"}) in (
            [], ["_QUERY"], ["_QUERY", "_seen"]), left
        started = tmp_path / "spool" / query / "_started"
        assert not started.exists() or not os.listdir(started), left


# -- misconfiguration fails loudly --------------------------------------------------------------


def test_a_misspelled_option_is_named_at_query_start(spark, tmp_path):
    from pyspark.errors import StreamingQueryException

    q = (spark.readStream.format("nsq").option("topic", "t").option("channel", "c")
         .option("nsqdTcpAddresses", "127.0.0.1:1").option("spoolPath", str(tmp_path))
         .option("maxInFlite", 10).load().writeStream.format("noop").start())
    try:
        with pytest.raises(StreamingQueryException) as err:
            q.awaitTermination(60)
        assert "unknown option 'maxinflite'" in str(err.value)
        assert "did you mean 'maxInFlight'" in str(err.value)
    finally:
        q.stop()
    with pytest.raises(Exception, match="unknown option 'maxmesages'.*'maxMessages'"):
        (spark.read.format("nsq").option("topic", "t").option("channel", "c")
         .option("nsqdTcpAddresses", "127.0.0.1:1").option("maxMesages", 5).load().collect())


def batch_read(spark, **options):
    r = spark.read.format("nsq").option("topic", "spark_unreach").option("channel", "c")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load().collect()


def test_a_batch_read_of_an_unreachable_nsqd_fails_naming_it(spark, nsq_cluster):
    dead = f"127.0.0.1:{free_port()}"
    t = time.monotonic()
    with pytest.raises(Exception, match=f"no nsqd answered at nsqdTcpAddresses.*{dead}"):
        batch_read(spark, nsqdTcpAddresses=dead)
    assert time.monotonic() - t < 30
    node = nsq_cluster.nsqds[0]
    # nsqd's HTTP port given as its TCP port: says so
    with pytest.raises(Exception, match=f"{node.http_address}.*HTTP port instead of its TCP"):
        batch_read(spark, nsqdTcpAddresses=node.http_address)


def test_a_batch_read_with_lookupd_down_or_no_producer_fails(spark, nsq_cluster):
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match=f"no nsqlookupd answered.*{dead}"):
        batch_read(spark, lookupdHttpAddresses=dead)
    with pytest.raises(Exception, match="no nsqd carries topic 'spark_unreach'"):
        batch_read(spark, lookupdHttpAddresses=nsq_cluster.lookupd_http_addresses[0])


def test_available_now_against_an_unreachable_nsqd_fails_naming_it(spark, tmp_path):
    from pyspark.errors import StreamingQueryException

    dead = f"127.0.0.1:{free_port()}"
    q = (spark.readStream.format("nsq").option("topic", "t").option("channel", "c")
         .option("nsqdTcpAddresses", dead).option("spoolPath", str(tmp_path / "spool"))
         .load().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    try:
        with pytest.raises(StreamingQueryException, match=f"ConnectError.*{dead}"):
            q.awaitTermination(60)
    finally:
        q.stop()


# -- no requeue churn --------------------------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1, mem_queue_size=1000)
def test_fault_free_running_requeues_nothing_and_max_attempts_drops_nothing(
        spark, nsq_cluster, tmp_path):
    """Many share boundaries (small read limit, two tasks per batch): nsqd counts (almost)
    no requeue, and with maxAttempts=3 every body arrives and no dead letter is written.
    The backlog waits in nsqd's disk queue before the channel exists: the driver creates
    the channel, and AvailableNow must count what nsqd has yet to copy into it."""
    topic, channel = "spark_churn", "c"
    node = nsq_cluster.nsqds[0]
    published = [b"m-%06d" % i for i in range(20_000)]
    http_mpub(node.http_address, topic, published)
    df = (spark.readStream.format("nsq").option("topic", topic).option("channel", channel)
          .option("nsqdTcpAddresses", node.tcp_address)
          .option("nsqdHttpAddresses", node.http_address)
          .option("maxMessagesPerTrigger", 3001).option("maxInFlight", 1000)
          .option("maxAttempts", 3).option("idleTimeout", 0.5)
          .option("spoolPath", str(tmp_path / "spool")).load())
    q = (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True)
         .start())
    assert q.awaitTermination(150), "AvailableNow query did not finish"
    assert q.exception() is None
    rows = spark.read.parquet(str(tmp_path / "out")).select("body").collect()
    missing = set(published) - set(bodies_of(rows))
    assert not missing, (len(missing), [p["numInputRows"] for p in q.recentProgress],
                         channel_counts(node, topic, channel))
    stats = [c for t in node.stats(topic)["topics"] if t["topic_name"] == topic
             for c in t["channels"] if c["channel_name"] == channel][0]
    assert stats["requeue_count"] < len(published) // 100, stats
    assert channel_counts(node, topic, channel)["depth"] == 0
    assert not (tmp_path / "spool" / "_dead_letter").exists()
