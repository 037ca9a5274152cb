"""The executor's Reader cache against a real nsqd: the next task of a partition reuses
the connected Reader (no connect, no SUB), nothing is requeued between the batches, and a
Reader closed from the cache leaves nsqd with no client and nothing in flight.

No Spark session: fetch_stream_partition is called directly, as Spark tasks would in one
reused Python worker."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

from nsq_spark.spark._fetch import fetch_stream_partition, observe_timings  # noqa: E402
from nsq_spark.spark.options import parse_read_options  # noqa: E402
from nsq_spark.spark._reader_cache import readers  # noqa: E402
from nsq_spark.spark._spool import Spool  # noqa: E402
from nsq_spark.testing import publish, wait_until  # noqa: E402

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(60)]

T, C = "cached_t", "cached_c"


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_the_next_batch_reuses_the_connected_reader(nsq_cluster, tmp_path):
    sent = [b"cached-%d" % i for i in range(30)]
    publish(nsq_cluster.nsqd_http_addresses[0], T, sent)
    opts = parse_read_options({
        "topic": T, "channel": C, "nsqdTcpAddresses": nsq_cluster.nsqd_tcp_addresses[0],
        "maxInFlight": "100", "spoolPath": str(tmp_path), "idleTimeout": "1",
        "maxFetchPeriod": "20"}, streaming=True)
    spool = Spool(str(tmp_path), "q")
    timings: list[dict[str, float]] = []
    stop = observe_timings(timings.append)
    got: list[bytes] = []
    try:
        for batch, share in ((1, 10), (2, 10), (3, 10)):
            got += [b for rb in fetch_stream_partition(opts, spool, batch, 0, share)
                    for b in rb.column("body").to_pylist()]
    finally:
        stop()
    assert sorted(got) == sorted(sent) and len(got) == len(set(got))
    assert [t["reused"] for t in timings] == [0, 1, 1]
    c = nsq_cluster.nsqds[0].channel_stats(T, C)
    assert len(c["clients"]) == 1  # one connection for the three batches, kept
    assert c["requeue_count"] == 0 and c["in_flight_count"] == 0
    readers().close_all()
    wait_until(lambda: not nsq_cluster.nsqds[0].channel_stats(T, C)["clients"], 10,
               "the cached Reader closed")


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0, msg_timeout="4s")
def test_the_idle_timeout_is_bounded_by_the_msg_timeout_nsqd_negotiated(nsq_cluster,
                                                                       tmp_path):
    """An nsqd started with --msg-timeout=4s answers IDENTIFY with 4 s, whatever the options
    assumed (nsqd's default 60 s, so readerCacheIdleTimeout=20 is accepted): the Reader is
    kept idle for at most 2 s, half of what nsqd negotiated, and its held messages go back
    before nsqd would time them out."""
    publish(nsq_cluster.nsqd_http_addresses[0], "short_t", [b"s-%d" % i for i in range(5)])
    opts = parse_read_options({
        "topic": "short_t", "channel": C, "nsqdTcpAddresses":
        nsq_cluster.nsqd_tcp_addresses[0], "spoolPath": str(tmp_path), "idleTimeout": "1",
        "readerCacheIdleTimeout": "20"}, streaming=True)
    assert opts.reader_cache_idle_timeout == 20.0
    got = [b for rb in fetch_stream_partition(opts, Spool(str(tmp_path), "q"), 1, 0, 5)
           for b in rb.column("body").to_pylist()]
    assert sorted(got) == sorted(b"s-%d" % i for i in range(5))
    cache = readers()
    try:
        (entry,) = cache._idle.values()
        conns = entry.reader.stats()["connections"]
        assert [c["msg_timeout"] for c in conns.values()] == [4000]
        assert entry.idle_timeout == 2.0
        # closed by the sweeper (not at 20 s): nsqd sees the client go
        wait_until(lambda: not nsq_cluster.nsqds[0].channel_stats("short_t", C)["clients"], 10,
                   "the Reader closed after 2 s idle")
        assert not len(cache)
    finally:
        cache.close_all()
    c = nsq_cluster.nsqds[0].channel_stats("short_t", C)
    assert c["timeout_count"] == 0 and c["in_flight_count"] == 0
