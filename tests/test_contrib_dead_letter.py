"""nsq_spark.contrib.dead_letter: the record format (pure, property-tested), the hook's
rule against a fake producer typed as the port (FIN only after the copy is acknowledged,
REQ without backoff when it fails), and end to end against real nsqd: a handler that
always fails lands on the dead-letter topic with its attempts and reason and leaves the
source channel; a dead-letter nsqd that is down gets the message requeued, then
delivered once it is back."""

from __future__ import annotations

import concurrent.futures
import json
import logging
from typing import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_spark._consumer.reader import Reader
from nsq_spark.contrib.dead_letter import (MAGIC, MAX_REASON_CHARS, DeadLetter,
                                           DeadLetterFormatError, DeadLetterPublisher,
                                           DeadLetterRecord, read_dead_letter)
from nsq_spark.errors import ConfigError, InvalidNameError, NSQError
from nsq_spark.message import Message
from nsq_spark._publish.producer import Producer
from nsq_spark.testing import wait_until

# -- fakes, typed against the ports they stand for ------------------------------------------


class FakeResponder:
    """A Responder that records the answers (message.Responder)."""

    def __init__(self, address: str = "127.0.0.1:4150") -> None:
        self.address = address
        self.answers: list[tuple[str, int | None, bool]] = []

    def on_finish(self, msg: Message) -> None:
        self.answers.append(("FIN", None, False))

    def on_requeue(self, msg: Message, delay_ms: int | None, backoff: bool) -> None:
        self.answers.append(("REQ", delay_ms, backoff))

    def on_touch(self, msg: Message) -> None:
        self.answers.append(("TOUCH", None, False))


class FakePublisher:
    """A producer whose futures the test settles by hand."""

    def __init__(self, raises: Exception | None = None) -> None:
        self.nsqd_tcp_addresses: list[str] = ["127.0.0.1:9"]
        self.nsqd_http_addresses: list[str] = []
        self.raises = raises
        self.sent: list[tuple[str, bytes, concurrent.futures.Future[bytes]]] = []
        self.closed = False

    def publish_async(self, topic: str, body: bytes, defer_ms: int | None = None
                      ) -> concurrent.futures.Future[bytes]:
        if self.raises is not None:
            raise self.raises
        fut: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        self.sent.append((topic, body, fut))
        return fut

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


def _as_port(p: FakePublisher) -> DeadLetterPublisher:
    return p  # mypy checks the fake against the port here


def _producer_as_port(p: Producer) -> DeadLetterPublisher:
    return p  # and the real Producer


# mypy checks the fake and the Producer against DeadLetterPublisher above, with a
# drifted fake that must fail: tests/test_typing.py (the suite's one mypy run)


def message(attempts: int = 3, body: bytes = b"payload",
            responder: FakeResponder | None = None) -> tuple[Message, FakeResponder]:
    r = responder or FakeResponder()
    return Message(b"0123456789abcdef", body, 1_700_000_000_000_000_000, attempts, r), r


# -- the record format ----------------------------------------------------------------------

unit = pytest.mark.unit

records = st.builds(
    DeadLetterRecord,
    id=st.text(alphabet="0123456789abcdef", min_size=16, max_size=16),
    attempts=st.integers(1, 65535),
    reason=st.text(max_size=200),
    topic=st.none() | st.from_regex(r"[a-z_.-]{1,64}", fullmatch=True),
    channel=st.none() | st.from_regex(r"[a-z_.-]{1,64}", fullmatch=True),
    nsqd_address=st.none() | st.just("127.0.0.1:4150") | st.just("[::1]:4150"),
    timestamp=st.integers(0, 2**63 - 1),
    given_up_at=st.integers(0, 2**63 - 1),
    body=st.binary(max_size=300))


@unit
@given(records)
def test_a_record_reads_back_as_written_whatever_its_body_and_reason(record):
    data = record.encode()
    assert read_dead_letter(data) == record
    # the body follows the header line unchanged: a redrive is a slice
    assert data.endswith(record.body) and data.startswith(MAGIC)
    assert data.index(b"\n") == len(data) - len(record.body) - 1


