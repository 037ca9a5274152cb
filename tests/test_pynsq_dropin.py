"""``import nsq_spark as nsq`` gives a pynsq 0.9.1 program what it uses: every name of
pynsq's ``nsq.__all__``, ``nsq.protocol`` with pynsq's argument names and bytes, pynsq's
error classes, AsyncConn's events and SyncConn against a real nsqd, the Reader hooks pynsq
documents (``heartbeat``, ``disabled``), and Writer calls that return futures and never
raise. Behaviours are taken from pynsq's documentation and the NSQ TCP spec."""

from __future__ import annotations

import asyncio
import json
import struct
import time
import warnings

import pytest
import tornado.gen
from hypothesis import given, settings
from hypothesis import strategies as st

import nsq_spark as nsq
from nsq_spark import errors
from nsq_spark.compat.event import DuplicateListenerError, EventedMixin, InvalidListenerError
from nsq_spark.testing import publish
from reader_helpers import await_for

# pynsq 0.9.1's nsq.__all__
PYNSQ_ALL = ["Reader", "Writer", "run", "BackoffTimer", "Message", "Error", "LegacyReader",
             "SyncConn", "AsyncConn", "unpack_response", "decode_message", "identify",
             "subscribe", "ready", "finish", "touch", "requeue", "nop", "pub", "mpub",
             "valid_topic_name", "valid_channel_name", "FRAME_TYPE_RESPONSE",
             "FRAME_TYPE_ERROR", "FRAME_TYPE_MESSAGE"]
SIZE = struct.Struct(">i")
MID = b"0123456789abcdef"


# -- names ----------------------------------------------------------------------------------

@pytest.mark.unit
def test_every_name_of_pynsqs_all_is_exported():
    assert len(PYNSQ_ALL) == 25
    assert set(PYNSQ_ALL) <= set(nsq.__all__)
    namespace: dict = {}
    exec("from nsq_spark import *", namespace)
    assert [n for n in PYNSQ_ALL if n not in namespace] == []
    assert nsq.protocol.Error is nsq.Error
    assert (nsq.FRAME_TYPE_RESPONSE, nsq.FRAME_TYPE_ERROR, nsq.FRAME_TYPE_MESSAGE) == (0, 1, 2)


@pytest.mark.unit
def test_pynsq_protocol_names_are_in_nsq_spark_protocol():
    for name in ("Error", "SendError", "ConnectionClosedError", "IntegrityError",
                 "unpack_response", "decode_message", "identify", "subscribe", "ready",
                 "finish", "touch", "requeue", "nop", "pub", "mpub", "dpub", "auth",
                 "valid_topic_name", "valid_channel_name", "MAGIC_V2"):
        assert hasattr(nsq.protocol, name), name


# -- protocol: the bytes of the NSQ TCP spec, with pynsq's argument names ------------------

@pytest.mark.unit
def test_commands_are_the_specs_bytes_with_pynsqs_keywords():
    p = nsq.protocol
    assert p.subscribe(topic="t", channel="c") == b"SUB t c\n"
    assert p.ready(count=7) == b"RDY 7\n"
    assert p.finish(id=MID) == b"FIN " + MID + b"\n"
    assert p.requeue(id=MID) == b"REQ " + MID + b" 0\n"
    assert p.requeue(id=MID, time_ms=1500) == b"REQ " + MID + b" 1500\n"
    assert p.touch(id=MID) == b"TOUCH " + MID + b"\n"
    assert p.nop() == b"NOP\n"
    assert p.pub(topic="t", data=b"hello") == b"PUB t\n" + SIZE.pack(5) + b"hello"
    assert p.dpub(topic="t", delay_ms=250, data=b"x") == b"DPUB t 250\n" + SIZE.pack(1) + b"x"
    body = SIZE.pack(2) + SIZE.pack(1) + b"a" + SIZE.pack(3) + b"bcd"
    assert p.mpub(topic="t", data=[b"a", b"bcd"]) == b"MPUB t\n" + SIZE.pack(len(body)) + body


