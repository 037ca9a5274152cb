"""Flow control on the read side, end to end: a server that ignores RDY, one that answers
AUTH with 50 MiB.

A fake nsqd on loopback (conn_helpers.FakeNsqd) answers the handshake and SUB, then floods
messages without ever reading again: plain, or deflated. Before flow control was enforced
on the read side, a pull Reader reached 2.7 GB in 15 s, a coroutine-handler Reader 2.5 GB
without running a handler, a sync-handler Reader 1.2 GB; with deflate the event loop was
blocked for 107 s. This child, run for 3 s against the code before (flood bounded to 10 s):
pull 850 MiB peak and 1.8 M messages queued, coroutine handler 1384 MiB and a 20 ms timer
17 s late, sync handler 275 MiB (2.9 s late), deflate + sync handler 542 MiB (13.5 s late);
no connection was ever closed. Now each connection closes with a ProtocolError naming the counts
within a chunk, peak RSS stays small, and the loop keeps its timers (a lag probe).

Every measurement runs in a child process (its peak RSS alone), bounded in time; the
flood is bounded too (at most FLOOD_SECONDS per connection, and it stops when the client
closes).

Also here: a server that keeps sending but never reads our answers (closed at
MAX_ANSWER_BACKLOG), a refused handshake leaving no reference cycle that holds its buffers,
and, against a real nsqd, what must not be taken for a flood: messages held past
msg_timeout (nsqd sends more than RDY then) and a lowered RDY.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(90)

RSS_LIMIT_MIB = 200

_CHILD = textwrap.dedent('''
    import asyncio, json, logging, sys, threading, time, zlib
    sys.path.insert(0, {tests!r})
    from conn_helpers import FakeNsqd, frame, peak_rss_mib
    from nsq_spark import Reader, errors
    from nsq_spark._conn import Connection

    codec, client, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    FLOOD_SECONDS = 10.0
    body = bytes(range(100))
    block = b"".join((130).to_bytes(4, "big") + (2).to_bytes(4, "big") + bytes(8)
                     + (1).to_bytes(2, "big") + b"%016d" % i + body for i in range(10000))
    ok = frame(b"OK")
    if codec == "deflate":
        c = zlib.compressobj(6, zlib.DEFLATED, -15)
        upgrade = c.compress(ok) + c.flush(zlib.Z_FULL_FLUSH)
        sub_ok = c.compress(ok) + c.flush(zlib.Z_FULL_FLUSH)
        piece = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)  # independent: repeatable
    else:
        upgrade, sub_ok, piece = b"", ok, block
    answer = json.dumps({{"max_rdy_count": 2500, "version": "1.3.0", "tls_v1": False,
                          "deflate": codec == "deflate", "deflate_level": 6,
                          "msg_timeout": 60000, "auth_required": False}}).encode()
    sent = [0]

    def flood(peer):
        peer.handshake()
        peer.send_frame(answer)
        if upgrade:
            peer.sock.sendall(upgrade)
        peer.sock.recv(65536)  # SUB
        peer.sock.sendall(sub_ok)
        peer.sock.recv(65536)  # RDY 1 (the Reader's first); never read again
        end = time.monotonic() + FLOOD_SECONDS
        while time.monotonic() < end and not peer.closed.is_set():
            peer.sock.sendall(piece)
            sent[0] += 10000

    t0 = time.monotonic()
    closes = []  # (seconds since start, exception type, text) of every connection closed

    class Keep(logging.Handler):
        def emit(self, record):
            exc = record.args[-1] if isinstance(record.args, tuple) and record.args else None
            if isinstance(exc, BaseException) and "closing connection" in record.msg:
                closes.append((time.monotonic() - t0, type(exc).__name__, str(exc)))

    logging.getLogger("nsq_spark").addHandler(Keep(logging.ERROR))
    logging.getLogger("nsq_spark").propagate = False
    lags = []
    handled = [0]

    async def probe():
        # the client's own timers: a 20 ms sleep that wakes late shows a blocked loop
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.02)
            lags.append(time.monotonic() - t - 0.02)

    async def handler_mode(make_handler):
        r = Reader(topic="t", channel="c", nsqd_tcp_addresses=[server.address],
                   max_in_flight=100, reconnect_initial=0.2, reconnect_max=0.5,
                   message_handler=make_handler(), **options)
        task = asyncio.ensure_future(probe())
        await asyncio.sleep(seconds)
        task.cancel()
        await r.aclose()

    def coroutine_handler():
        async def h(m):
            handled[0] += 1
            await asyncio.sleep(30)
        return h

    def sync_handler():
        def h(m):
            handled[0] += 1
            return True
        return h

    options = {{"deflate": True}} if codec == "deflate" else {{}}
    with FakeNsqd(flood) as server:
        if client == "pull":
            r = Reader(topic="t", channel="c", nsqd_tcp_addresses=[server.address],
                       max_in_flight=100, reconnect_initial=0.2, reconnect_max=0.5, **options)
            r.start()
            while r.loop is None:
                time.sleep(0.01)
            fut = asyncio.run_coroutine_threadsafe(probe(), r.loop)
            time.sleep(seconds)
            fut.cancel()
            queued = r.stats()["pull_queued"]
            r.close()
            handled[0] = queued
        elif client == "coroutine":
            asyncio.run(handler_mode(coroutine_handler))
        else:
            asyncio.run(handler_mode(sync_handler))
    peak_mib = peak_rss_mib()
    print(json.dumps({{"closes": closes[:3], "n_closes": len(closes), "peak_mib": peak_mib,
                      "max_lag": max(lags) if lags else None, "probes": len(lags),
                      "handled": handled[0], "sent": sent[0],
                      "seconds": time.monotonic() - t0}}))
''')


def run_child(code: str, *args: str, timeout: float = 60) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("codec", ["plain", "deflate"])
@pytest.mark.parametrize("client", ["pull", "coroutine", "sync"])
def test_a_server_that_ignores_rdy_is_closed_in_bounded_memory_and_time(codec: str,
                                                                      client: str) -> None:
    tests = os.path.dirname(os.path.abspath(__file__))
    result = run_child(_CHILD.format(tests=tests), codec, client, "3")
    print(result)
    assert result["peak_mib"] < RSS_LIMIT_MIB, result
    assert result["n_closes"] >= 1, result
    first_at, kind, text = result["closes"][0]
    assert kind == "ProtocolError", result
    assert "broke flow control" in text and "RDY" in text and "received" in text, text
    assert first_at < 2.0, result              # the first chunk over the credit closes it
    # the loop kept running: a 20 ms timer never woke more than 0.5 s late (measured here:
    # under 0.1 s; before, 1.1 s (pull) to 17 s (coroutine handler)), and it woke all along
    assert result["max_lag"] is not None and result["max_lag"] < 0.5, result
    assert result["probes"] > 50, result
    assert result["handled"] <= 100, result     # at most max_in_flight reached the app


# -- a 50 MiB AUTH answer (under the 64 MiB frame limit) ------------------------------------

_AUTH_CHILD = textwrap.dedent('''
    import asyncio, json, logging, sys, time
    sys.path.insert(0, {tests!r})
    from conn_helpers import FakeNsqd, peak_rss_mib
    from nsq_spark import Reader, errors
    from nsq_spark._conn import Connection

    seconds = float(sys.argv[1])
    SECRET = "s3cret-do-not-log"
    answer = json.dumps({{"max_rdy_count": 2500, "version": "1.3.0", "tls_v1": False,
                          "auth_required": True}}).encode()
    big = 50 << 20
    junk = b"{{" + b" " * (1 << 20)

    def huge_auth_answer(peer):
        peer.handshake()
        peer.send_frame(answer)
        peer.read_command()  # AUTH
        peer.sock.sendall((big + 4).to_bytes(4, "big") + (0).to_bytes(4, "big"))
        for _ in range(50):  # the body, until the client hangs up
            peer.sock.sendall(junk)

    texts = []

    class Keep(logging.Handler):
        def emit(self, record):
            texts.append(record.getMessage())

    logging.getLogger().addHandler(Keep(logging.DEBUG))
    logging.getLogger().setLevel(logging.DEBUG)
    with FakeNsqd(huge_auth_answer) as server:
        async def connect_once():
            conn = Connection("127.0.0.1", server.port, auth_secret=SECRET)
            t = time.monotonic()
            try:
                await conn.connect()
            except errors.NSQError as exc:
                return type(exc).__name__, str(exc), time.monotonic() - t
            return None, "", 0.0
        kind, text, took = asyncio.run(connect_once())
        t0 = time.monotonic()
        r = Reader(topic="t", channel="c", nsqd_tcp_addresses=[server.address],
                   reconnect_initial=0.05, reconnect_max=0.1, auth_secret=SECRET)
        r.start()
        time.sleep(seconds)
        r.close()
        attempts = server.accepted - 1
    peak_mib = peak_rss_mib()
    print(json.dumps({{"error": kind, "text": text, "took": took, "attempts": attempts,
                      "peak_mib": peak_mib, "secret_logged": any(SECRET in t for t in texts),
                      "seconds": time.monotonic() - t0}}))
''')


def test_a_50_mib_auth_answer_is_a_protocol_error_in_bounded_memory_across_reconnects() -> None:
    """The size prefix alone ends the handshake (HANDSHAKE_MAX_FRAME_SIZE): measured here
    37 MiB peak, 23 reconnects in 3 s, 11 ms per attempt; before, 834 MiB peak, 5 attempts
    (0.38 s each, reading 50 MiB to find it is not JSON)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    result = run_child(_AUTH_CHILD.format(tests=tests), "3")
    print(result)
    assert result["error"] == "ProtocolError", result
    assert "HANDSHAKE_MAX_FRAME_SIZE" in result["text"] and str((50 << 20) + 4) in result["text"]
    assert "the AUTH answer" in result["text"], result
    assert result["took"] < 1.0, result
    assert result["attempts"] >= 5, result      # the Reader kept reconnecting
    assert result["peak_mib"] < RSS_LIMIT_MIB, result
    assert not result["secret_logged"], result