@unit
def test_the_header_is_one_line_of_json_with_the_spark_column_names():
    m, _ = message(body=b"line one\nline two")
    rec = DeadLetterRecord.from_message(m, "ValueError: bad\nnews", "orders", "billing",
                                        given_up_at=5)
    header, _, body = rec.encode()[len(MAGIC):].partition(b"\n")
    assert body == b"line one\nline two"
    assert json.loads(header) == {
        "id": "0123456789abcdef", "attempts": 3, "reason": "ValueError: bad\nnews",
        "topic": "orders", "channel": "billing", "nsqd_address": "127.0.0.1:4150",
        "timestamp": 1_700_000_000_000_000_000, "given_up_at": 5}


@unit
def test_a_long_reason_is_cut():
    m, _ = message()
    rec = DeadLetterRecord.from_message(m, "x" * (MAX_REASON_CHARS + 50))
    assert len(rec.reason) == MAX_REASON_CHARS


@unit
@pytest.mark.parametrize("data, says", [
    (b"just a body", "does not start with"),
    (MAGIC + b'{"id": "x"}', "no end"),
    (MAGIC + b"{not json\nbody", "not JSON"),
    (MAGIC + b"[1, 2]\nbody", "not a JSON object"),
    (MAGIC + b'{"id": "x", "attempts": "3"}\nbody', "'attempts'"),
])
def test_what_is_not_a_record_is_refused_with_the_reason(data, says):
    with pytest.raises(DeadLetterFormatError, match=says):
        read_dead_letter(data)


# -- the hook's rule, against a fake producer ----------------------------------------------


@unit
def test_the_message_is_finished_only_after_the_copy_is_acknowledged():
    pub = FakePublisher()
    dead = DeadLetter("orders.dead", _as_port(pub), source_topic="orders",
                      source_channel="billing")
    m, r = message()
    dead(m)
    assert m.is_async() and r.answers == []  # nothing answered while nsqd has not answered
    topic, body, fut = pub.sent[0]
    rec = read_dead_letter(body)
    assert (topic, rec.reason, rec.attempts, rec.topic, rec.channel, rec.body) == \
        ("orders.dead", "max_tries", 3, "orders", "billing", b"payload")
    fut.set_result(b"OK")
    assert r.answers == [("FIN", None, False)] and dead.dead_lettered == 1


@unit
def test_a_failed_publish_requeues_without_backoff_and_logs_the_nsqd(caplog):
    pub = FakePublisher()
    dead = DeadLetter("orders.dead", _as_port(pub), requeue_delay=2)
    m, r = message()
    dead(m)
    with caplog.at_level(logging.ERROR, "nsq_spark.contrib.dead_letter"):
        pub.sent[0][2].set_exception(NSQError("connection refused"))
    assert r.answers == [("REQ", 2000, False)] and dead.failed == 1
    assert "127.0.0.1:9" in caplog.text and "connection refused" in caplog.text


@unit
@given(st.lists(st.sampled_from(["ack", "error", "cancel", "raise"]), min_size=1,
                max_size=20))
def test_every_given_up_message_gets_one_answer_fin_only_after_an_ack(outcomes):
    pub = FakePublisher()
    dead = DeadLetter("orders.dead", _as_port(pub))
    answered = []
    for outcome in outcomes:
        pub.raises = NSQError("closed") if outcome == "raise" else None
        m, r = message()
        dead(m)
        if outcome != "raise":
            assert r.answers == []  # nothing before the publish settles
            fut = pub.sent[-1][2]
            if outcome == "ack":
                fut.set_result(b"OK")
            elif outcome == "error":
                fut.set_exception(NSQError("E_BAD_MESSAGE"))
            else:
                fut.cancel()
        answered.append(r.answers)
    assert [len(a) for a in answered] == [1] * len(outcomes)
    assert [a[0][0] == "FIN" for a in answered] == [o == "ack" for o in outcomes]
    assert dead.dead_lettered == outcomes.count("ack")
    assert dead.failed == len(outcomes) - outcomes.count("ack")