@pytest.mark.unit
def test_str_message_ids_are_sent_utf8_as_pynsq_sends_them():
    assert nsq.finish("\u2020id") == b"FIN \xe2\x80\xa0id\n"
    assert nsq.requeue("abc", 5) == b"REQ abc 5\n"
    assert nsq.touch("abc") == b"TOUCH abc\n"


@pytest.mark.unit
def test_identify_body_is_json_dumps_of_the_dict():
    data = {"client_id": "x", "feature_negotiation": True, "name": "w\u00e5"}
    body = json.dumps(data).encode()
    assert nsq.identify(data) == b"IDENTIFY\n" + SIZE.pack(len(body)) + body


@pytest.mark.unit
def test_unpack_response_and_decode_message_read_a_frame():
    frame = nsq.protocol.encode_message_frame(MID, b"body", timestamp=123, attempts=2)
    frame_type, data = nsq.unpack_response(frame[4:])  # what SyncConn.read_response returns
    assert frame_type == nsq.FRAME_TYPE_MESSAGE
    msg = nsq.decode_message(data)
    assert (msg.id, msg.body, msg.timestamp, msg.attempts) == (MID, b"body", 123, 2)
    assert nsq.unpack_response(SIZE.pack(0) + b"OK") == (nsq.FRAME_TYPE_RESPONSE, b"OK")


@pytest.mark.unit
@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=20))
def test_mpub_body_reads_back_as_the_bodies(bodies):
    cmd = nsq.mpub("t", bodies)
    head, _, rest = cmd.partition(b"\n")
    assert head == b"MPUB t"
    (size,) = SIZE.unpack(rest[:4])
    payload = rest[4:]
    assert size == len(payload)
    (count,) = SIZE.unpack(payload[:4])
    out, pos = [], 4
    for _ in range(count):
        (n,) = SIZE.unpack(payload[pos:pos + 4])
        out.append(payload[pos + 4:pos + 4 + n])
        pos += 4 + n
    assert out == bodies and pos == len(payload)


@pytest.mark.unit
def test_bad_bodies_and_names_raise_assertion_errors_as_pynsqs_asserts_do():
    with pytest.raises(AssertionError):
        nsq.pub("t", "a str body")
    with pytest.raises(errors.InvalidBodyError, match="must be bytes"):
        nsq.pub("t", "a str body")
    with pytest.raises(AssertionError):
        nsq.subscribe("bad topic", "c")
    with pytest.raises(errors.InvalidNameError, match="channel"):
        nsq.subscribe("t", "bad:channel")
    assert not nsq.valid_topic_name("x" * 65) and nsq.valid_channel_name("c#ephemeral")


# -- errors ---------------------------------------------------------------------------------

@pytest.mark.unit
def test_our_errors_are_the_pynsq_errors_a_program_catches():
    p = nsq.protocol
    assert issubclass(errors.NSQError, p.Error)
    for cls in errors.ERROR_CLASSES.values():
        assert issubclass(cls, p.Error)
    assert issubclass(errors.ConnectError, p.SendError)
    assert issubclass(errors.TLSError, p.SendError)
    assert issubclass(errors.ProtocolError, p.IntegrityError)
    assert p.ConnectionClosedError is errors.ConnectionClosedError
    e = p.SendError("no open connections")
    assert (e.msg, e.error, str(e)) == ("no open connections", None, "no open connections")
    cause = OSError("refused")
    e = p.SendError("send error", cause)
    assert e.error is cause and "refused" in str(e)


@pytest.mark.unit
def test_unknown_keyword_raises_an_assertion_error_that_names_the_fix():
    with pytest.raises(AssertionError, match="did you mean 'heartbeat_interval'"):
        nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=["127.0.0.1:4150"],
                   heartbeat_intervall=5)
    with pytest.raises(AssertionError, match="unknown connection option 'foo'"):
        nsq.Writer(["127.0.0.1:4150"], foo=10)
    with pytest.raises(errors.ConfigError):
        nsq.AsyncConn("127.0.0.1", 4150, heartbeat_interval=0)


# -- BackoffTimer, events, LegacyReader ------------------------------------------------------

