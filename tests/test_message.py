"""Message: pynsq-compatible response methods delegating to a Responder."""

from __future__ import annotations

import pytest

from nsq_spark.errors import AlreadyRespondedError, NSQError
from nsq_spark.message import Message, Responder

pytestmark = pytest.mark.unit


class Recorder:
    address = "127.0.0.1:4150"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_finish(self, msg: Message) -> None:
        self.calls.append(("fin", msg.id))

    def on_requeue(self, msg: Message, delay_ms: int | None, backoff: bool) -> None:
        self.calls.append(("req", msg.id, delay_ms, backoff))

    def on_touch(self, msg: Message) -> None:
        self.calls.append(("touch", msg.id))


def test_finish_then_second_response_raises() -> None:
    r = Recorder()
    assert isinstance(r, Responder)
    m = Message(b"a" * 16, b"body", 1, 1, r)
    assert not m.has_responded()
    m.touch()
    m.finish()
    assert m.has_responded()
    with pytest.raises(AlreadyRespondedError):
        m.finish()
    with pytest.raises(AlreadyRespondedError):
        m.requeue()
    with pytest.raises(AlreadyRespondedError):
        m.touch()
    assert r.calls == [("touch", b"a" * 16), ("fin", b"a" * 16)]
    assert m.nsqd_address == "127.0.0.1:4150"


def test_requeue_passes_delay_and_backoff() -> None:
    r = Recorder()
    m = Message(b"b" * 16, b"x", 1, 2, r)
    m.requeue(delay=1500, backoff=False)  # seconds, as in pynsq
    assert r.calls == [("req", b"b" * 16, 1_500_000, False)]


@pytest.mark.parametrize("kwargs,delay_ms", [
    ({}, None),                       # the responder's default policy
    ({"delay": None}, None),
    ({"delay": -1}, None),            # pynsq's "not given"
    ({"delay": 0}, 0),
    ({"delay": 2}, 2000),             # pynsq: time_ms = delay * 1000
    ({"delay": 0.25}, 250),
    ({"delay": 1.0005}, 1000),
    ({"delay_ms": 2}, 2),             # explicit milliseconds
    ({"delay_ms": 0}, 0),
])
def test_requeue_delay_is_seconds_and_converted_once(kwargs, delay_ms) -> None:
    r = Recorder()
    Message(b"d" * 16, b"x", 1, 1, r).requeue(**kwargs)
    assert r.calls == [("req", b"d" * 16, delay_ms, True)]


def test_requeue_delay_positional_is_seconds() -> None:
    r = Recorder()
    Message(b"e" * 16, b"x", 1, 1, r).requeue(3, False)
    assert r.calls == [("req", b"e" * 16, 3000, False)]


@pytest.mark.parametrize("kwargs,exc", [
    ({"delay": 1, "delay_ms": 1000}, TypeError),
    ({"delay": "2"}, TypeError),
    ({"delay": True}, TypeError),
    ({"delay_ms": -5}, ValueError),
])
def test_requeue_bad_delay_raises_and_leaves_message_unanswered(kwargs, exc) -> None:
    r = Recorder()
    m = Message(b"f" * 16, b"x", 1, 1, r)
    with pytest.raises(exc):
        m.requeue(**kwargs)
    assert not m.has_responded() and r.calls == []
    m.requeue(delay=1)
    assert r.calls == [("req", b"f" * 16, 1000, True)]


def test_async_flag_and_no_responder() -> None:
    m = Message(b"c" * 16, b"x", 1, 1)
    assert not m.is_async()
    m.enable_async()
    assert m.is_async()
    assert m.nsqd_address is None
    with pytest.raises(NSQError, match="no connection"):
        m.finish()
    assert "c" * 16 in repr(m)


def test_messages_are_hashable_by_identity_as_in_pynsq() -> None:
    """pynsq's Message is hashable (identity): code keeping messages in sets or as dict keys
    (pending batches) must work, and two deliveries of the same contents stay distinct."""
    from nsq_spark import protocol
    from nsq_spark.protocol import FrameDecoder, encode_message_frame

    frame = encode_message_frame(b"0123456789abcdef", b"same", 7, 1)
    a = FrameDecoder().feed(frame)[0][0]
    b = protocol.decode_message(frame[8:])
    assert (a.id, a.body, a.timestamp, a.attempts) == (b.id, b.body, b.timestamp, b.attempts)
    assert a is not b and a != b and a == a
    pending = {a, b}
    assert len(pending) == 2 and a in pending and b in pending
    answered = {a: "fin"}
    assert answered.get(a) == "fin" and b not in answered
    r = Recorder()
    m = Message(b"f" * 16, b"x", 1, 1, r)
    keep = {m}
    m.finish()  # answering changes its state, not its hash
    assert m in keep and hash(m) == hash(m)