@unit
def test_a_publish_that_raises_at_once_requeues_too():
    dead = DeadLetter("orders.dead", _as_port(FakePublisher(raises=NSQError("closed"))))
    m, r = message()
    dead(m)
    assert r.answers == [("REQ", None, False)] and dead.failed == 1


@unit
def test_watch_makes_the_handler_s_last_failure_the_reason():
    pub = FakePublisher()
    dead = DeadLetter("orders.dead", _as_port(pub))
    calls = []

    def handler(msg: Message) -> bool:
        calls.append(msg.attempts)
        if msg.attempts == 1:
            return False
        raise ValueError("no price")
    watched = dead.watch(handler)
    m1, _ = message(attempts=1)
    assert watched(m1) is False
    assert dead.reason_for(m1) == "handler returned False"
    m2, _ = message(attempts=2)
    with pytest.raises(ValueError):
        watched(m2)
    dead(message(attempts=3)[0])
    assert read_dead_letter(pub.sent[0][1]).reason == "ValueError: no price"
    # a failed publish keeps the reason for the next give-up; a success forgets it
    pub.sent[0][2].set_exception(NSQError("down"))
    assert dead.reason_for(m1) == "ValueError: no price"
    dead(message(attempts=4)[0])
    pub.sent[1][2].set_result(b"OK")
    assert dead.reason_for(m1) == "max_tries" and calls == [1, 2]


@unit
def test_watch_wraps_coroutine_handlers_too():
    import asyncio

    dead = DeadLetter("orders.dead", _as_port(FakePublisher()))

    async def handler(msg: Message) -> None:
        raise KeyError("sku")
    m, _ = message()
    with pytest.raises(KeyError):
        asyncio.run(dead.watch(handler)(m))
    assert dead.reason_for(m) == "KeyError: 'sku'"


@unit
def test_watch_sees_the_failure_inside_an_async_call_method():
    """An object whose ``__call__`` is ``async def`` is a coroutine handler too: the
    wrapper awaits it, so what it raises or returns reaches the record's reason."""
    import asyncio
    import inspect

    class PriceCheck:
        async def __call__(self, msg: Message) -> bool:
            if msg.attempts == 1:
                return False
            raise LookupError("no price list")

    pub = FakePublisher()
    dead = DeadLetter("orders.dead", _as_port(pub))
    watched = dead.watch(PriceCheck())
    assert inspect.iscoroutinefunction(watched)
    m1, _ = message(attempts=1)
    assert asyncio.run(watched(m1)) is False
    assert dead.reason_for(m1) == "handler returned False"
    m2, _ = message(attempts=2)
    with pytest.raises(LookupError):
        asyncio.run(watched(m2))
    dead(message(attempts=3)[0])
    assert read_dead_letter(pub.sent[0][1]).reason == "LookupError: no price list"


@unit
def test_reasons_are_bounded():
    dead = DeadLetter("d", _as_port(FakePublisher()), remember_reasons=2)
    msgs = [Message(b"%016d" % i, b"b", 0, 1, FakeResponder()) for i in range(3)]
    for m in msgs:
        dead.note_failure(m, "r")
    assert [dead.reason_for(m) for m in msgs] == ["max_tries", "r", "r"]


@unit
def test_attach_sets_the_hook_and_the_source():
    dead = DeadLetter("d", _as_port(FakePublisher()))
    r = Reader("orders", "billing", lambda m: True, nsqd_tcp_addresses=["127.0.0.1:9"])
    try:
        assert dead.attach(r) is dead and r.giving_up is dead
        assert (dead.source_topic, dead.source_channel) == ("orders", "billing")
    finally:
        r.close()


