"""The Producer's shape, the same in every mode, without nsqd: its signature, spool mode
as a Producer (blocking, futures, asyncio, ``async with``), the one body rule, and the
pure parts it is built from (command sizes, counters and up/down transitions, the retry
policy, the loop thread)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

import nsq_spark
from nsq_spark import Producer, protocol
from nsq_spark._loop import LoopThread
from nsq_spark.errors import ConfigError, ConnectError, InvalidAddressError, InvalidBodyError
from nsq_spark.errors import BadTopicError
from nsq_spark._retry import RetryPolicy
from nsq_spark._publish.stats import PublishStats, command_size

pytestmark = pytest.mark.unit


class Recorder:
    """Stands in for the direct Producer the spool sends through."""

    def __init__(self) -> None:
        self.got: list[tuple[str, bytes, int | None]] = []
        self.closed = 0

    def publish(self, topic, body, defer_ms=None):
        self.got.append((topic, body, defer_ms))

    def mpublish(self, topic, bodies):
        self.got.extend((topic, b, None) for b in bodies)

    def close(self):
        self.closed += 1


# -- one class with a real signature ------------------------------------------------------


def test_the_signature_lists_every_parameter():
    params = inspect.signature(nsq_spark.Producer).parameters
    for name in ("nsqd_tcp_addresses", "nsqd_http_addresses", "strategy", "max_tries",
                 "publish_timeout", "spool_dir", "spool_fsync", "spool_max_bytes",
                 "message_id_digest", "batch_size", "on_rejected", "producer_factory"):
        assert name in params, name
    assert params["spool_dir"].default is None
    assert params["spool_fsync"].default == "always"
    assert list(params)[-1] == "connection_options"


def test_a_spooling_producer_is_a_producer_with_the_whole_api(tmp_path):
    sender = Recorder()
    p = nsq_spark.Producer(spool_dir=tmp_path, producer_factory=lambda: sender)
    try:
        assert isinstance(p, Producer) and type(p) is Producer
        for name in ("publish", "mpublish", "publish_async", "mpublish_async", "apublish",
                     "ampublish", "publish_nowait", "flush", "close", "aclose", "stats",
                     "__enter__", "__aenter__"):
            assert callable(getattr(p, name)), name
        p.publish("t", b"blocking")
        fut = p.publish_async("t", b"future")
        assert isinstance(fut, concurrent.futures.Future) and fut.result(5) == b"OK"
        assert p.mpublish_async("t", [b"m1", b"m2"]).result(5) == b"OK"
        assert p.flush(5)
    finally:
        p.close()
    assert [b for _, b, _ in sender.got] == [b"blocking", b"future", b"m1", b"m2"]
    assert sender.closed == 1


def test_async_with_a_spooling_producer(tmp_path):
    sender = Recorder()

    async def main() -> None:
        async with Producer(spool_dir=tmp_path, producer_factory=lambda: sender) as p:
            await p.apublish("t", b"a1")
            await p.ampublish("t", [b"a2", b"a3"])
            assert await p.publish_nowait("t", b"a4", defer_ms=10) == b"OK"
            await asyncio.wrap_future(p.publish_async("t", b"a5"))
            assert await asyncio.to_thread(p.flush, 5)

    asyncio.run(main())
    assert sender.got == [("t", b"a1", None), ("t", b"a2", None), ("t", b"a3", None),
                          ("t", b"a4", 10), ("t", b"a5", None)]
    assert not list(tmp_path.glob("*.seg"))


def test_a_spooling_publish_nowait_returns_a_future_already_settled(tmp_path):
    sender = Recorder()
    p = Producer(spool_dir=tmp_path, producer_factory=lambda: sender)

    async def main() -> None:
        fut = p.publish_nowait("t", b"n1")
        assert fut.done() and fut.result() == b"OK"   # no loop turn needed
        with pytest.raises(InvalidBodyError):
            p.publish_nowait("t", b"")                # bad input raises in the call
        await asyncio.to_thread(p.close)
        late = p.publish_nowait("t", b"late")
        assert late.done() and isinstance(late.exception(), nsq_spark.errors.NSQError)

    try:
        asyncio.run(main())
    finally:
        p.close()
    assert sender.got == [("t", b"n1", None)]


def test_publish_nowait_outside_a_running_loop_raises_before_spooling(tmp_path):
    sender = Recorder()
    direct = Producer("127.0.0.1:1")
    spooled = Producer(spool_dir=tmp_path, producer_factory=lambda: sender)
    try:
        for p in (direct, spooled):
            with pytest.raises(RuntimeError, match="no running event loop"):
                p.publish_nowait("t", b"no loop")
        assert spooled.spool_stats.appended == 0
    finally:
        direct.close()
        spooled.close()
    assert sender.got == []


def test_closed_spooling_producer_refuses_and_keeps_nothing_half_done(tmp_path):
    sender = Recorder()
    p = Producer(spool_dir=tmp_path, producer_factory=lambda: sender)
    p.close()
    with pytest.raises(nsq_spark.errors.NSQError, match="closed"):
        p.publish("t", b"late")
    assert p.publish_async("t", b"late").exception(1) is not None
    p.close()   # twice is fine


# -- one body rule ------------------------------------------------------------------------

BAD_BODIES = [("str", "text"), ("int", 12), ("empty", b""), ("none", None)]


def _producers(tmp_path):
    yield "tcp", Producer("127.0.0.1:1", max_tries=1)
    yield "http", Producer(nsqd_http_addresses="127.0.0.1:1", max_tries=1)
    yield "spool", Producer("127.0.0.1:1", spool_dir=tmp_path / "s", max_tries=1)


@pytest.mark.parametrize("kind,body", BAD_BODIES, ids=[k for k, _ in BAD_BODIES])
def test_the_same_bad_body_is_refused_the_same_way_in_every_mode(tmp_path, kind, body):
    messages: dict[int, set[str]] = {}
    for mode, p in _producers(tmp_path):
        try:
            calls = [lambda: p.publish("t", body), lambda: p.mpublish("t", [b"ok", body]),
                     lambda: p.publish_async("t", body),
                     lambda: p.mpublish_async("t", [body]),
                     lambda: asyncio.run(p.apublish("t", body)),
                     lambda: asyncio.run(p.ampublish("t", [body]))]
            for i, call in enumerate(calls):
                with pytest.raises(InvalidBodyError) as info:
                    call()
                messages.setdefault(i, set()).add(str(info.value))
        finally:
            p.close(timeout=0)
    # one rule: each form of the call says the same in every mode
    assert all(len(m) == 1 for m in messages.values()), messages
    assert not list((tmp_path / "s").glob("*.seg"))  # nothing spooled


def test_bodies_over_max_msg_size_are_refused_before_spooling(tmp_path):
    p = Producer(spool_dir=tmp_path, producer_factory=Recorder, max_msg_size=4)
    try:
        with pytest.raises(InvalidBodyError, match="over the limit of 4 bytes"):
            p.publish("t", b"12345")
        p.publish("t", bytearray(b"1234"))       # bytes-like bodies are fine
        assert p.spool_stats.appended == 1
    finally:
        p.close()


# -- typed errors for bad options ---------------------------------------------------------


def test_bad_addresses_name_the_parameter():
    with pytest.raises(InvalidAddressError, match="nsqd_tcp_addresses"):
        Producer("127.0.0.1")
    with pytest.raises(InvalidAddressError, match="nsqd_http_addresses"):
        Producer(nsqd_http_addresses="ftp://127.0.0.1:4151")
    p = Producer("[::1]:4150, 127.0.0.1:4150")
    assert p.nsqd_tcp_addresses == ["[::1]:4150", "127.0.0.1:4150"]
    p.close()


@pytest.mark.parametrize("kwargs,match", [
    ({}, "nsqd_tcp_addresses or nsqd_http_addresses"),
    ({"strategy": "random"}, "strategy"),
    ({"max_tries": 0}, "max_tries"),
    ({"blocking_connections": 0}, "blocking_connections"),
    ({"batch_size": 10}, "batch_size only applies to a spooling producer"),
])
def test_bad_options_are_config_errors(kwargs, match):
    address = () if not kwargs else ("127.0.0.1:4150",)
    with pytest.raises(ConfigError, match=match):
        Producer(*address, **kwargs)


def test_a_bad_inner_option_fails_at_construction_not_in_the_drain(tmp_path):
    with pytest.raises(ConfigError):
        Producer("127.0.0.1:4150", spool_dir=tmp_path, no_such_option=1)
    assert not list(tmp_path.glob("*.seg"))


# -- counters and transitions -------------------------------------------------------------


@given(bodies=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=30),
       topic=st.from_regex(r"[a-z]{1,20}", fullmatch=True))
def test_command_size_counts_messages_and_body_bytes(bodies, topic):
    assert command_size(protocol.mpub(topic, bodies)) == (len(bodies), sum(map(len, bodies)))
    assert command_size(protocol.pub(topic, bodies[0])) == (1, len(bodies[0]))
    assert command_size(protocol.dpub(topic, 1500, bodies[0])) == (1, len(bodies[0]))


def test_down_and_up_are_logged_once_per_transition(caplog):
    stats = PublishStats(logging.getLogger("nsq_spark.producer"))
    with caplog.at_level(logging.INFO, logger="nsq_spark.producer"):
        stats.up("a:1")                                  # first contact: nothing to say
        for _ in range(5):
            stats.down("a:1", ConnectError("refused"))   # five failed attempts
        stats.up("a:1")
        stats.up("a:1")
        stats.down("a:1", ConnectError("lost"))
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "INFO", "WARNING"]
    assert "a:1" in lines[0][1] and "refused" in lines[0][1]
    assert "a:1" in lines[1][1] and "lost" in lines[2][1]
    snap = stats.snapshot()
    assert snap["nsqd"]["a:1"]["up"] is False and snap["nsqd"]["a:1"]["last_error"] == "lost"


def test_stats_count_messages_bytes_and_failures():
    stats = PublishStats(logging.getLogger("test"))
    stats.acked(protocol.mpub("t", [b"ab", b"cde"]), "a:1")
    stats.acked(protocol.pub("t", b"xyz"), "b:2")
    stats.failed(protocol.mpub("t", [b"1", b"2", b"3"]))
    stats.retried()
    snap = stats.snapshot()
    assert {k: snap[k] for k in ("messages", "bytes", "retries", "errors", "commands")} == \
        {"messages": 3, "bytes": 8, "retries": 1, "errors": 3, "commands": 2}
    assert snap["nsqd"]["a:1"]["messages"] == 2 and snap["nsqd"]["b:2"]["bytes"] == 3


def test_retry_policy_retries_transient_failures_only():
    policy = RetryPolicy(max_tries=3, deadline=None, wait=0.001, max_wait=0.001)
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectError("refused")
        return "ok"

    assert policy.retrying()(flaky) == "ok" and len(calls) == 3
    refused = []

    def bad_topic() -> None:
        refused.append(1)
        raise BadTopicError("E_BAD_TOPIC")

    with pytest.raises(BadTopicError):
        policy.retrying()(bad_topic)
    assert len(refused) == 1
    stop = threading.Event()
    stop.set()
    with pytest.raises(ConnectError):       # a set stop event ends retrying at once
        RetryPolicy(max_tries=None, deadline=None).retrying(stop_event=stop)(
            lambda: (_ for _ in ()).throw(ConnectError("refused")))


def test_loop_thread_runs_coroutines_and_stops():
    io = LoopThread("test-loop")

    async def where() -> bool:
        return io.in_loop_thread()

    assert io.run_coroutine(where()).result(5) is True
    done = threading.Event()
    io.call_soon(done.set)
    assert done.wait(5)
    assert io.stop(5) and io.loop.is_closed() and not io.thread.is_alive()
    assert io.stop(5)          # twice is fine


def test_max_tries_defaults_to_the_deadline_and_to_1_inside_a_spool(tmp_path):
    direct = Producer("127.0.0.1:4150")
    spooling = Producer("127.0.0.1:4150", spool_dir=tmp_path)
    try:
        # no count: the retry budget is retry_deadline (an nsqd restart costs no error)
        retry = direct._transport.retry
        assert direct.max_tries is None and retry.max_tries is None
        assert retry.deadline == direct.retry_deadline
        # the spool's sender fails fast: the drain retries without end itself
        assert spooling.max_tries == 1 and spooling._transport.drain.sender.retry.max_tries == 1
    finally:
        direct.close()
        spooling.close(timeout=0)
    explicit = Producer("127.0.0.1:4150", spool_dir=tmp_path, max_tries=3)
    try:
        assert explicit._transport.drain.sender.retry.max_tries == 3
    finally:
        explicit.close(timeout=0)
