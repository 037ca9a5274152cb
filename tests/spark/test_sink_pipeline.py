"""End to end through Spark: NSQ -> Spark -> NSQ -> a second consumer, with no duplicate
and no loss at the end although the first driver is killed after its sink published a
micro-batch and before Spark committed it.

The driver (``pipeline_driver.py``, a process of its own: JVM and Python workers in one
process group) reads topic ``pipe_in`` with the ``nsq`` source and publishes, in
``foreachBatch``, ``out-<body>`` to ``pipe_out`` with ``df.write.format("nsq")`` and
``publishIds``. It holds inside the function after batch 1's write returned; the test
SIGKILLs the whole process group there. The restarted driver (same checkpoint) runs
batch 1 again -- replayed from the source's spool, the same rows in the same partitions
and order -- and publishes it again under the same publish ids (:mod:`nsq_spark.spark.sink`:
the query id, the batch id, the partition, the row, the topic and the body), then the
rest. nsqd holds both copies of batch 1 (the test checks that it does); the second
consumer, a Reader deduplicating by publish id in Redis, hands each message to its
handler once.

Also here, in-process: the stream sink (``writeStream.format("nsq")``) publishing a batch
twice (the commit log refused it the first time), and ``idempotencyKeyColumn``.
"""

from __future__ import annotations

import collections
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import ChildDriver, discovery_problem, http_mpub, read_deduplicated  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.nsqd]



class Driver(ChildDriver):
    """``pipeline_driver.py`` as a child driver."""

    def __init__(self, cfg: dict) -> None:
        super().__init__("pipeline_driver.py", cfg)


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_a_driver_killed_after_its_sink_published_leaves_no_duplicate_downstream(
        spark, nsq_cluster, redis_server, running_reader, tmp_path):
    problem = discovery_problem()  # the child drivers find the source by discovery
    if problem:
        pytest.fail(problem)
    node = nsq_cluster.nsqds[0]
    sent = [b"p-%06d" % i for i in range(8_000)]
    http_mpub(node.http_address, "pipe_in", sent)
    cfg = {"checkpoint": str(tmp_path / "ckpt"), "spool": str(tmp_path / "spool"),
           "workdir": str(tmp_path), "nsqd_tcp": node.tcp_address,
           "nsqd_http": node.http_address, "source": "pipe_in", "channel": "spark",
           "sink": "pipe_out", "max_per_trigger": 2_000}
    t0 = time.monotonic()
    first = Driver({**cfg, "hold_after": 1})
    try:
        published = first.wait_line("PUBLISHED 1 ", 240)
    finally:
        first.kill()  # batch 1 published, not committed
    killed_at = time.monotonic() - t0
    before = node.stats("pipe_out")["topics"][0]["message_count"]
    second = Driver(cfg)
    try:
        assert second.proc.wait(timeout=240) == 0, second.output()
    finally:
        second.kill()
    assert "DONE" in second.lines, second.output()
    replayed = [line for line in second.lines if line.startswith("PUBLISHED 1 ")]
    assert replayed == [published], (published, second.lines)  # batch 1 ran again, whole
    out_topic = node.stats("pipe_out")["topics"][0]
    copies = out_topic["message_count"] - len(sent)
    assert copies == int(published.split()[2]) and before >= copies > 0, \
        (out_topic["message_count"], before, published)

    handled, dropped = read_deduplicated(running_reader, nsq_cluster, "pipe_out",
                                         redis_server.url, len(sent))
    counts = collections.Counter(handled)
    expected = {b"out-" + b for b in sent}
    assert not set(expected) - set(counts), "lost downstream"
    assert not {b: n for b, n in counts.items() if n > 1}, "duplicates downstream"
    assert set(counts) == expected and dropped == copies
    print(f"{len(sent)} in; driver killed after batch 1 ({published}) at {killed_at:.0f} s; "
          f"{out_topic['message_count']} published to pipe_out ({copies} copies); "
          f"downstream {len(handled)} handled once each, {dropped} copies dropped; "
          f"{time.monotonic() - t0:.0f} s in all")


def message_count(cluster, topic: str) -> int:
    return sum(t["message_count"] for n in cluster.nsqds
               for t in n.stats(topic).get("topics") or [] if t["topic_name"] == topic)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_the_stream_sink_republishes_a_batch_run_again_under_the_same_ids(
        spark, nsq_cluster, redis_server, running_reader, tmp_path):
    """``writeStream.format("nsq")``: the state a crash between the sink's commit and
    Spark's commit log leaves (batch 0 in the offsets log, not in the commit log) is made
    by removing the commit log's entry; the restart runs batch 0 again, from the same
    files, and the stream writer's tasks stamp the same ids."""
    node = nsq_cluster.nsqds[0]
    src = tmp_path / "in"
    src.mkdir()
    lines = [f"line-{f}-{i}" for f in range(3) for i in range(400)]
    for f in range(3):
        (src / f"part-{f}.txt").write_text("\n".join(lines[f * 400:(f + 1) * 400]) + "\n")
    ckpt = tmp_path / "ckpt"

    def run() -> None:
        q = (spark.readStream.text(str(src)).withColumnRenamed("value", "body")
             .writeStream.format("nsq").option("topic", "st_out")
             .option("nsqdTcpAddresses", node.tcp_address).option("publishIds", "true")
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        assert q.awaitTermination(120) and q.exception() is None

    run()
    assert message_count(nsq_cluster, "st_out") == len(lines)
    for name in os.listdir(ckpt / "commits"):  # batch 0 "published, not committed"
        os.remove(ckpt / "commits" / name)
    run()
    assert message_count(nsq_cluster, "st_out") == 2 * len(lines)  # nsqd has both copies
    handled, dropped = read_deduplicated(running_reader, nsq_cluster, "st_out",
                                         redis_server.url, len(lines))
    assert sorted(handled) == sorted(line.encode() for line in lines)
    assert dropped == len(lines)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_the_key_column_makes_two_jobs_one_message_and_a_plain_write_a_new_one(
        spark, nsq_cluster, redis_server, running_reader, tmp_path):
    node = nsq_cluster.nsqds[0]
    rows = [(f"order-{i}", f"o{i}".encode()) for i in range(500)]
    df = spark.createDataFrame(rows, "key string, body binary").repartition(3)

    def write(**options: str) -> None:
        w = (df.write.format("nsq").option("topic", "key_out")
             .option("nsqdTcpAddresses", node.tcp_address))
        for k, v in options.items():
            w = w.option(k, v)
        w.mode("append").save()

    write(idempotencyKeyColumn="key")
    write(idempotencyKeyColumn="key")  # a second job: the same keys, the same ids
    write(publishIds="true")  # no key: this write's own ids, new messages
    assert message_count(nsq_cluster, "key_out") == 3 * len(rows)
    handled, dropped = read_deduplicated(running_reader, nsq_cluster, "key_out",
                                         redis_server.url, 2 * len(rows))
    assert collections.Counter(handled) == collections.Counter(
        [b for _, b in rows] * 2)
    assert dropped == len(rows)