@unit
@pytest.mark.parametrize("kwargs, error, says", [
    (dict(topic="bad topic", producer=FakePublisher()), InvalidNameError,
     "invalid topic name 'bad topic'"),
    (dict(topic="d", producer=FakePublisher(), source_topic="x" * 65), InvalidNameError,
     "invalid topic name 'x{65}'"),
    (dict(topic="d", producer=FakePublisher(), source_channel="bad channel"),
     InvalidNameError, "invalid channel name 'bad channel'"),
    (dict(topic="d"), ConfigError, "one of them"),
    (dict(topic="d", producer=FakePublisher(), nsqd_tcp_addresses="127.0.0.1:9"),
     ConfigError, "one of them"),
    (dict(topic="d", producer=FakePublisher(), spool_dir="/tmp/x"), ConfigError,
     "set them on that Producer"),
    (dict(topic="d", producer=FakePublisher(), requeue_delay=-1), ConfigError,
     "requeue_delay"),
    (dict(topic="d", producer=FakePublisher(), remember_reasons=-1), ConfigError,
     "remember_reasons"),
    (dict(topic="d", nsqd_tcp_addresses="127.0.0.1:9", publish_timeout=0), ConfigError,
     "publish_timeout"),
])
def test_bad_options_name_the_parameter(kwargs, error, says):
    with pytest.raises(error, match=says):
        DeadLetter(**kwargs)


@unit
def test_close_closes_only_a_producer_it_built():
    pub = FakePublisher()
    with DeadLetter("d", _as_port(pub)):
        pass
    assert not pub.closed


@unit
@pytest.mark.timeout(60)
def test_the_reader_holds_a_given_up_message_until_the_copy_is_settled():
    """The Reader's gate honours enable_async() in giving_up as in a handler: in flight
    and unanswered until the publish settles; close() requeues one still held."""
    import asyncio

    from fake_nsqd import FakeConnections

    async def main() -> None:
        pub = FakePublisher()
        dead = DeadLetter("orders.dead", _as_port(pub))
        nsqd = FakeConnections()
        r = Reader("t", "c", lambda m: True, nsqd_tcp_addresses="127.0.0.1:4150",
                   max_in_flight=10, max_tries=2, max_backoff_duration=0,
                   drain_timeout=0.1, connection_factory=nsqd)
        dead.attach(r)
        for _ in range(100):
            await asyncio.sleep(0)
            if r.conns:
                break
        [c] = nsqd.made
        first, second = c.deliver(2, attempts=3)
        await asyncio.sleep(0.01)
        assert len(pub.sent) == 2 and c.fins() == [] and c.reqs() == []
        assert r.stats()["in_flight"] == 2
        pub.sent[0][2].set_result(b"OK")  # from the producer's thread in real life
        for _ in range(100):
            await asyncio.sleep(0.005)
            if c.fins():
                break
        assert c.fins() == [first.id] and r.stats()["in_flight"] == 1
        await r.aclose()  # the unsettled one goes back to nsqd
        assert [i for i, _ in c.reqs()] == [second.id]
    asyncio.run(asyncio.wait_for(main(), 20))


# -- against real nsqd ---------------------------------------------------------------------

T, C, DLQ = "dl_src", "dl_ch", "dl_dead"


def _collect(running_reader, addresses: Sequence[str]) -> list[DeadLetterRecord]:
    got: list[DeadLetterRecord] = []

    def keep(m: Message) -> bool:
        got.append(read_dead_letter(m.body))
        return True
    running_reader.start(DLQ, "audit", keep, nsqd_tcp_addresses=list(addresses))
    return got