# -- a server that keeps sending but never reads our answers ---------------------------------

def test_a_server_that_does_not_read_our_answers_is_closed_when_they_pile_up() -> None:
    """Within the credit (RDY 100000, every chunk finished at once) but never reading: the
    FINs would pile up in the write buffer without end; at MAX_ANSWER_BACKLOG the
    connection closes with a ProtocolError."""
    import asyncio
    import json as json_
    import time

    from conn_helpers import FakeNsqd, frame, run
    from nsq_spark import errors
    from nsq_spark._conn import MAX_ANSWER_BACKLOG, Connection

    body = bytes(100)
    burst = b"".join(frame(bytes(10) + b"%016d" % i + body, 2) for i in range(1000))
    answer = json_.dumps({"max_rdy_count": 100000, "version": "1.3.0"}).encode()

    def never_reads(peer: Any) -> None:
        peer.handshake()
        peer.send_frame(answer)
        peer.read_command()  # SUB
        peer.send_frame(b"OK")
        peer.read_command()  # RDY
        end = time.monotonic() + 20
        while time.monotonic() < end and not peer.closed.is_set():
            peer.sock.sendall(burst)
            time.sleep(0.001)

    async def main() -> tuple[BaseException | None, int, float]:
        ended: list[BaseException | None] = []
        got = [0]

        def on_messages(conn: Connection, msgs: list[Any]) -> None:
            got[0] += len(msgs)
            conn.fin_many([m.id for m in msgs])

        conn = Connection("127.0.0.1", server.port, on_messages=on_messages,
                          on_close=lambda c, e: ended.append(e))
        await conn.connect()
        await conn.subscribe("t", "c")
        conn.send_rdy(100000)
        t0 = time.monotonic()
        await asyncio.wait_for(conn.wait_closed(), 30)
        return ended[0], got[0], time.monotonic() - t0

    with FakeNsqd(never_reads) as server:
        exc, got, took = run(main(), 40)
    print({"error": repr(exc)[:120], "finished": got, "seconds": took})
    assert isinstance(exc, errors.ProtocolError), repr(exc)
    assert "has not read our last" in str(exc) and str(MAX_ANSWER_BACKLOG) in str(exc)
    # 8 MiB of 22-byte FINs, plus what the kernel buffers took: about half a million
    assert MAX_ANSWER_BACKLOG // 22 < got < 20 * MAX_ANSWER_BACKLOG // 22, got
    assert took < 15, took


