"""A channel paused with the admin client, as a real Spark streaming query sees it: no
batch for what waits there, the pause in the query's progress (``pausedNsqds`` and the
``backlog.paused`` entry naming the nsqd), and the messages read once it is unpaused."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import http_mpub  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.nsqd]


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.timeout(240)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_a_paused_channel_is_reported_in_the_progress_not_read_as_empty(spark, nsq_cluster,
                                                                         tmp_path):
    from nsq_spark.admin import NsqdClient
    from nsq_spark.spark.progress import source_lags

    topic, channel = "adm_spark", "sp"
    node = nsq_cluster.nsqds[0]
    nsqd = NsqdClient(node.http_address)
    nsqd.create_topic(topic)
    nsqd.create_channel(topic, channel)
    nsqd.pause_channel(topic, channel)
    http_mpub(node.http_address, topic, [b"p%d" % i for i in range(50)])
    nsq_cluster.wait_registered(0)

    # an idle query's progress comes every noDataProgressEventInterval (10 s by default)
    old = spark.conf.get("spark.sql.streaming.noDataProgressEventInterval")
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "500ms")
    df = (spark.readStream.format("nsq").option("topic", topic).option("channel", channel)
          .option("lookupdHttpAddresses", nsq_cluster.lookupd_http_addresses[0])
          .option("idleTimeout", 0.3).option("spoolPath", str(tmp_path / "spool")).load())
    q = (df.writeStream.format("memory").queryName("adm_paused")
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(processingTime="300 milliseconds").start())

    def paused_progress() -> Any:
        for progress in q.recentProgress:
            for lag in source_lags(progress.json):
                if lag.paused_nsqds:
                    return progress
        return None

    try:
        progress = wait_for(paused_progress, 120, "a progress that reports the pause")
        latest = json.loads(progress.sources[0].latestOffset)
        assert latest["backlog"]["paused"] == [
            {"nsqd": node.http_address, "paused": "channel", "depth": 50}]
        assert latest["backlog"]["fetchable"] == 0
        assert spark.sql("select count(*) from adm_paused").first()[0] == 0

        nsqd.unpause_channel(topic, channel)
        wait_for(lambda: spark.sql("select count(*) from adm_paused").first()[0] == 50, 120,
                 "the 50 messages read after unpause")
        assert q.exception() is None
    finally:
        q.stop()
        spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", old)
        nsqd.close()
    last = source_lags(q.lastProgress)
    assert last and last[0].paused_nsqds == 0
