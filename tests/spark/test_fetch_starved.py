"""A streaming fetch task against a real nsqd whose --max-rdy-count (100) is below the
source's maxInFlight (1000): nsqd never has more than 100 messages in flight, so a 500-row
chunk can never fill. The task must cut a chunk as soon as the Reader is starved (and no chunk
is in the writers), FIN it, and go on; not wait for the chunk's flush interval.

No Spark session: fetch_stream_partition is called directly, as a Spark task would."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

import nsq_spark.spark._fetch as fetch  # noqa: E402
import nsq_spark.spark._fetch_task as fetch_task  # noqa: E402
from nsq_spark.spark.options import parse_read_options  # noqa: E402
from nsq_spark.spark._spool import Spool  # noqa: E402
from nsq_spark.testing import publish  # noqa: E402

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]

T, C = "starved_t", "starved_c"
N = 1000
MAX_RDY = 100


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0, max_rdy_count=MAX_RDY)
@pytest.mark.parametrize("share", [N, None], ids=["share", "until-idle"])
def test_chunks_are_cut_at_the_starved_window(nsq_cluster, tmp_path, monkeypatch, share):
    # Without the starved rule, a part-filled chunk is cut only after FLUSH_INTERVAL (2 s)
    # or when the task goes idle; push the interval beyond the test, so that the outcome
    # does not hang on timing: without the rule the task goes idle (idleTimeout 1 s) after
    # nsqd's first window of 100 messages and ends short.
    monkeypatch.setattr(fetch_task, "FLUSH_INTERVAL", 3600.0)
    sent = [b"body-%d" % i for i in range(N)]
    publish(nsq_cluster.nsqd_http_addresses[0], T, sent)
    opts = parse_read_options({
        "topic": T, "channel": C, "nsqdTcpAddresses": nsq_cluster.nsqd_tcp_addresses[0],
        "maxInFlight": "1000", "spoolPath": str(tmp_path), "idleTimeout": "1",
        "maxFetchPeriod": "60"}, streaming=True)
    assert opts.spool_chunk_size == 500 and opts.max_in_flight == 1000
    spool = Spool(str(tmp_path), "q")

    out = list(fetch.fetch_stream_partition(opts, spool, 1, 0, share))

    got = [b for rb in out for b in rb.column("body").to_pylist()]
    assert sorted(got) == sorted(sent), f"{len(got)} of {N} bodies came back"
    ids = [i for rb in out for i in rb.column("id").to_pylist()]
    assert len(set(ids)) == N
    assert {a for rb in out for a in rb.column("attempts").to_pylist()} == {1}

    part = spool.partition(1, 0)
    chunks = [part.read_chunk(k) for k in range(part.chunk_count())]
    sizes = [sum(rb.num_rows for rb in c) for c in chunks]
    assert sum(sizes) == N
    # never more than nsqd lets be in flight: cut at the starved window, not at 500 rows
    assert max(sizes) <= MAX_RDY, sizes
    assert len(sizes) >= N // MAX_RDY
    spooled = [b for c in chunks for rb in c for b in rb.column("body").to_pylist()]
    assert spooled == got  # handed over in spool order
    done = part.completion()
    assert done is not None and (done.chunks, done.rows) == (len(sizes), N)

    # every message FINished once the task ended; none left to time out
    nsq_cluster.wait_drained(T, C)
    c = nsq_cluster.nsqds[0].channel_stats(T, C)
    assert c["message_count"] == N and c["requeue_count"] == 0 and c["timeout_count"] == 0
