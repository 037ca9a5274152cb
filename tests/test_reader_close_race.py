"""Answers given right before (or while) close() runs reach nsqd: the Spark connector
finishes a chunk, then closes, and relies on every FIN arriving (a dropped FIN is a
redelivery after msg_timeout)."""

from __future__ import annotations

import time

import pytest

from nsq_spark.reader import Reader
from test_reader_helpers import channel_stats, mpub, wait_for

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
def test_answers_after_the_socket_closed_count_as_dropped_not_finished(nsq_cluster):
    """The socket is closed (close() or abort) but the read loop has not noticed yet: the
    connection refuses the FINs, and the stats say dropped, not finished."""
    import concurrent.futures
    n = 20
    mpub(nsq_cluster.nsqd_http_addresses[0], T, [b"d%d" % i for i in range(n)])
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
        r._aloop.call_soon_threadsafe(on_loop)
        st = done.result(5)
        assert st["finished"] == 0 and st["dropped_responses"] == n, st
    finally:
        r.close()
    # nsqd never got them: they time out and come back
    wait_for(lambda: channel_stats(nsq_cluster, 0, T, C).get("timeout_count", 0) == n,
             MSG_TIMEOUT + 5, f"{n} timeouts")
