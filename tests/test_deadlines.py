"""Timeouts are totals: a server that drips one byte at a time (conn_helpers.FakeNsqd) must
not stretch a handshake, an answer, a subscribe or a publish -- blocking, futures, asyncio
and HTTP alike. And the retry policy's deadline, pure, without sockets."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import pytest

from conn_helpers import FakeNsqd, FakePeer, frame, publish_by, run
from nsq_spark import Producer, errors
from nsq_spark._conn import Connection, SyncConnection
from nsq_spark.config import ConnectionConfig
from nsq_spark.errors import ConnectError, NSQTimeoutError
from nsq_spark._retry import RetryPolicy

pytestmark = pytest.mark.timeout(60)

IDENTIFY_OK = (b'{"max_rdy_count": 2500, "version": "1.3.0", "msg_timeout": 60000, '
               b'"tls_v1": false, "snappy": false, "deflate": false, "auth_required": false}')
DRIP = 0.3   # seconds per byte: a 10-byte OK frame takes 3 s, a handshake answer ~40 s


def _drip_answers(peer: FakePeer) -> None:
    """A prompt handshake, then every command answered one byte per DRIP seconds."""
    peer.handshake()
    peer.send_frame(IDENTIFY_OK)
    while not peer.closed.is_set():
        peer.read_command()
        peer.drip(frame(b"OK"), DRIP)


def _drip_handshake(peer: FakePeer) -> None:
    peer.handshake()
    peer.drip(frame(IDENTIFY_OK), DRIP)


def _within(seconds: float) -> Callable[[], float]:
    t0 = time.monotonic()

    def check() -> float:
        took = time.monotonic() - t0
        assert took < seconds, f"took {took:.2f}s, over {seconds}s"
        return took
    return check


@pytest.fixture
def drip_answers() -> Any:
    with FakeNsqd(_drip_answers) as server:
        yield server


@pytest.fixture
def drip_handshake() -> Any:
    with FakeNsqd(_drip_handshake) as server:
        yield server


# -- the handshake as a whole -------------------------------------------------------------

def test_a_dripped_handshake_times_out_after_response_timeout_in_all(drip_handshake: Any) -> None:
    async def main() -> None:
        # each read gets its bytes within 2 s (a 4-byte header takes 1.2 s); the whole
        # answer would take ~30 s
        conn = Connection("127.0.0.1", drip_handshake.port, response_timeout=2.0)
        done = _within(2.7)
        with pytest.raises(NSQTimeoutError, match="response_timeout"):
            await conn.connect()
        assert done() >= 1.9   # the whole handshake had its 2 s, no more
        assert conn.closed

    run(main(), 15)


def test_a_dripped_handshake_times_out_on_the_blocking_connection(drip_handshake: Any) -> None:
    conn = SyncConnection("127.0.0.1", drip_handshake.port,
                          ConnectionConfig(response_timeout=2.0))
    done = _within(2.7)
    with pytest.raises(NSQTimeoutError, match="response_timeout"):
        conn.connect()
    assert done() >= 1.9 and conn.closed


# -- one answer ---------------------------------------------------------------------------

def test_subscribe_gets_a_timeout_when_the_answer_drips(drip_answers: Any) -> None:
    async def main() -> None:
        closed: list[BaseException | None] = []
        conn = Connection("127.0.0.1", drip_answers.port, response_timeout=1.0,
                          on_messages=lambda c, m: None,
                          on_close=lambda c, e: closed.append(e))
        await conn.connect()
        done = _within(2.0)
        with pytest.raises(NSQTimeoutError, match="response_timeout=1.0"):
            await conn.subscribe("t", "c")
        done()
        assert conn.closed and isinstance(closed[0], NSQTimeoutError)

    run(main(), 15)


def test_a_blocking_command_gets_a_timeout_when_the_answer_drips(drip_answers: Any) -> None:
    conn = SyncConnection("127.0.0.1", drip_answers.port, ConnectionConfig(response_timeout=1.0))
    conn.connect()
    done = _within(2.0)
    with pytest.raises(NSQTimeoutError):
        conn.command(b"PUB t\n\x00\x00\x00\x01x")
    done()
    assert conn.closed   # the answers after a missing one would be out of step


def test_a_caller_deadline_shorter_than_response_timeout_wins(drip_answers: Any) -> None:
    conn = SyncConnection("127.0.0.1", drip_answers.port, ConnectionConfig(response_timeout=10))
    conn.connect()
    done = _within(1.5)
    with pytest.raises(NSQTimeoutError):
        conn.command(b"PUB t\n\x00\x00\x00\x01x", deadline=time.monotonic() + 0.5)
    done()


# -- a whole publish, retries included: publish_timeout -------------------------------------

@pytest.mark.parametrize("path", ["blocking", "future", "asyncio"])
def test_publish_against_a_dripping_nsqd_ends_at_publish_timeout(drip_answers: Any,
                                                                 path: str) -> None:
    # every attempt costs response_timeout (1 s); retrying would go on for 30 s
    p = Producer(drip_answers.address, publish_timeout=2.5, response_timeout=1.0,
                 retry_deadline=30, retry_wait=0.05)
    done = _within(4.0)
    try:
        with pytest.raises(NSQTimeoutError, match="publish_timeout"):
            publish_by(p, path, "t", b"x", 30)
        assert done() >= 2.0
        assert drip_answers.accepted >= 2     # it did retry within its time
        time.sleep(0.5)                       # a retry under way when the time ran out ends
        assert p.stats()["errors"] == 1 and p.stats()["messages"] == 0
    finally:
        p.close()


def test_mpublish_is_bounded_by_publish_timeout_too(drip_answers: Any) -> None:
    with Producer(drip_answers.address, publish_timeout=1.5, response_timeout=1.0) as p:
        done = _within(3.0)
        with pytest.raises(NSQTimeoutError, match="publish_timeout"):
            p.mpublish("t", [b"a", b"b"])
        done()


def _drip_http(peer: FakePeer) -> None:
    peer.sock.recv(65536)
    peer.drip(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK", DRIP)


@pytest.mark.parametrize("path", ["blocking", "future"])
def test_http_publish_against_a_dripping_server_ends_at_publish_timeout(path: str) -> None:
    with FakeNsqd(_drip_http) as server:
        p = Producer(nsqd_http_addresses=f"http://{server.address}", publish_timeout=2.5,
                     response_timeout=1.0)
        done = _within(4.5)
        try:
            with pytest.raises(NSQTimeoutError, match="publish_timeout"):
                if path == "blocking":
                    p.publish("t", b"x")
                else:
                    p.publish_async("t", b"x").result(30)
            assert done() >= 2.0
        finally:
            p.close()


def test_publish_timeout_none_still_ends_with_the_retry_deadline(drip_answers: Any) -> None:
    with Producer(drip_answers.address, publish_timeout=None, response_timeout=0.5,
                  retry_deadline=1.5, retry_wait=0.05) as p:
        done = _within(3.5)
        with pytest.raises(NSQTimeoutError):
            p.publish("t", b"x")
        done()


# -- the retry policy: its deadline is the budget (pure) ------------------------------------

def _always_refused(calls: list[float]) -> Callable[[], None]:
    def fn() -> None:
        calls.append(time.monotonic())
        raise ConnectError("refused")
    return fn


def test_retrying_goes_on_until_the_deadline_when_tries_are_not_counted() -> None:
    calls: list[float] = []
    t0 = time.monotonic()
    with pytest.raises(ConnectError):
        RetryPolicy(max_tries=None, deadline=0.6, wait=0.01, max_wait=0.05).retrying()(
            _always_refused(calls))
    took = time.monotonic() - t0
    assert 0.55 <= took < 0.8, took
    assert len(calls) >= 10     # 5 tries of the old default would have ended after ~0.1 s


def test_a_callers_deadline_ends_retrying_before_the_policys() -> None:
    calls: list[float] = []
    t0 = time.monotonic()
    with pytest.raises(ConnectError):
        RetryPolicy(max_tries=None, deadline=30, wait=0.01, max_wait=1.0).retrying(
            deadline=t0 + 0.4)(_always_refused(calls))
    assert time.monotonic() - t0 < 0.6


def test_no_wait_sleeps_past_the_deadline() -> None:
    calls: list[float] = []
    t0 = time.monotonic()
    with pytest.raises(ConnectError):
        # the first waits could be up to 10 s each; the deadline is 0.3 s away
        RetryPolicy(max_tries=None, deadline=0.3, wait=5.0, max_wait=10.0).retrying()(
            _always_refused(calls))
    assert time.monotonic() - t0 < 0.5
    assert len(calls) >= 2       # the last attempt comes just before the deadline


def test_max_tries_still_counts_when_given() -> None:
    calls: list[float] = []
    with pytest.raises(ConnectError):
        RetryPolicy(max_tries=3, deadline=30, wait=0.001, max_wait=0.001).retrying()(
            _always_refused(calls))
    assert len(calls) == 3


def test_async_retrying_has_the_same_deadline() -> None:
    calls: list[float] = []

    async def main() -> None:
        async for attempt in RetryPolicy(max_tries=None, deadline=0.4, wait=0.01,
                                         max_wait=0.05).async_retrying():
            with attempt:
                calls.append(time.monotonic())
                await asyncio.sleep(0)
                raise ConnectError("refused")

    t0 = time.monotonic()
    with pytest.raises(ConnectError):
        run(main(), 5)
    assert 0.35 <= time.monotonic() - t0 < 0.7 and len(calls) >= 5


def test_tls_certificate_failures_are_permanent() -> None:
    import ssl

    assert not errors.is_transient(ssl.SSLCertVerificationError("certificate verify failed"))
    assert not errors.is_transient(ssl.SSLError("wrong version number"))
    assert not errors.is_transient(errors.TLSError("refused"))
    assert errors.is_transient(ssl.SSLEOFError("EOF in violation of protocol"))
