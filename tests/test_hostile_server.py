"""A hostile or broken server, end to end: a fake nsqd on loopback (conn_helpers.FakeNsqd)
answers IDENTIFY with fields of the wrong type or range, or floods a compressed stream that
expands a thousandfold. The connections (tornado and blocking), the Producer and the Reader
must end with a typed ProtocolError naming the problem, must not retry it, and must not
let memory grow with the bomb."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any, Callable

import pytest

from conn_helpers import FakeNsqd, FakePeer, frame, publish_by, run
from nsq_spark import Producer, errors
from nsq_spark._conn import Connection, SyncConnection

pytestmark = pytest.mark.timeout(60)


def _answer_identify(raw: bytes) -> Callable[[FakePeer], None]:
    """A server that answers IDENTIFY with ``raw`` (JSON text), then waits."""
    def script(peer: FakePeer) -> None:
        peer.handshake()
        peer.send_frame(raw)
        peer.sock.recv(1)  # until the client gives up
    return script


def _identify(**fields: Any) -> bytes:
    base = {"max_rdy_count": 2500, "version": "1.3.0", "max_msg_timeout": 900000,
            "msg_timeout": 60000, "tls_v1": False, "deflate": False, "snappy": False,
            "auth_required": False, "sample_rate": 0}
    return json.dumps({**base, **fields}).encode()


NESTED = b'{"max_rdy_count": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

HOSTILE = {
    "max_rdy_count string": (_identify(max_rdy_count="2500"), "max_rdy_count"),
    "max_rdy_count null": (_identify(max_rdy_count=None), "max_rdy_count"),
    "max_rdy_count list": (_identify(max_rdy_count=[1]), "max_rdy_count"),
    "msg_timeout 1e400": (_identify().replace(b'"msg_timeout": 60000', b'"msg_timeout": 1e400'),
                          "msg_timeout"),
    "deeply nested": (NESTED, "nested"),
}


@pytest.fixture(params=list(HOSTILE), ids=list(HOSTILE))
def hostile(request: Any) -> Any:
    raw, named = HOSTILE[request.param]
    with FakeNsqd(_answer_identify(raw)) as server:
        yield server, named


def test_hostile_identify_answers_fail_connection_connect_with_protocol_error(hostile: Any) -> None:
    server, named = hostile

    async def main() -> None:
        conn = Connection("127.0.0.1", server.port)
        with pytest.raises(errors.ProtocolError, match=named):
            await conn.connect()
        assert conn.closed

    run(main(), 15)


def test_hostile_identify_answers_fail_sync_connection_with_protocol_error(hostile: Any) -> None:
    server, named = hostile
    conn = SyncConnection("127.0.0.1", server.port)
    with pytest.raises(errors.ProtocolError, match=named):
        conn.connect()
    assert conn.closed


@pytest.mark.parametrize("path", ["blocking", "future", "asyncio"])
def test_producer_raises_hostile_identify_at_once_without_retrying(hostile: Any,
                                                                   path: str) -> None:
    server, named = hostile
    t0 = time.monotonic()
    with Producer(server.address, retry_wait=0.01) as p:
        with pytest.raises(errors.ProtocolError, match=named):
            publish_by(p, path, "t", b"x", 15)
        assert p.stats()["retries"] == 0
    assert server.accepted == 1            # one connection: a ProtocolError is not retried
    assert time.monotonic() - t0 < 5


# -- compression bombs: measured in a child process (its peak RSS alone) --------------------

_CHILD = textwrap.dedent('''
    import asyncio, json, logging, sys, time, zlib
    sys.path.insert(0, {tests!r})
    import cramjam
    from conn_helpers import FakeNsqd, frame, peak_rss_mib
    from nsq_spark import Reader, errors
    from nsq_spark.config import ConnectionConfig
    from nsq_spark._conn import Connection, SyncConnection

    kind, client = sys.argv[1], sys.argv[2]
    ok = frame(b"OK")
    if kind == "deflate":
        # a full flush makes each piece independent: repeated, it is a valid stream of
        # 16 MiB of zeros per ~16 KiB sent (about 1000x)
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        head = c.compress(ok) + c.flush(zlib.Z_FULL_FLUSH)
        piece = c.compress(bytes(16 << 20)) + c.flush(zlib.Z_FULL_FLUSH)
    else:
        head = bytes(cramjam.snappy.compress(ok))
        piece = bytes(cramjam.snappy.compress(bytes(16 << 20)))
    answer = json.dumps({{"max_rdy_count": 2500, "version": "1.3.0", "tls_v1": False,
                          kind: True, "deflate_level": 1, "auth_required": False}}).encode()
    sent = [0]

    def bomb(peer):
        peer.handshake()
        peer.send_frame(answer)
        peer.sock.sendall(head)
        while sent[0] < (64 << 30) and not peer.closed.is_set():  # at most 64 GiB of zeros
            peer.sock.sendall(piece)
            sent[0] += 16 << 20  # uncompressed size

    warnings = []

    class Keep(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger().addHandler(Keep(logging.WARNING))
    options = {{kind: True}}
    with FakeNsqd(bomb) as server:
        t0 = time.monotonic()
        error = None
        if client == "connection":
            async def main():
                ended = []  # the bomb ends the handshake, or the read loop after it
                conn = Connection("127.0.0.1", server.port, on_messages=lambda c, m: None,
                                  on_close=lambda c, e: ended.append(e), **options)
                try:
                    await conn.connect()
                    await asyncio.wait_for(conn.wait_closed(), 20)
                    return ended[0]
                except errors.NSQError as exc:
                    return exc
            error = asyncio.run(main())
        elif client == "sync":
            conn = SyncConnection("127.0.0.1", server.port,
                                  ConnectionConfig.from_options(**options))
            try:
                conn.connect()
                conn.command(b"NOP\\n")
            except errors.NSQError as exc:
                error = exc
        else:
            r = Reader(topic="t", channel="c", nsqd_tcp_addresses=[server.address], **options)
            r.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any("frame" in w for w in warnings):
                time.sleep(0.1)
            time.sleep(1)  # a reconnect or two against the same bomb
            r.close()
            error = next((w for w in warnings if "frame" in w), None)
    peak_mib = peak_rss_mib()
    print(json.dumps({{"error": type(error).__name__ if isinstance(error, BaseException)
                      else error, "text": str(error)[:300], "peak_mib": peak_mib,
                      "zeros_sent_mib": sent[0] >> 20, "seconds": time.monotonic() - t0}}))
''')


@pytest.mark.parametrize("kind", ["deflate", "snappy"])
@pytest.mark.parametrize("client", ["connection", "sync", "reader"])
def test_a_compression_bomb_is_a_protocol_error_in_bounded_memory(kind: str, client: str) -> None:
    tests = os.path.dirname(os.path.abspath(__file__))
    code = _CHILD.format(tests=tests)
    proc = subprocess.run([sys.executable, "-c", code, kind, client], capture_output=True,
                          text=True, timeout=50, env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["peak_mib"] < 600, result        # unbounded, it reached 3.4 GB in 15 s
    if client == "reader":  # the Reader logs the ProtocolError and reconnects
        assert result["error"] and "frame" in result["error"], result
    else:
        assert result["error"] == "ProtocolError", result


# -- garbage right after the IDENTIFY answer: the publish paths end with it, at once -------

def _identify_then_garbage(peer: FakePeer) -> None:
    """The IDENTIFY answer and garbage in one segment: the handshake succeeds (its frame is
    read exactly), the read loop meets the garbage, the connection closes with a
    ProtocolError, maybe before the first command is queued on it."""
    peer.handshake()
    peer.sock.sendall(frame(_identify()) + b"\xde\xad\xbe\xef not NSQ at all")
    while peer.sock.recv(65536):
        pass


def _writer_pub(address: str) -> BaseException | None:
    from nsq_spark.writer import Writer

    async def main() -> BaseException | None:
        w = Writer([address], retry_wait=0.01)
        heard: list[Any] = []
        try:
            fut = w.pub("t", b"x", callback=lambda writer, data: heard.append(data))
            try:
                await asyncio.wait_for(fut, 20)
            except errors.NSQError as exc:
                assert heard and heard[0] is exc or type(heard[0]) is type(exc)
                return exc
            return None
        finally:
            await w.aclose()
    return run(main(), 30)


@pytest.mark.parametrize("path", ["blocking", "future", "asyncio", "writer"])
def test_garbage_after_identify_is_a_protocol_error_on_every_publish_path_at_once(
        path: str) -> None:
    # before: publish_async, apublish and Writer.pub picked the connection the garbage had
    # closed, got "connection is closed; cannot send" (transient), reconnected and retried
    # for the whole budget (30 s, 38 connections), then raised ConnectionClosedError
    with FakeNsqd(_identify_then_garbage) as server:
        t0 = time.monotonic()
        if path == "writer":
            exc: BaseException | None = _writer_pub(server.address)
        else:
            exc = None
            with Producer(server.address, retry_wait=0.01) as p:
                try:
                    publish_by(p, path, "t", b"x", 20)
                except errors.NSQError as e:
                    exc = e
        took = time.monotonic() - t0
    assert isinstance(exc, errors.ProtocolError), repr(exc)
    assert "frame size" in str(exc)
    assert took < 1.0, took
    assert server.accepted <= 2, server.accepted  # the error is final: no retrying