@pytest.mark.nsqd
@pytest.mark.timeout(60)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_a_message_that_always_fails_lands_on_the_dead_letter_topic(nsq_cluster,
                                                                     running_reader):
    addrs = nsq_cluster.nsqd_tcp_addresses
    nsq_cluster.publish(T, [b"poison", b"fine"])

    def handler(m: Message) -> bool:
        if m.body == b"poison":
            raise ValueError("cannot parse poison")
        return True

    with DeadLetter(DLQ, nsqd_tcp_addresses=addrs) as dead:
        got = _collect(running_reader, addrs)
        r = running_reader.start(T, C, dead.watch(handler), max_tries=2,
                                 max_backoff_duration=0, requeue_delay=0.05,
                                 nsqd_tcp_addresses=addrs)
        dead.attach(r)
        wait_until(lambda: got, 20, "the dead-letter record")
        nsq_cluster.wait_drained(T, C)  # gone from the source channel
        running_reader.stop(r)
    [rec] = got
    assert (rec.body, rec.attempts, rec.reason, rec.topic, rec.channel, rec.nsqd_address) \
        == (b"poison", 3, "ValueError: cannot parse poison", T, C, addrs[0])
    assert dead.dead_lettered == 1 and dead.failed == 0 and r.given_up == 1


@pytest.mark.nsqd
@pytest.mark.timeout(90)
@pytest.mark.nsq_cluster(nsqd=2, lookupd=0)
def test_a_dead_letter_nsqd_that_is_down_gets_the_message_requeued_not_lost(
        nsq_cluster, running_reader, caplog):
    source, dlq = nsq_cluster.nsqd_tcp_addresses
    nsq_cluster.kill(1)  # the dead-letter nsqd
    nsq_cluster.publish(T, b"poison")
    with caplog.at_level(logging.ERROR, "nsq_spark.contrib.dead_letter"), \
            DeadLetter(DLQ, nsqd_tcp_addresses=dlq, publish_timeout=0.5,
                       requeue_delay=0.1) as dead:
        r = running_reader.start(T, C, dead.watch(lambda m: False), max_tries=1,
                                 max_backoff_duration=0, requeue_delay=0.05,
                                 nsqd_tcp_addresses=[source])
        dead.attach(r)
        wait_until(lambda: dead.failed >= 2, 20, "two failed dead-letter publishes")
        # requeued, not finished: still held by the source channel
        c = nsq_cluster.nsqds[0].channel_stats(T, C)
        assert c["depth"] + c["in_flight_count"] + c["deferred_count"] == 1, c
        assert c["requeue_count"] >= 2
        assert dlq in caplog.text
        nsq_cluster.restart(1)
        got = _collect(running_reader, [dlq])
        wait_until(lambda: got, 30, "the record once the dead-letter nsqd is back")
        nsq_cluster.wait_drained(T, C)
        running_reader.stop(r)
    assert got[0].body == b"poison" and got[0].reason == "handler returned False"
    assert got[0].attempts >= 4 and dead.dead_lettered == 1


@pytest.mark.nsqd
@pytest.mark.timeout(90)
@pytest.mark.nsq_cluster(nsqd=2, lookupd=0)
def test_with_a_spool_the_message_is_finished_once_spooled_and_delivered_later(
        nsq_cluster, running_reader, tmp_path):
    source, dlq = nsq_cluster.nsqd_tcp_addresses
    nsq_cluster.kill(1)  # the dead-letter nsqd is down: the spool keeps the record
    nsq_cluster.publish(T, b"poison")
    with DeadLetter(DLQ, nsqd_tcp_addresses=dlq, spool_dir=tmp_path / "spool") as dead:
        r = running_reader.start(T, C, lambda m: False, max_tries=1, max_backoff_duration=0,
                                 requeue_delay=0.05, nsqd_tcp_addresses=[source])
        dead.attach(r)
        wait_until(lambda: dead.dead_lettered == 1, 20, "the record spooled")
        nsq_cluster.wait_drained(T, C)  # FINished while the dead-letter nsqd is still down
        assert dead.failed == 0 and not nsq_cluster.nsqds[1].running
        nsq_cluster.restart(1)
        got = _collect(running_reader, [dlq])
        wait_until(lambda: got, 30, "the spooled record once the dead-letter nsqd is back")
        running_reader.stop(r)
    assert (got[0].body, got[0].attempts, got[0].reason) == (b"poison", 2, "max_tries")
