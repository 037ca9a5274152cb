"""The ``nsq`` Spark source and sink against real nsqd / nsqlookupd and a real local Spark.

One SparkSession (local[2]) for all tests (conftest). Bodies are published with nsqd's
HTTP /mpub, so the source is tested independently of our producer; the sink test reads
back with the source.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import DISCOVERY_FIX, channel_counts, discovery_problem, http_mpub, spark_env  # noqa: E402

pytestmark = [pytest.mark.spark]

HERE = os.path.dirname(os.path.abspath(__file__))


def bodies_of(rows) -> list[bytes]:
    return [bytes(r["body"]) for r in rows]


def stream_reader(spark, cluster, topic, channel, spool, **extra):
    r = (spark.readStream.format("nsq").option("topic", topic).option("channel", channel)
         .option("lookupdHttpAddresses", ",".join(cluster.lookupd_http_addresses))
         .option("numPartitions", 2).option("idleTimeout", 0.3)
         .option("spoolPath", spool))
    for k, v in extra.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(df, checkpoint, fmt="parquet", path=None, timeout=120):
    w = df.writeStream.format(fmt).option("checkpointLocation", checkpoint)
    if path:
        w = w.option("path", path)
    q = w.trigger(availableNow=True).start()
    assert q.awaitTermination(timeout), "AvailableNow query did not finish in time"
    return q


# -- bad options: fail at query start, naming the option ---------------------------------


@pytest.mark.parametrize("opts, name", [
    ({"channel": "c", "nsqdTcpAddresses": "127.0.0.1:4150", "spoolPath": "/tmp/s"}, "topic"),
    ({"topic": "t", "nsqdTcpAddresses": "127.0.0.1:4150", "spoolPath": "/tmp/s"}, "channel"),
    ({"topic": "t", "channel": "c", "nsqdTcpAddresses": "127.0.0.1:4150"}, "spoolPath"),
    ({"topic": "t", "channel": "c", "spoolPath": "/tmp/s"}, "nsqdTcpAddresses"),
    ({"topic": "t", "channel": "c", "spoolPath": "/tmp/s", "nsqdTcpAddresses": "127.0.0.1:1",
      "lookupdHttpAddresses": "127.0.0.1:2"}, "lookupdHttpAddresses"),
    ({"topic": "t", "channel": "c", "spoolPath": "/tmp/s", "nsqdTcpAddresses": "127.0.0.1:1",
      "maxInFlight": "lots"}, "maxInFlight"),
    ({"topic": "t", "channel": "c", "spoolPath": "/tmp/s", "nsqdTcpAddresses": "127.0.0.1:1",
      "MAXMESSAGESPERTRIGGER": "0"}, "maxMessagesPerTrigger"),
])
def test_bad_stream_options_fail_at_start(spark, opts, name):
    from pyspark.errors import StreamingQueryException

    q = spark.readStream.format("nsq").options(**opts).load().writeStream.format("noop").start()
    try:
        with pytest.raises(StreamingQueryException) as err:
            q.awaitTermination(60)
        assert "NSQOptionError" in str(err.value) and f"'{name}'" in str(err.value)
        assert not q.isActive
    finally:
        q.stop()


def test_bad_batch_and_sink_options(spark):
    with pytest.raises(Exception, match="option 'numPartitions'"):
        (spark.read.format("nsq").option("topic", "t").option("channel", "c")
         .option("nsqdTcpAddresses", "127.0.0.1:1").option("numPartitions", "x").load()
         .collect())
    df = spark.createDataFrame([("a",)], "body string")
    with pytest.raises(Exception, match="NSQOptionError.*'nsqdTcpAddresses'"):
        df.write.format("nsq").option("topic", "t").mode("append").save()


# -- streaming ---------------------------------------------------------------------------


@pytest.mark.nsqd
@pytest.mark.nsq_cluster(nsqd=2, lookupd=1)
def test_stream_available_now_reads_everything_once(spark, nsq_cluster, tmp_path):
    topic, channel = "spark_an", "sink"
    published = []
    for i, http in enumerate(nsq_cluster.nsqd_http_addresses):
        bodies = [b"n%d-%06d" % (i, j) for j in range(3000)]
        http_mpub(http, topic, bodies)
        published += bodies
    df = stream_reader(spark, nsq_cluster, topic, channel, str(tmp_path / "spool"),
                       maxMessagesPerTrigger=2500, maxInFlight=300)
    q = run_available_now(df, str(tmp_path / "ckpt"), path=str(tmp_path / "out"))
    assert q.exception() is None
    batches = [p for p in q.recentProgress if p["numInputRows"]]
    assert len(batches) >= 3  # the read limit split the 6000 messages
    # the read limit is a target: a task spools what nsqd sent before its lowered RDY
    # took effect rather than requeue it, at most maxInFlight per task (2 tasks)
    sizes = [p["numInputRows"] for p in q.recentProgress]
    assert all(n <= 2500 + 2 * 300 for n in sizes), sizes
    out = spark.read.parquet(str(tmp_path / "out"))
    rows = out.collect()
    assert collections.Counter(bodies_of(rows)) == collections.Counter(published)
    assert {r["topic"] for r in rows} == {topic} and {r["channel"] for r in rows} == {channel}
    assert {r["nsqd_address"] for r in rows} == set(nsq_cluster.nsqd_tcp_addresses)
    assert all(len(r["id"]) == 16 and r["attempts"] >= 1 for r in rows)
    for node in nsq_cluster.nsqds:  # everything FINished
        c = channel_counts(node, topic, channel)
        assert c["depth"] == 0 and c["in_flight"] == 0
    # the spool of committed batches is gone, the last one's too (Spark asks for the next
    # batch only after committing the last); what is left is the redelivery index and
    # the query marker (kept for the query's life: a deleted spool is noticed by it), and
    # the batches' records' directory, empty (kept too: one fsync less per batch)
    (query,) = os.listdir(tmp_path / "spool")
    assert sorted(os.listdir(tmp_path / "spool" / query)) == ["_QUERY", "_seen", "_started"]
    assert os.listdir(tmp_path / "spool" / query / "_started") == []
    assert sum(int(n.split("-n")[1].split("-")[0])
               for n in os.listdir(tmp_path / "spool" / query / "_seen")) == 6000


@pytest.mark.nsqd
def test_stream_with_nsqd_addresses_and_new_messages(spark, nsq_cluster, tmp_path):
    """A running query (processing-time trigger) picks up messages published later."""
    topic, channel = "spark_live", "c1"
    node = nsq_cluster.nsqds[0]
    http_mpub(node.http_address, topic, [b"early-%d" % i for i in range(500)])
    df = (spark.readStream.format("nsq").option("topic", topic).option("channel", channel)
          .option("nsqdTcpAddresses", node.tcp_address)
          .option("nsqdHttpAddresses", node.http_address)
          .option("idleTimeout", 0.3).option("spoolPath", str(tmp_path / "spool")).load())
    q = (df.writeStream.format("memory").queryName("nsq_live")
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.monotonic() + 60
        late = [b"late-%d" % i for i in range(700)]
        published_late = False
        while time.monotonic() < deadline:
            n = spark.sql("select count(*) from nsq_live").first()[0]
            if n >= 500 and not published_late:
                http_mpub(node.http_address, topic, late)
                published_late = True
            if n >= 1200:
                break
            time.sleep(0.2)
        rows = spark.sql("select body from nsq_live").collect()
        progress = q.recentProgress
    finally:
        q.stop()
    expected = [b"early-%d" % i for i in range(500)] + late
    assert collections.Counter(bodies_of(rows)) == collections.Counter(expected)
    # the backlog is in the progress: the latest offset reported by the source
    sources = [p["sources"][0] for p in progress]
    print(sources[-1])
    reports = [json.loads(s["latestOffset"]) for s in sources if s.get("latestOffset")]
    assert reports, sources[-1]
    assert all(r["topic"] == topic and r["channel"] == channel for r in reports)
    backlog = [r["backlog"] for r in reports]
    assert all(b["nsqds"] == 1 and b["nsqdsAnswered"] == 1 for b in backlog)
    assert max(b["depth"] + b["inFlight"] for b in backlog) > 0  # it saw the messages
    assert all(r["redeliveriesDropped"] == 0 for r in reports)


# -- batch read ------------------------------------------------------------------------------


@pytest.mark.nsqd
def test_batch_read_consumes_up_to_max_messages(spark, nsq_cluster):
    topic, channel = "spark_batch", "b"
    node = nsq_cluster.nsqds[0]
    published = [b"b-%05d" % i for i in range(1000)]
    http_mpub(node.http_address, topic, published)

    def read(max_messages):
        return (spark.read.format("nsq").option("topic", topic).option("channel", channel)
                .option("nsqdTcpAddresses", node.tcp_address).option("idleTimeout", 0.5)
                .option("maxMessages", max_messages).load().collect())

    first = read(600)
    assert len(first) == 600
    second = read(5000)  # the rest, then idle
    assert collections.Counter(bodies_of(first + second)) == collections.Counter(published)
    assert channel_counts(node, topic, channel)["depth"] == 0


@pytest.mark.nsqd
def test_batch_fetch_idle_timeout_counts_from_subscription(nsq_cluster):
    """idleTimeout is "no message while subscribed": a slow connect does not end a batch
    read's fetch. nsqd is frozen (SIGSTOP) for a second after the fetch starts, so
    connecting takes longer than idleTimeout. (The fetch task itself, without Spark: in a
    Spark job the driver's /stats call would wait for nsqd first.)"""
    from nsq_spark.spark._fetch import fetch_batch_partition
    from nsq_spark.spark.options import parse_read_options

    node = nsq_cluster.nsqds[0]
    published = [b"i-%03d" % i for i in range(200)]
    http_mpub(node.http_address, "spark_idle", published)
    opts = parse_read_options({"topic": "spark_idle", "channel": "c", "idleTimeout": "0.2",
                               "nsqdTcpAddresses": node.tcp_address}, streaming=False)
    nsq_cluster.stop(0)
    resume = threading.Timer(1.0, nsq_cluster.resume, args=(0,))
    resume.start()
    try:
        batches = list(fetch_batch_partition(opts, share=len(published)))
    finally:
        resume.join()
    got = [b for batch in batches for b in batch.column("body").to_pylist()]
    assert collections.Counter(got) == collections.Counter(published)


@pytest.mark.nsqd
@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_batch_read_with_compression(spark, nsq_cluster, compression):
    node = nsq_cluster.nsqds[0]
    published = [b"z-%04d" % i * 10 for i in range(300)]
    http_mpub(node.http_address, "spark_" + compression, published)
    rows = (spark.read.format("nsq").option("topic", "spark_" + compression)
            .option("channel", "c").option("nsqdTcpAddresses", node.tcp_address)
            .option(compression, "true").option("idleTimeout", 0.5).load().collect())
    assert collections.Counter(bodies_of(rows)) == collections.Counter(published)


# -- sink --------------------------------------------------------------------------------------


@pytest.mark.nsqd
def test_sink_round_trip(spark, nsq_cluster, tmp_path):
    topic, channel = "spark_sink", "back"
    node = nsq_cluster.nsqds[0]
    bodies = [b"s-%05d" % i for i in range(5000)] + [b"dup"] * 3 + [bytes(range(256))]
    df = spark.createDataFrame([(b,) for b in bodies], "body binary").repartition(3)
    (df.write.format("nsq").option("topic", topic).option("nsqdTcpAddresses", node.tcp_address)
     .option("batchSize", 700).mode("append").save())
    back = (spark.read.format("nsq").option("topic", topic).option("channel", channel)
            .option("nsqdTcpAddresses", node.tcp_address).option("idleTimeout", 0.5)
            .option("maxMessages", 10000).load().collect())
    assert collections.Counter(bodies_of(back)) == collections.Counter(bodies)


@pytest.mark.nsqd
def test_sink_topic_column_string_bodies_and_defer(spark, nsq_cluster, tmp_path):
    node = nsq_cluster.nsqds[0]
    rows = [("a-%d" % i, "spark_route_a" if i % 2 else None, None) for i in range(200)]
    rows += [("later", "spark_route_b", 200)]
    df = spark.createDataFrame(rows, "body string, topic string, defer_ms int")
    (df.write.format("nsq").option("topic", "spark_route_b")
     .option("nsqdTcpAddresses", node.tcp_address).mode("append").save())

    def drain(topic):
        return (spark.read.format("nsq").option("topic", topic).option("channel", "x")
                .option("nsqdTcpAddresses", node.tcp_address).option("idleTimeout", 1.0)
                .option("maxFetchPeriod", 10).load().collect())

    a, b = drain("spark_route_a"), bodies_of(drain("spark_route_b"))
    assert sorted(bodies_of(a)) == sorted(b"a-%d" % i for i in range(1, 200, 2))
    # the DPUB'd one comes when nsqd's deferred-queue scan gets to it (a new nsqd starts
    # its scan workers after up to 5 s)
    deadline = time.monotonic() + 20
    while b"later" not in b and time.monotonic() < deadline:
        b += bodies_of(drain("spark_route_b"))
    assert sorted(b) == sorted([b"a-%d" % i for i in range(0, 200, 2)] + [b"later"])


@pytest.mark.nsqd
def test_stream_sink(spark, nsq_cluster, tmp_path):
    """NSQ -> transform -> NSQ with writeStream.format("nsq")."""
    node = nsq_cluster.nsqds[0]
    http_mpub(node.http_address, "spark_in", [b"x%d" % i for i in range(300)])
    src = (spark.readStream.format("nsq").option("topic", "spark_in").option("channel", "t")
           .option("nsqdTcpAddresses", node.tcp_address)
           .option("nsqdHttpAddresses", node.http_address)
           .option("idleTimeout", 0.3).option("spoolPath", str(tmp_path / "spool")).load())
    from pyspark.sql import functions as F

    out = src.select(F.concat(F.lit(b"out-"), F.col("body")).alias("body"))
    q = (out.writeStream.format("nsq").option("topic", "spark_out")
         .option("nsqdTcpAddresses", node.tcp_address)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    assert q.awaitTermination(120)
    back = (spark.read.format("nsq").option("topic", "spark_out").option("channel", "t")
            .option("nsqdTcpAddresses", node.tcp_address).option("idleTimeout", 0.5)
            .load().collect())
    assert sorted(bodies_of(back)) == sorted(b"out-x%d" % i for i in range(300))


# -- discovery ---------------------------------------------------------------------------------


@pytest.mark.nsqd
def test_discovery_in_fresh_process(nsq_cluster, tmp_path):
    """``spark.readStream.format("nsq")`` in a new process with no register call."""
    node = nsq_cluster.nsqds[0]
    http_mpub(node.http_address, "spark_disc", [b"d%d" % i for i in range(50)])
    script = f"""
import sys
sys.path.insert(0, {HERE!r})
from sparkutil import build_session
spark = build_session("discovery")
df = (spark.readStream.format("nsq").option("topic", "spark_disc").option("channel", "c")
      .option("nsqdTcpAddresses", {node.tcp_address!r})
      .option("nsqdHttpAddresses", {node.http_address!r})
      .option("idleTimeout", 0.3).option("spoolPath", {str(tmp_path / 'spool')!r}).load())
q = (df.writeStream.format("memory").queryName("disc")
     .option("checkpointLocation", {str(tmp_path / 'ckpt')!r}).trigger(availableNow=True).start())
q.awaitTermination(120)
print("COUNT", spark.sql("select count(distinct body) from disc").first()[0])
"""
    problem = discovery_problem()
    if problem:
        pytest.fail(problem)
    env = {**os.environ, **spark_env()}  # as a user's: nothing added to PYTHONPATH
    with tempfile.TemporaryDirectory() as cwd:  # not the repo root: no accidental import
        proc = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=180)
    assert "COUNT 50" in proc.stdout, (f"{proc.stdout[-2000:]}{proc.stderr[:6000]}\n"
                                       f"If the format did not resolve: {DISCOVERY_FIX}")


# -- dedup option --------------------------------------------------------------------------


@pytest.mark.nsqd
@pytest.mark.dedup
def test_dedup_option_drops_redeliveries_seen_before(spark, nsq_cluster, redis_server,
                                                     tmp_path):
    """Messages whose id the shared store has seen are FINished and not emitted."""
    from nsq_spark.dedup import from_spec
    from nsq_spark.reader import Reader

    node = nsq_cluster.nsqds[0]
    topic, channel = "spark_dedup", "d"
    spec = f"{redis_server.url}?ttl=600&prefix=spark-test-{os.getpid()}"
    published = [b"u-%03d" % i for i in range(200)]
    http_mpub(node.http_address, topic, published)
    # another consumer of the channel had handled 50 of them (their ids are in the store)
    # and then lost its connection before FIN: nsqd redelivers them with the same ids
    store = from_spec(spec)
    with Reader(topic, channel, nsqd_tcp_addresses=[node.tcp_address], max_in_flight=50,
                max_tries=0) as r:
        seen: list = []
        deadline = time.monotonic() + 20
        while len(seen) < 50 and time.monotonic() < deadline:
            seen += r.get_batch(50 - len(seen), timeout=1)
        assert len(seen) == 50
        for m in seen:
            assert store.check_and_set(m.id) is False
        r.requeue(seen, delay_ms=0)
    df = (spark.readStream.format("nsq").option("topic", topic).option("channel", channel)
          .option("nsqdTcpAddresses", node.tcp_address)
          .option("nsqdHttpAddresses", node.http_address)
          .option("idleTimeout", 0.5).option("dedup", spec)
          .option("spoolPath", str(tmp_path / "spool")).load())
    q = run_available_now(df, str(tmp_path / "ckpt"), path=str(tmp_path / "out"))
    assert q.exception() is None
    got = bodies_of(spark.read.parquet(str(tmp_path / "out")).collect())
    skipped = {m.body for m in seen}
    assert collections.Counter(got) == collections.Counter(
        b for b in published if b not in skipped)
    c = channel_counts(node, topic, channel)
    assert c["depth"] == 0 and c["in_flight"] == 0  # the duplicates were FINished too
    # what was emitted is now marked: a redelivery of it would be dropped
    rows = spark.read.parquet(str(tmp_path / "out")).select("id").collect()
    assert all(store.check_and_set(r["id"]) for r in rows)
