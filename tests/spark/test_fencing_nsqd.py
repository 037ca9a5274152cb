"""Fencing against a real nsqd (issue #21 item 5): a fetch attempt that outlives its
micro-batch -- the driver committed it and deleted its spool while the attempt still
held messages (a losing speculative copy, or any attempt Spark stopped waiting for) --
FINishes nothing and recreates no directory; nsqd still has every message, and the next
batch reads each exactly once.

No Spark session: fetch_stream_partition is called directly, as a Spark task would,
with the driver's markers written and deleted by the Spool as the driver does."""

from __future__ import annotations

import collections
import os

import pytest

pa = pytest.importorskip("pyarrow")

from nsq_spark.spark._fetch import default_reader_factory, fetch_stream_partition  # noqa: E402
from nsq_spark.spark.options import parse_read_options  # noqa: E402
from nsq_spark.spark._spool import Spool, SpoolFenced  # noqa: E402
from nsq_spark.testing import publish, wait_until  # noqa: E402

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]

TOPIC, CHANNEL = "fenced", "c"


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0, msg_timeout="3s")
def test_an_attempt_that_outlives_its_batch_fins_nothing(nsq_cluster, tmp_path):
    published = [b"z-%04d" % i for i in range(500)]
    publish(nsq_cluster.nsqd_http_addresses[0], TOPIC, published)
    opts = parse_read_options({
        "topic": TOPIC, "channel": CHANNEL, "maxInFlight": "200",
        "nsqdTcpAddresses": nsq_cluster.nsqd_tcp_addresses[0], "spoolPath": str(tmp_path),
        "idleTimeout": "1", "maxFetchPeriod": "20"}, streaming=True)
    spool = Spool(str(tmp_path), "q")
    spool.write_query_marker()  # the driver, before it plans the first batch
    marker = spool.write_marker(3)  # partitions() of batch 3
    fins, held = [], []

    def zombie(o):
        reader = default_reader_factory(o)
        get, finish = reader.get_blocks, reader.finish_blocks

        def get_blocks(*args, **kwargs):
            got = get(*args, **kwargs)
            if got and not held:  # messages in hand: now the driver commits batch 3
                held.append(sum(map(len, got)))
                spool.delete_upto(3)
            return got

        def finish_blocks(blocks):
            fins.append(sum(map(len, blocks)))
            finish(blocks)
        reader.get_blocks, reader.finish_blocks = get_blocks, finish_blocks
        return reader

    rows = []
    with pytest.raises(SpoolFenced, match="committed"):
        for rb in fetch_stream_partition(opts, spool, 3, 0, None, zombie, marker=marker):
            rows += rb.column("body").to_pylist()
    assert held and held[0] > 0 and fins == [] and rows == []
    assert not os.path.exists(spool.batch_dir(3)), os.listdir(tmp_path / "q")
    # nsqd has every message back (requeued on close; at worst after msg_timeout 3 s)
    wait_until(lambda: (c := nsq_cluster.nsqds[0].channel_stats(TOPIC, CHANNEL))
               and c["depth"] == 500 and c["in_flight_count"] == 0, 10, "all 500 back")
    # an attempt that starts after the commit does not even connect
    with pytest.raises(SpoolFenced, match="committed"):
        list(fetch_stream_partition(opts, spool, 3, 1, None,
                                    lambda o: pytest.fail("must not connect"), marker=marker))
    # the next batch reads every message once
    marker = spool.write_marker(4)
    got = [b for rb in fetch_stream_partition(opts, spool, 4, 0, None, marker=marker)
           for b in rb.column("body").to_pylist()]
    assert collections.Counter(got) == collections.Counter(published)
    nsq_cluster.wait_drained(TOPIC, CHANNEL)