_CYCLE_CHILD = textwrap.dedent('''
    import asyncio, gc, json, sys, types
    sys.path.insert(0, {tests!r})
    from conn_helpers import FakeNsqd
    from nsq_spark import errors
    from nsq_spark.config import ConnectionConfig
    from nsq_spark._conn import Connection, SyncConnection

    answer = json.dumps({{"max_rdy_count": 2500, "version": "1.3.0",
                          "auth_required": True}}).encode()
    size = (1 << 20) - 100  # just under HANDSHAKE_MAX_FRAME_SIZE, and not JSON

    def junk_auth_answer(peer):
        peer.handshake()
        peer.send_frame(answer)
        peer.read_command()
        peer.send_frame(b"{{" + b" " * (size - 1))
        while peer.sock.recv(65536):
            pass

    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / (1 << 20)

    gc.collect()
    gc.disable()  # what only the cyclic collector would free stays: measure it
    errors_seen = set()
    with FakeNsqd(junk_auth_answer) as server:
        async def attempts():
            for _ in range(30):
                try:
                    await Connection("127.0.0.1", server.port, auth_secret="x").connect()
                except errors.NSQError as exc:
                    errors_seen.add(type(exc).__name__)
        before = rss_mib()
        asyncio.run(attempts())
        for _ in range(30):
            try:
                SyncConnection("127.0.0.1", server.port,
                               ConnectionConfig(auth_secret="x")).connect()
            except errors.NSQError as exc:
                errors_seen.add(type(exc).__name__)
        grown = rss_mib() - before
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    kept = sorted({{type(o).__name__ for o in gc.garbage
                   if isinstance(o, (BaseException, types.FrameType, types.TracebackType))}})
    print(json.dumps({{"errors": sorted(errors_seen), "grown_mib": grown, "kept": kept}}))
''')


