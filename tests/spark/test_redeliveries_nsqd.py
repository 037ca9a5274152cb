"""Redeliveries from a real nsqd are dropped by the fetch tasks, not made rows: FINs lost
with a task that died after spooling come back under their ids in the next micro-batch.

No Spark session: fetch_stream_partition is called directly, as a Spark task would, one
micro-batch after the other on the same spool."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

from nsq_spark.spark._fetch import default_reader_factory, fetch_stream_partition  # noqa: E402
from nsq_spark.spark.options import parse_read_options  # noqa: E402
from nsq_spark.spark._seen import SeenIndex  # noqa: E402
from nsq_spark.spark._spool import Spool  # noqa: E402
from nsq_spark.testing import publish  # noqa: E402

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]


def read_opts(cluster, tmp_path, topic):
    return parse_read_options({
        "topic": topic, "channel": "c", "nsqdTcpAddresses": cluster.nsqd_tcp_addresses[0],
        "maxInFlight": "1000", "spoolPath": str(tmp_path), "idleTimeout": "1",
        "maxFetchPeriod": "30"}, streaming=True)


def fetch(opts, spool, batch, factory=default_reader_factory):
    rows = []
    for rb in fetch_stream_partition(opts, spool, batch, 0, None, factory):
        rows += rb.column("body").to_pylist()
    return rows


def dropped(spool, batch):
    return sum(f.dropped for f in SeenIndex(spool).files() if f.batch == batch)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_fins_lost_with_a_task_come_back_and_are_dropped(nsq_cluster, tmp_path):
    topic = "lost_fin"
    first = [b"a-%04d" % i for i in range(600)]
    publish(nsq_cluster.nsqd_http_addresses[0], topic, first)
    opts = read_opts(nsq_cluster, tmp_path, topic)
    spool = Spool(str(tmp_path), "q")

    def fins_lost(o):  # the task dies after each chunk is durable, before its FIN
        # (nsqd then sends nothing beyond maxInFlight, 1000: all 600 fit)
        reader = default_reader_factory(o)
        reader.finish_blocks = lambda blocks: None
        return reader

    assert sorted(fetch(opts, spool, 1, fins_lost)) == first
    # nsqd sends the 600 again under their ids (requeued when the connection closed)
    later = [b"b-%04d" % i for i in range(100)]
    publish(nsq_cluster.nsqd_http_addresses[0], topic, later)
    assert sorted(fetch(opts, spool, 2)) == later
    assert dropped(spool, 2) == 600
    nsq_cluster.wait_drained(topic, "c")  # the redeliveries were FINished
