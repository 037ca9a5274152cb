"""Copies of one publish through a real local Spark: a topic replicated on three nsqds
(``Producer(replicas=2)``: every message on two of them, with one publish id), read by
three fetch tasks per micro-batch, each subscribed to all three nsqds. Every publish is
one row -- none lost, none twice -- across a batch that failed in the sink and was run
again from the checkpoint (which decides the same rows), and every copy is FINished."""

from __future__ import annotations

import collections
import os
import sys

import pytest

from nsq_spark._publish.producer import Producer
from nsq_spark.testing import wait_until

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import channel_counts  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.nsqd, pytest.mark.timeout(300)]


def publish(addresses: list[str], topic: str, bodies: list[bytes]) -> None:
    with Producer(addresses, replicas=2) as p:
        for at in range(0, len(bodies), 50):  # one MPUB is one placement on two nsqds
            p.mpublish(topic, bodies[at:at + 50])
        assert p.stats()["under_replicated"] == 0


def rows_of(df) -> list[tuple[bytes, bytes]]:
    return [(bytes(r["body"]), bytes(r["publish_id"]))
            for r in df.select("body", "publish_id").collect()]


@pytest.mark.nsq_cluster(nsqd=3, lookupd=1)
def test_a_replicated_topic_gives_one_row_per_publish_across_a_failed_and_rerun_batch(
        spark, nsq_cluster, tmp_path):
    topic = "spark_copies"
    addresses = nsq_cluster.nsqd_tcp_addresses
    first = [b"c-%05d" % i for i in range(3000)]
    publish(addresses, topic, first)
    ckpt, spool = str(tmp_path / "ckpt"), str(tmp_path / "spool")

    def source():
        return (spark.readStream.format("nsq").option("topic", topic).option("channel", "c")
                .option("lookupdHttpAddresses", ",".join(nsq_cluster.lookupd_http_addresses))
                .option("numPartitions", 3).option("maxInFlight", 200)
                .option("maxMessagesPerTrigger", 1500).option("idleTimeout", 0.3)
                .option("spoolPath", spool).load())

    rows: dict[int, list[tuple[bytes, bytes]]] = {}
    failed: dict[int, list[tuple[bytes, bytes]]] = {}

    def fail_second(df, batch_id):
        got = rows_of(df)
        if len(rows) == 1:  # the query's second batch: read, then the sink fails
            failed[batch_id] = got
            raise RuntimeError("the sink fails batch %d" % batch_id)
        rows[batch_id] = got

    q = (source().writeStream.foreachBatch(fail_second).option("checkpointLocation", ckpt)
         .trigger(availableNow=True).start())
    with pytest.raises(Exception, match="the sink fails batch"):
        q.awaitTermination(120)
    assert len(failed) == 1 and len(rows) == 1
    second = [b"d-%05d" % i for i in range(1000)]
    publish(addresses, topic, second)  # while the query is stopped

    def keep(df, batch_id):
        rows[batch_id] = rows_of(df)

    def drained() -> bool:
        return all(sum(channel_counts(n, topic, "c")[k] for k in ("depth", "in_flight",
                                                                  "deferred")) == 0
                   for n in nsq_cluster.nsqds)

    q = (source().writeStream.foreachBatch(keep).option("checkpointLocation", ckpt)
         .trigger(processingTime="200 milliseconds").start())
    quiet = []

    def idle() -> bool:
        # every copy taken (FINished: nothing in flight), no batch running, and the
        # failed batch run again; twice in a row
        now = (drained() and not q.status["isTriggerActive"]
               and failed.keys() <= rows.keys())
        quiet[:] = quiet[-1:] + [now]
        return quiet == [True, True]

    try:
        wait_until(idle, 150, "every copy to be taken and no batch to run", interval=0.3)
        assert q.exception() is None
    finally:
        q.stop()
    (batch, got), = failed.items()
    assert sorted(rows[batch]) == sorted(got)  # the batch run again: the same rows
    everything = [r for b in rows.values() for r in b]
    by_id = collections.Counter(pid for _, pid in everything)
    twice = [p for p, n in by_id.items() if n > 1]
    assert not twice, f"{len(twice)} publishes are two rows or more"
    bodies = collections.Counter(body for body, _ in everything)
    lost = set(first + second) - set(bodies)
    assert not lost, f"{len(lost)} of {len(first + second)} lost, e.g. {sorted(lost)[:3]}"
    assert len(everything) == len(by_id) == 4000
    assert len([b for b in rows.values() if b]) >= 3  # copies across batches too
    assert drained()  # every copy was FINished: nothing left, nothing coming back
