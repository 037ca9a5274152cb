"""Issue #21 against a real nsqd and a real local Spark: the loss paths that ordinary
settings and operations opened, one end-to-end query each where a query is needed
(the rest is tested without Spark in test_spark_unit.py and test_fencing_nsqd.py).

* a micro-batch that failed in the sink is run again on restart with the partition
  count it was planned with, even when ``numPartitions`` changed (2 -> 1), and
  ``Trigger.AvailableNow`` after that failed batch still drains everything;
* ``spark.speculation=true`` fails the query before anything is read;
* a spool, or only its batch directories, deleted while the query was stopped fails
  the restart naming the batch and the spool.
"""

from __future__ import annotations

import collections
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import channel_counts, http_mpub  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.nsqd]


def source(spark, node, topic, spool, **extra):
    r = (spark.readStream.format("nsq").option("topic", topic).option("channel", "c")
         .option("nsqdTcpAddresses", node.tcp_address)
         .option("nsqdHttpAddresses", node.http_address)
         .option("idleTimeout", 0.3).option("maxInFlight", 200)
         .option("spoolPath", spool))
    for k, v in extra.items():
        r = r.option(k, v)
    return r.load()


def test_a_failed_batch_rerun_with_fewer_partitions_and_available_now_reads_all(
        spark, nsq_cluster, tmp_path):
    node = nsq_cluster.nsqds[0]
    topic = "spark_rerun"
    published = [b"r-%05d" % i for i in range(4000)]
    http_mpub(node.http_address, topic, published)
    ckpt, spool = str(tmp_path / "ckpt"), str(tmp_path / "spool")
    seen: list[bytes] = []

    def fail_first(df, batch_id):
        df.select("body").collect()  # the batch is read (lazily: only if asked)
        raise RuntimeError("the sink fails batch %d" % batch_id)

    def keep(df, batch_id):
        seen.extend(bytes(r["body"]) for r in df.select("body").collect())

    # run 1: batch 1 is fetched (spooled, FINished on nsqd) by 2 tasks; the sink fails
    df = source(spark, node, topic, spool, numPartitions=2, maxMessagesPerTrigger=1000)
    q = (df.writeStream.foreachBatch(fail_first).option("checkpointLocation", ckpt)
         .trigger(availableNow=True).start())
    with pytest.raises(Exception, match="the sink fails batch"):
        q.awaitTermination(120)
    assert channel_counts(node, topic, "c")["depth"] <= 3000  # batch 1 was FINished
    # run 2 on the checkpoint, now with numPartitions 1: batch 1 again with its 2
    # partitions, then batches until what was there at the start is drained
    df = source(spark, node, topic, spool, numPartitions=1, maxMessagesPerTrigger=1000)
    q = (df.writeStream.foreachBatch(keep).option("checkpointLocation", ckpt)
         .trigger(availableNow=True).start())
    assert q.awaitTermination(120)
    assert q.exception() is None
    lost = set(published) - set(seen)
    assert not lost, f"{len(lost)} of {len(published)} lost, e.g. {sorted(lost)[:3]}"
    assert collections.Counter(seen) == collections.Counter(published)  # none twice
    c = channel_counts(node, topic, "c")
    assert c["depth"] == 0 and c["in_flight"] == 0


def test_speculation_fails_the_query_before_anything_is_read(spark, nsq_cluster, tmp_path):
    """Spark SQL hands ``spark.*`` settings to tasks as local properties; a local property
    set here reaches the query's tasks the same way (the shared session cannot be
    rebuilt with spark.speculation=true)."""
    node = nsq_cluster.nsqds[0]
    topic = "spark_speculation"
    http_mpub(node.http_address, topic, [b"s-%03d" % i for i in range(300)])
    sc = spark.sparkContext
    sc.setLocalProperty("spark.speculation", "true")
    try:
        q = (source(spark, node, topic, str(tmp_path / "spool")).writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    finally:
        sc.setLocalProperty("spark.speculation", None)
    with pytest.raises(Exception) as err:
        q.awaitTermination(120)
    assert "spark.speculation=true is not supported" in str(err.value)
    assert "spark.speculation=false" in str(err.value)
    c = channel_counts(node, topic, "c")
    assert c["depth"] == 300 and c["in_flight"] == 0  # nothing was read, nothing lost


def fail_the_first_batch(spark, node, topic, spool, ckpt):
    """One AvailableNow run whose sink reads its first batch (400 messages FINished into
    the spool) and then fails it: the checkpoint owes that batch."""
    def fail(df, batch_id):
        df.select("body").collect()
        raise RuntimeError("the sink fails batch %d" % batch_id)

    q = (source(spark, node, topic, spool, maxMessagesPerTrigger=400).writeStream
         .foreachBatch(fail).option("checkpointLocation", ckpt)
         .trigger(availableNow=True).start())
    with pytest.raises(Exception, match="the sink fails batch"):
        q.awaitTermination(120)


def test_a_spool_deleted_while_the_query_was_stopped_fails_the_restart(
        spark, nsq_cluster, tmp_path):
    import shutil

    node = nsq_cluster.nsqds[0]
    topic = "spark_rm_spool"
    http_mpub(node.http_address, topic, [b"d-%04d" % i for i in range(600)])
    ckpt, spool = str(tmp_path / "ckpt"), str(tmp_path / "spool")

    fail_the_first_batch(spark, node, topic, spool, ckpt)
    shutil.rmtree(spool)  # the operator's rm -rf while the query is stopped
    q = (source(spark, node, topic, spool).writeStream.format("noop")
         .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    with pytest.raises(Exception) as err:
        q.awaitTermination(120)
    msg = str(err.value)
    assert "SparkSpoolError" in msg and "was deleted while the query was stopped" in msg
    # Spark's batch 0 is the source's micro-batch 1 (its offsets count from 1)
    assert "micro-batch 1 of this source" in msg and '"batch": 1' in msg and spool in msg
    # nothing recreated (Spark asks the source for an initial offset even on a restart;
    # its probe of spoolPath may make the root directory again, and leaves nothing in it)
    assert not os.path.exists(spool) or os.listdir(spool) == []


def test_deleted_batch_directories_fail_the_restart(spark, nsq_cluster, tmp_path):
    """``rm -rf <spool>/*/batch-*`` after a failed batch, the query's marker kept: the
    restart fails naming the batch and the spool, where it used to take the missing
    directory for a batch that never started, fetch new messages and lose the batch's."""
    import glob
    import shutil

    node = nsq_cluster.nsqds[0]
    topic = "spark_rm_batches"
    http_mpub(node.http_address, topic, [b"b-%04d" % i for i in range(600)])
    ckpt, spool = str(tmp_path / "ckpt"), str(tmp_path / "spool")

    fail_the_first_batch(spark, node, topic, spool, ckpt)
    depth = channel_counts(node, topic, "c")["depth"]
    assert depth == 200  # batch 1's 400 were FINished into its spool
    deleted = glob.glob(os.path.join(spool, "*", "batch-*"))
    assert deleted
    for d in deleted:
        shutil.rmtree(d)
    q = (source(spark, node, topic, spool).writeStream.format("noop")
         .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    with pytest.raises(Exception) as err:
        q.awaitTermination(120)
    msg = str(err.value)
    assert "SparkSpoolError" in msg and "micro-batch 1 of this query" in msg and spool in msg
    assert "batch-000000000001" in msg and "is gone" in msg
    c = channel_counts(node, topic, "c")
    assert c["depth"] == depth and c["in_flight"] == 0  # nothing fetched in their place
