"""``query.stop()`` during a batch: what the fetch tasks held goes back to nsqd at once.

Spark cancels the batch's tasks and kills the Python worker of a task that has not
ended 2-4 s later; nsqd keeps what a killed worker held in flight until its msg_timeout
(60 s here). A fetch task hands Spark what it holds at least every ``HEARTBEAT``
(:mod:`nsq_spark.spark._fetch_task`), so it learns of the cancel and closes its Reader,
which requeues the rest, before the kill. The test stops a query in the middle of a large
batch and asks nsqd: nothing in flight long before the 60 s, no message timed out, and
every message either read by the query (spooled and FINished: the batch is not
committed, its spool stays for a restart) or back in the channel.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import channel_counts, http_mpub  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.nsqd]


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_stopped_query_requeues_what_its_tasks_held(spark, nsq_cluster, tmp_path):
    node = nsq_cluster.nsqds[0]
    topic, channel = "stop_t", "stop_c"

    def source(name: str, **extra):
        r = (spark.readStream.format("nsq").option("topic", name).option("channel", channel)
             .option("nsqdTcpAddresses", node.tcp_address)
             .option("spoolPath", str(tmp_path / f"spool-{name}")))
        for k, v in extra.items():
            r = r.option(k, v)
        return r.load()

    # warm Spark's Python workers up (imports, first connections): a cold task can spend
    # seconds in its first conversion, which is not what this test is about
    http_mpub(node.http_address, "stop_warm", [b"w%d" % i for i in range(100)])
    warm = (source("stop_warm", idleTimeout=0.5).writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "ckpt-warm"))
            .trigger(availableNow=True).start())
    assert warm.awaitTermination(120)
    # a steady stream and a batch that waits for more (idleTimeout 30 s): its tasks hold
    # un-FINished messages and settled rows, and hand Spark nothing for HANDOVER_ROWS
    stop = threading.Event()

    def publish() -> None:
        i = 0
        while not stop.is_set():
            http_mpub(node.http_address, topic, [b"m%07d" % (i + k) for k in range(100)])
            i += 100
            time.sleep(0.05)

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    q = (source(topic, idleTimeout=30, maxFetchPeriod=60).writeStream.format("noop")
         .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        wait_for(lambda: channel_counts(node, topic, channel)["in_flight"] > 0, 120,
                 "the batch fetching")
        time.sleep(3)  # chunks settled (FINished), rows held, new ones in flight
        held = channel_counts(node, topic, channel)["in_flight"]
    finally:
        q.stop()
        stopped = time.monotonic()
        # the producers go on: nsqd keeps sending to the tasks until they are gone, so
        # whatever Spark kills holds messages un-FINished
        time.sleep(6)
        stop.set()
        publisher.join(10)
    # well before nsqd's msg_timeout (60 s): the tasks requeued, nothing timed out
    wait_for(lambda: channel_counts(node, topic, channel)["in_flight"] == 0, 20,
             "nothing in flight after the stop")
    after = time.monotonic() - stopped
    stats = node.channel_stats(topic, channel)
    print(f"in flight before the stop {held}; none {after:.1f} s after it (6 s of them "
          f"publishing); requeued {stats['requeue_count']}, timed out "
          f"{stats['timeout_count']}")
    assert stats["timeout_count"] == 0
