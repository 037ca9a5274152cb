"""Smoke test: the Spark source (Trigger.AvailableNow) against nsqd in containers."""

from __future__ import annotations

import collections

import pytest

from sparkutil import channel_counts, http_mpub

pytestmark = [pytest.mark.nsqd, pytest.mark.spark]


@pytest.mark.nsq_cluster(nsqd=2, lookupd=1)
def test_available_now_drains_two_nsqd_containers_through_lookupd(spark, docker_nsq_cluster,
                                                                   spool_dir, tmp_path):
    cluster = docker_nsq_cluster
    topic, channel = "docker_spark", "spark"
    published = []
    for i, http in enumerate(cluster.nsqd_http_addresses):
        bodies = [b"s%d-%04d" % (i, j) for j in range(500)]
        http_mpub(http, topic, bodies)
        published += bodies
    df = (spark.readStream.format("nsq").option("topic", topic).option("channel", channel)
          .option("lookupdHttpAddresses", ",".join(cluster.lookupd_http_addresses))
          .option("numPartitions", 1).option("idleTimeout", 0.3)
          .option("spoolPath", spool_dir).load())
    q = (df.writeStream.format("memory").queryName("docker_spark")
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(120), "AvailableNow query did not finish in 120 s"
        assert q.exception() is None
    finally:
        q.stop()
    rows = spark.sql("select body, nsqd_address from docker_spark").collect()
    assert collections.Counter(bytes(r["body"]) for r in rows) == collections.Counter(published)
    assert {r["nsqd_address"] for r in rows} == set(cluster.nsqd_tcp_addresses)
    for node in cluster.nsqds:  # everything FINished
        counts = channel_counts(node, topic, channel)
        assert counts["depth"] == 0 and counts["in_flight"] == 0
