"""Answers given right before (or while) close() runs reach nsqd: the Spark connector
finishes a chunk, then closes, and relies on every FIN arriving (a dropped FIN is a
redelivery after msg_timeout)."""

from __future__ import annotations

import threading
import time

import pytest

from nsq_spark._consumer import Reader
from nsq_spark.testing import publish, wait_until

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(90)]

T, C = "closerace", "cr"
MSG_TIMEOUT = 2  # seconds: a dropped FIN shows as a timeout within the test's wait


def _pull(r: Reader, n: int) -> list:
    got: list = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        got += r.get_batch(max_messages=n - len(got), timeout=1.0)
    assert len(got) == n, f"pulled {len(got)} of {n}"
    return got


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_answers_given_just_before_close_are_all_delivered(nsq_cluster):
    rounds, n = 8, 200
    addr = nsq_cluster.nsqd_tcp_addresses
    for round_ in range(rounds):
        publish(nsq_cluster.nsqd_http_addresses[0], T, [b"r%d-%d" % (round_, i) for i in range(n)])
        r = Reader(T, C, nsqd_tcp_addresses=addr, max_in_flight=n, msg_timeout=MSG_TIMEOUT)
        msgs = _pull(r, n)
        half = n // 2
        r.finish(msgs[:half])  # bulk, from this (non-loop) thread
        for m in msgs[half:]:
            m.finish()  # per message: the cross-thread queue
        r.close()  # at once: no time for the loop to have sent anything yet
        assert r.closed
        st = r.stats()
        assert st["finished"] == n and st["dropped_responses"] == 0, st
    # a dropped FIN stays in flight, then times out and is redelivered after MSG_TIMEOUT
    time.sleep(MSG_TIMEOUT + 1.0)
    c = nsq_cluster.nsqds[0].channel_stats(T, C)
    assert c["in_flight_count"] == 0 and c["depth"] == 0, c
    assert c["timeout_count"] == 0 and c["requeue_count"] == 0, c
    assert c["message_count"] == rounds * n, c
    # and nothing comes back to a second reader on the channel
    r2 = Reader(T, C, nsqd_tcp_addresses=addr, max_in_flight=10, msg_timeout=MSG_TIMEOUT)
    try:
        assert r2.get_batch(10, timeout=1.0) == []
    finally:
        r2.close()


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_answers_racing_close_from_another_thread_are_delivered_or_counted(nsq_cluster):
    """Finishes from a worker thread while the main thread closes: every message is either
    finished on nsqd, requeued by close, or counted as dropped — never counted as finished
    and lost."""
    rounds, n = 6, 200
    addr = nsq_cluster.nsqd_tcp_addresses
    total_fin = 0
    for round_ in range(rounds):
        publish(nsq_cluster.nsqd_http_addresses[0], T, [b"t%d-%d" % (round_, i) for i in range(n)])
        r = Reader(T, C, nsqd_tcp_addresses=addr, max_in_flight=n, msg_timeout=MSG_TIMEOUT)
        msgs = _pull(r, n)
        started = threading.Event()

        def worker():
            for i, m in enumerate(msgs):
                if i == n // 2:
                    started.set()  # the main thread closes while the rest is answered
                try:
                    m.finish()
                except Exception:
                    pass  # close() requeued it already, or the Reader closed (counted below)
                if i % 2 == 0:
                    time.sleep(0.0002)  # spread the answers over the whole close()
        t = threading.Thread(target=worker)
        t.start()
        started.wait(5)
        r.close()
        t.join(10)
        st = r.stats()
        total_fin += st["finished"]
    # the rest comes back: requeued by close() at once, or (an answer accepted but lost)
    # after MSG_TIMEOUT; wait long enough for the latter to show
    expected = rounds * n - total_fin
    settle = time.monotonic() + MSG_TIMEOUT + 1.5
    hard = time.monotonic() + MSG_TIMEOUT + 15
    r3 = Reader(T, C, nsqd_tcp_addresses=addr, max_in_flight=n, msg_timeout=MSG_TIMEOUT)
    back = 0
    try:
        while time.monotonic() < hard and (back < expected or time.monotonic() < settle):
            b = r3.get_batch(n, timeout=0.2)
            back += len(b)
            r3.finish(b)
    finally:
        r3.close()
    c = nsq_cluster.nsqds[0].channel_stats(T, C)
    # what the Reader counted as finished reached nsqd; the rest came back exactly once
    assert back == expected, (total_fin, back, c)
    assert c["in_flight_count"] == 0 and c["depth"] == 0, c


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_answers_after_the_socket_closed_count_as_dropped_not_finished(nsq_cluster):
    """The socket is closed (close() or abort) but the read loop has not noticed yet: the
    connection refuses the FINs, and the stats say dropped, not finished."""
    import concurrent.futures
    n = 20
    publish(nsq_cluster.nsqd_http_addresses[0], T, [b"d%d" % i for i in range(n)])
    r = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=n,
               msg_timeout=MSG_TIMEOUT, max_backoff_duration=0)
    try:
        msgs = _pull(r, n)
        (conn,) = r.conns.values()
        done: concurrent.futures.Future = concurrent.futures.Future()

        def on_loop():  # one loop turn: the read loop cannot see the close in between
            try:
                conn.abort()
                r.finish(msgs)  # on the loop thread: flushed at once
                done.set_result(r._stats())
            except BaseException as exc:  # pragma: no cover
                done.set_exception(exc)
        r.loop.call_soon_threadsafe(on_loop)
        st = done.result(5)
        assert st["finished"] == 0 and st["dropped_responses"] == n, st
    finally:
        r.close()
    # nsqd never got them: they time out and come back
    wait_until(lambda: nsq_cluster.nsqds[0].channel_stats(T, C).get("timeout_count", 0) == n,
               MSG_TIMEOUT + 5, f"{n} timeouts")