@pytest.mark.unit
def test_backoff_timer_steps_by_its_short_and_long_units():
    # range 10 s, ratio 0.5: short part 5 s in 2 steps (2.5), long part 5 s in 5 steps (1)
    t = nsq.BackoffTimer(0, 10, ratio=0.5, short_length=2, long_length=5)
    assert t.get_interval() == 0
    t.failure()
    assert t.get_interval() == pytest.approx(3.5)
    t.failure()
    assert t.get_interval() == pytest.approx(7.0)
    t.failure()  # the short part is full: only the long part grows
    assert t.get_interval() == pytest.approx(8.0)
    t.success()
    assert t.get_interval() == pytest.approx(4.5)


@pytest.mark.unit
@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), max_size=400), st.floats(0, 5), st.floats(0, 300))
def test_backoff_timer_stays_within_min_and_max(outcomes, low, span):
    t = nsq.BackoffTimer(low, low + span)
    for ok in outcomes:
        t.success() if ok else t.failure()
        assert low - 1e-9 <= t.get_interval() <= low + span + 1e-9


@pytest.mark.unit
def test_events_are_called_in_order_and_listeners_are_checked():
    calls = []
    e = EventedMixin()

    def first(**kw):
        calls.append(("first", kw))

    def second(**kw):
        calls.append(("second", kw))

    e.on("ready", first)
    e.on("ready", second)
    e.trigger("ready", conn=1)
    assert calls == [("first", {"conn": 1}), ("second", {"conn": 1})]
    with pytest.raises(DuplicateListenerError):
        e.on("ready", first)
    e.off("ready", first)
    with pytest.raises(InvalidListenerError):
        e.off("ready", first)
    e.trigger("ready", conn=2)
    assert calls[-1] == ("second", {"conn": 2}) and len(calls) == 3


@pytest.mark.unit
def test_legacy_reader_makes_one_reader_per_task_on_its_own_channel():
    tasks = {"a": lambda m: True, "b": lambda m: True}
    with pytest.warns(DeprecationWarning):
        lr = nsq.LegacyReader(tasks, "t", "ch", nsqd_tcp_addresses=["127.0.0.1:4150"])
    try:
        assert sorted(r.channel for r in lr.readers) == ["ch.a", "ch.b"]
    finally:
        for r in lr.readers:
            r.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        single = nsq.LegacyReader({"only": lambda m: True}, "t", "ch",
                                  nsqd_tcp_addresses=["127.0.0.1:4150"])
    assert [r.channel for r in single.readers] == ["ch"]
    single.readers[0].close()


@pytest.mark.unit
def test_writer_pub_off_the_loop_tells_the_callback_and_returns_a_failed_future():
    got = []
    w = nsq.Writer(["127.0.0.1:4150"])
    fut = w.pub("t", b"x", callback=lambda conn, data: got.append(data))
    assert isinstance(got[0], nsq.protocol.SendError) and "event loop" in str(got[0])
    assert fut.done() and fut.exception() is got[0]


# -- against a real nsqd ----------------------------------------------------------------------

def _topic(prefix: str) -> str:
    return f"{prefix}_{time.monotonic_ns()}"


@pytest.mark.nsqd
@pytest.mark.timeout(60)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_reader_heartbeat_hook_is_called_on_every_heartbeat(nsq_cluster):
    beats: list = []

    class HeartbeatReader(nsq.Reader):
        def heartbeat(self, conn):
            beats.append((conn, time.monotonic()))

    async def main() -> None:
        r = HeartbeatReader(_topic("hb"), "c", lambda m: True,
                            nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                            heartbeat_interval=1)
        await await_for(lambda: len(beats) >= 3, 10, "3 heartbeats")
        await r.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert all(conn.address == nsq_cluster.nsqd_tcp_addresses[0] for conn, _ in beats)
    gaps = [b[1] - a[1] for a, b in zip(beats, beats[1:])]
    assert all(0.5 < g < 2.0 for g in gaps), gaps  # one per second, none missed