def test_a_refused_handshake_leaves_no_cycle_holding_its_buffers() -> None:
    """60 handshakes (tornado and blocking) refused on a 1 MiB - 100 B AUTH answer that is
    not JSON, with the cyclic collector paused: no error, frame or traceback is left for
    it, and memory does not grow with the attempts (before: the error was its own cause,
    3 MiB kept per attempt, 120 MiB after 40)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    result = run_child(_CYCLE_CHILD.format(tests=tests))
    print(result)
    assert result["errors"] == ["ProtocolError"], result
    assert result["kept"] == [], result
    assert result["grown_mib"] < 30, result


# -- a real nsqd: timeouts and a lowered RDY are not taken for a flood -----------------------

def test_a_puller_holding_messages_past_msg_timeout_is_not_taken_for_a_flood(
        nsq_cluster: Any, caplog: Any) -> None:
    """nsqd times the held messages out after msg_timeout (1 s) and sends more:
    more unanswered messages than RDY, and allowed (the timeout allowance). A lowered RDY
    (set_max_in_flight) leaves the connection open too."""
    import time

    from nsq_spark.testing import publish
    from nsq_spark import Reader

    topic = f"held{os.getpid()}"
    publish(nsq_cluster.nsqd_http_addresses[0], topic, [b"m%d" % i for i in range(40)])
    r = Reader(topic=topic, channel="c", nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
               max_in_flight=10, msg_timeout=1)
    try:
        held = []
        # pull, never answer: nsqd times them out and sends more (here the first round came
        # after ~5 s, then one a second: nsqd's queue scan decides when)
        deadline = time.monotonic() + 20
        while len(held) < 40 and time.monotonic() < deadline:
            held += r.get_batch(100, 0.2)
        stats = r.stats()
        conn = next(iter(stats["connections"].values()))
        assert len(held) >= 40, (len(held), str(stats))  # 4 times RDY, unanswered
        assert stats["messages_received"] == len(held)
        assert conn["state"] == "subscribed", stats
        r.finish(held[-10:])
        r.set_max_in_flight(1)
        more = []
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            more += r.get_batch(100, 0.2)
            r.finish([m for m in more if not m.responded])
        stats = r.stats()
        assert len(stats["connections"]) == 1, stats
        assert next(iter(stats["connections"].values()))["state"] == "subscribed", stats
    finally:
        r.close()
    closed = [rec.getMessage() for rec in caplog.records if "closing connection" in
              rec.getMessage() or "connection to nsqd" in rec.getMessage()]
    assert not closed, closed  # never closed (and reconnected) on the way
