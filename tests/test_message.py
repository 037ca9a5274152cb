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
    m.requeue(delay=1500, backoff=False)
    assert r.calls == [("req", b"b" * 16, 1500, False)]


def test_async_flag_and_no_responder() -> None:
    m = Message(b"c" * 16, b"x", 1, 1)
    assert not m.is_async()
    m.enable_async()
    assert m.is_async()
    assert m.nsqd_address is None
    with pytest.raises(NSQError, match="no connection"):
        m.finish()
    assert "c" * 16 in repr(m)