@pytest.mark.nsqd
@pytest.mark.timeout(60)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_writer_heartbeat_hook_is_called_on_every_heartbeat(nsq_cluster):
    beats: list = []

    class HeartbeatWriter(nsq.Writer):
        def heartbeat(self, conn):
            beats.append(conn.address)

    async def main() -> None:
        w = HeartbeatWriter(nsq_cluster.nsqd_tcp_addresses, heartbeat_interval=1)
        assert await w.pub(_topic("whb"), b"x") == b"OK"  # connects
        await await_for(lambda: len(beats) >= 2, 10, "2 heartbeats")
        w.close()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert set(beats) == {nsq_cluster.nsqd_tcp_addresses[0]}


@pytest.mark.nsqd
@pytest.mark.timeout(60)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_reader_disabled_hook_holds_rdy_at_zero_until_it_returns_false(nsq_cluster):
    topic = _topic("disabled")
    http = nsq_cluster.nsqd_http_addresses[0]
    handled: list = []
    state = {"disabled": True}

    class PausedReader(nsq.Reader):
        @classmethod
        def disabled(cls):
            return state["disabled"]

    def ready_counts():
        topics = nsq_cluster.nsqds[0].stats(topic).get("topics") or []  # null before SUB
        return [cl["ready_count"] for t in topics for ch in t["channels"]
                for cl in ch["clients"] or []]

    async def main() -> None:
        r = PausedReader(topic, "c", lambda m: handled.append(m.body) or True,
                         nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=10,
                         rdy_redistribute_interval=0.2)
        await await_for(lambda: ready_counts() == [0], 10, "a subscribed client at RDY 0")
        publish(http, topic, [b"a", b"b", b"c"])
        await asyncio.sleep(1.5)  # several ticks: still nothing handled
        assert handled == [] and ready_counts() == [0]
        state["disabled"] = False
        await await_for(lambda: len(handled) == 3, 10, "the 3 messages after re-enabling")
        assert ready_counts() == [10]
        await r.aclose()

    asyncio.run(asyncio.wait_for(main(), 40))
    assert sorted(handled) == [b"a", b"b", b"c"]


@pytest.mark.nsqd
@pytest.mark.timeout(60)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_writer_calls_return_futures_and_every_error_reaches_the_callback(nsq_cluster):
    topic = _topic("wfut")
    calls: list = []

    def cb(conn, data):
        calls.append(data)

    @tornado.gen.coroutine
    def tornado_style(w):  # pynsq's documented way: yield the future in a coroutine
        result = yield w.pub(topic, b"from a tornado coroutine")
        return result

    async def main() -> None:
        w = nsq.Writer(nsq_cluster.nsqd_tcp_addresses)
        assert await w.pub(topic, b"one", callback=cb) == b"OK"
        assert await w.mpub(topic, [b"two", "thr\u00e9e"], callback=cb) == b"OK"
        assert await w.dpub(topic, 10, "four", callback=cb) == b"OK"
        assert await tornado_style(w) == b"OK"
        bad = w.pub("bad topic", b"x", callback=cb)  # does not raise
        with pytest.raises(errors.InvalidNameError):
            await bad
        empty = w.pub(topic, b"", callback=cb)
        with pytest.raises(errors.InvalidBodyError):
            await empty
        await w.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert calls[:3] == [b"OK"] * 3
    assert [type(e) for e in calls[3:]] == [errors.InvalidNameError, errors.InvalidBodyError]
    assert all(isinstance(e, nsq.protocol.Error) for e in calls[3:])
    t = [t for t in nsq_cluster.nsqds[0].stats(topic)["topics"] if t["topic_name"] == topic]
    assert t and t[0]["message_count"] == 5


