"""A RDY the connection refuses (over the max_rdy_count nsqd reported) never strands the
chunk already decoded: its messages are dispatched, the error names the nsqd, and the
Reader goes on with the RDY the connection can take."""

from __future__ import annotations

import concurrent.futures
import logging
import time

import pytest

from nsq_spark._consumer import Reader
from nsq_spark.testing import publish, wait_until

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(60)]

T, C = "rdyref", "rr"


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_refused_rdy_in_the_message_callback_still_dispatches_the_chunk(nsq_cluster, caplog):
    caplog.set_level(logging.ERROR, logger="nsq_spark.reader")
    n = 40
    r = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=8,
               msg_timeout=30, max_backoff_duration=0)
    try:
        assert r.get_batch(1, timeout=0.5) == []  # connects and subscribes
        wait_until(lambda: r.conns and r.stats()["total_rdy"] == 8, 10, "RDY 8")
        (conn,) = r.conns.values()
        done: concurrent.futures.Future = concurrent.futures.Future()

        def lower():  # nsqd's limit as seen by the connection, below the policy's RDY
            conn.max_rdy_count = 2
            done.set_result(None)
        r.loop.call_soon_threadsafe(lower)
        done.result(5)
        publish(nsq_cluster.nsqd_http_addresses[0], T, [b"x%d" % i for i in range(n)])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            batch = r.get_batch(n, timeout=0.5)
            got += batch
            r.finish(batch)
            st = r.stats()
            # everything received was handed out: nothing stranded in the loop
            assert st["messages_received"] == len(got) + st["pull_queued"], st
        assert sorted(m.body for m in got) == sorted(b"x%d" % i for i in range(n))
        assert st["connections"][conn.address]["max_rdy_count"] == 2
    finally:
        r.close()
    errors = [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]
    assert any(conn.address in e and "cannot send RDY 8" in e and "RDY 2 instead" in e
               for e in errors), errors
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0, max_rdy_count=0)
def test_nsqd_max_rdy_count_0_subscribes_and_logs_the_fix(nsq_cluster, caplog):
    """nsqd --max-rdy-count=0 takes no RDY at all: the Reader subscribes (RDY 0, nothing
    raised), and the error says which nsqd and what to change."""
    caplog.set_level(logging.ERROR, logger="nsq_spark.reader")
    publish(nsq_cluster.nsqd_http_addresses[0], T, [b"y"])
    r = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=4)
    try:
        assert r.get_batch(1, timeout=0.5) == []
        wait_until(lambda: r.conns, 10, "subscribed")
        (conn,) = r.conns.values()
        assert conn.max_rdy_count == 0 and conn.rdy_count == 0 and not conn.closed
    finally:
        r.close()
    errors = [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]
    assert any(conn.address in e and "--max-rdy-count" in e for e in errors), errors
