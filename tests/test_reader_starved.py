"""The guide's ``is_starved()`` batching pattern against a real nsqd.

A handler takes the message over (``enable_async()``), buffers it, and finishes the whole
buffer once ``reader.is_starved()``. A message is in flight from the moment it is handed
to the handler until it is answered, so with ``max_in_flight=50`` on one nsqd (RDY 50) the
reader is starved at 43 in flight: batches of about 43, as pynsq gives. (Counting a read
chunk as in flight before the handler saw its first message gave batches of 1.)
"""

from __future__ import annotations

import asyncio
import statistics

import pytest

from nsq_spark._consumer import Reader
from nsq_spark.testing import publish
from reader_helpers import await_for

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(60)]

T, C = "starved", "c"
N = 2000


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_is_starved_batching_gives_batches_near_85_percent_of_max_in_flight(nsq_cluster):
    sent = [b"m%d" % i for i in range(N)]
    publish(nsq_cluster.nsqd_http_addresses[0], T, sent)
    buf: list = []
    batches: list[int] = []
    done: list[bytes] = []

    async def main() -> None:
        def handler(m):
            m.enable_async()
            buf.append(m)
            if r.is_starved():
                batches.append(len(buf))
                for b in buf:
                    done.append(b.body)
                    b.finish()
                buf.clear()

        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=50)
        await await_for(lambda: len(done) + len(buf) >= N, 30, f"{N} messages")
        for b in buf:  # the tail, too small to starve the connection
            done.append(b.body)
            b.finish()
        buf.clear()
        await r.aclose()

    asyncio.run(asyncio.wait_for(main(), 45))
    assert sorted(done) == sorted(sent)
    assert statistics.median(batches) >= 35, batches
    assert max(batches) <= 50, batches  # nsqd never has more than RDY in flight
    nsq_cluster.wait_drained(T, C)