@pytest.mark.nsqd
@pytest.mark.timeout(60)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_writer_str_body_arrives_utf8_encoded(nsq_cluster):
    topic = _topic("wstr")
    got: list = []

    async def main() -> None:
        w = nsq.Writer(nsq_cluster.nsqd_tcp_addresses)
        await w.pub(topic, "h\u00e9llo")
        await w.aclose()
        r = nsq.Reader(topic, "c", lambda m: got.append(m.body) or True,
                       nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
        await await_for(lambda: got, 10, "the message")
        await r.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert got == ["h\u00e9llo".encode("utf-8")]


@pytest.mark.nsqd
@pytest.mark.timeout(60)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_async_conn_events_against_nsqd(nsq_cluster):
    topic = _topic("aconn")
    publish(nsq_cluster.nsqd_http_addresses[0], topic, [b"m%d" % i for i in range(5)])
    host, port = nsq_cluster.nsqd_tcp_addresses[0].rsplit(":", 1)
    events: list = []
    messages: list = []
    errs: list = []

    async def main() -> None:
        c = nsq.AsyncConn(host, int(port), heartbeat_interval=5)
        for name in ("connect", "identify", "identify_response", "ready", "response",
                     "resume", "close"):
            c.on(name, lambda name=name, **kw: events.append((name, kw)))
        c.on("message", lambda conn, message: messages.append(message))
        c.on("error", lambda conn, error: errs.append(error))
        c.on("ready", lambda conn: (conn.send(nsq.subscribe(topic, "c")), conn.send_rdy(5)))
        c.connect()
        assert c.connecting()
        await await_for(lambda: len(messages) == 5, 10, "5 messages")
        assert c.connected() and c.in_flight == 5 and c.rdy == 5
        for m in messages:
            m.finish()
        assert c.in_flight == 0
        c.send(nsq.finish(MID))  # an id nsqd does not know: a non-fatal error frame
        await await_for(lambda: errs, 5, "the error event")
        c.close()
        await await_for(lambda: c.closed(), 5, "closed")

    asyncio.run(asyncio.wait_for(main(), 30))
    names = [n for n, _ in events]
    assert names[:4] == ["connect", "identify", "identify_response", "ready"]
    assert all(kw.get("conn") is not None for _, kw in events)
    identify_response = events[2][1]["data"]
    assert isinstance(identify_response, dict) and identify_response["max_rdy_count"] >= 5
    assert ("response", {"conn": events[0][1]["conn"], "data": b"OK"}) in events  # the SUB
    assert names.count("resume") == 5 and names[-1] == "close"
    assert sorted(m.body for m in messages) == [b"m%d" % i for i in range(5)]
    assert isinstance(errs[0], errors.FinFailedError) and isinstance(errs[0], nsq.Error)


@pytest.mark.nsqd
@pytest.mark.timeout(30)
def test_async_conn_that_cannot_connect_reports_a_send_error_and_closes():
    from nsq_spark.testing import free_port

    seen: list = []

    async def main() -> None:
        c = nsq.AsyncConn("127.0.0.1", free_port(), timeout=1.0)
        c.on("error", lambda conn, error: seen.append(error))
        c.on("close", lambda conn: seen.append("close"))
        c.connect()
        await await_for(lambda: "close" in seen, 10, "close")

    asyncio.run(main())
    assert isinstance(seen[0], nsq.protocol.SendError) and seen[1] == "close"


@pytest.mark.nsqd
@pytest.mark.timeout(30)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_sync_conn_speaks_frames_the_caller_drives(nsq_cluster):
    topic = _topic("sconn")
    publish(nsq_cluster.nsqd_http_addresses[0], topic, [b"sync body"])
    host, port = nsq_cluster.nsqd_tcp_addresses[0].rsplit(":", 1)
    c = nsq.SyncConn(timeout=5.0)
    c.connect(host, int(port))
    try:
        c.send(nsq.identify({"client_id": "sync", "feature_negotiation": False}))
        assert nsq.unpack_response(c.read_response()) == (nsq.FRAME_TYPE_RESPONSE, b"OK")
        c.send(nsq.subscribe(topic, "c"))
        assert nsq.unpack_response(c.read_response()) == (nsq.FRAME_TYPE_RESPONSE, b"OK")
        c.send(nsq.ready(1))
        frame_type, data = nsq.unpack_response(c.read_response())
        assert frame_type == nsq.FRAME_TYPE_MESSAGE
        msg = nsq.decode_message(data)
        assert msg.body == b"sync body" and msg.attempts == 1
        c.send(nsq.finish(msg.id))
        c.send(nsq.nop())
    finally:
        c.close()
