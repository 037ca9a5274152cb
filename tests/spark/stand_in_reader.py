"""The Reader stand-ins of the Spark unit tests (the fetch task's, and the least thing
the reader cache holds), in a module of its own so that tests/test_typing.py checks them
with ``mypy --strict`` against the ports they stand in for
(:class:`~nsq_spark.spark._fetch_task.ReaderPort`, and the reader cache's
:class:`~nsq_spark.spark._reader_cache.Pausable`); a stand-in that drifts fails there."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from nsq_spark.message import Message
from nsq_spark.protocol import FrameDecoder, MessageBlock, encode_message_frame
from nsq_spark.spark._fetch_task import ReaderPort
from nsq_spark.spark._reader_cache import Pausable

__all__ = ["Addr", "Paused", "StandInReader", "as_pausable"]


class StandInReader:
    """The Reader's block pull API over a list of messages (each get_blocks call encodes
    them as nsqd would and decodes them into a real MessageBlock); records FIN/REQ in the
    shared ``log``. Typed against the fetch task's port (:data:`_PORT_CHECK`)."""

    def __init__(self, queue: list[Message], log: list[Any],
                 fail_after_gets: int | None = None,
                 max_in_flight: int | None = None) -> None:
        self.queue, self.log, self.gets = queue, log, 0
        self.fail_after_gets = fail_after_gets
        self.closed = False
        self.deferred: list[Message] = []  # requeued with a delay
        # nsqd's rule when given: no more un-answered messages than max_in_flight
        self.max_in_flight, self.outstanding = max_in_flight, 0

    def set_max_in_flight(self, max_in_flight: int) -> None:
        self.log.append(("MIF", max_in_flight))
        self.max_in_flight = max_in_flight

    def get_blocks(self, max_messages: int = 1000, timeout: float = 1.0, *,
                   max_bytes: int | None = None) -> list[MessageBlock]:
        if self.fail_after_gets is not None and self.gets >= self.fail_after_gets:
            raise ConnectionError("stand-in: task dies here")
        self.gets += 1
        if self.max_in_flight is not None:
            max_messages = min(max_messages, max(0, self.max_in_flight - self.outstanding))
        if max_bytes is not None:  # the Reader's rule: the body that reaches it is last
            taken = 0
            for k, m in enumerate(self.queue[:max_messages]):
                taken += len(m.body)
                if taken >= max_bytes:
                    max_messages = k + 1
                    break
        out, self.queue[:] = self.queue[:max_messages], self.queue[max_messages:]
        self.outstanding += len(out)
        if not out:
            return []
        frames = b"".join(encode_message_frame(m.id, m.body, m.timestamp, m.attempts)
                          for m in out)
        # only the responder's .address is read
        blocks, others = FrameDecoder(Addr()).feed_blocks(frames)  # type: ignore[arg-type]
        assert not others and sum(map(len, blocks)) == len(out)
        return blocks

    def finish_blocks(self, blocks: Iterable[MessageBlock]) -> None:
        blocks = list(blocks)
        self.log.append(("FIN", [i for b in blocks for i in b.ids()]))
        self.outstanding -= sum(map(len, blocks))

    def requeue_blocks(self, blocks: Iterable[MessageBlock],
                       delay_ms: int | None = None, backoff: bool = True) -> None:
        """Back to the head of the queue; with a delay, into :attr:`deferred` instead
        (nsqd hands a deferred message out only once its delay is over: never, here)."""
        blocks = list(blocks)
        self.log.append(("REQ", [i for b in blocks for i in b.ids()]))
        self.outstanding -= sum(map(len, blocks))
        msgs = [m for b in blocks for m in b.messages()]
        if delay_ms:
            self.deferred += msgs
        else:
            self.queue[:0] = msgs

    def split_blocks(self, blocks: Iterable[MessageBlock], chosen: Sequence[bool]
                     ) -> tuple[list[MessageBlock], list[MessageBlock]]:
        yes: list[MessageBlock] = []
        no: list[MessageBlock] = []
        at = 0
        for b in blocks:
            flags = list(chosen[at:at + len(b)])
            at += len(b)
            yes += b.select(flags)
            no += b.select([not f for f in flags])
        return yes, no

    def is_starved(self) -> bool:
        return False

    def stats(self) -> dict[str, Any]:
        return {"connections": {Addr.address: {"state": "subscribed"}},
                "connect_errors": {}}

    def close(self) -> None:
        self.closed = True


# mypy --strict (tests/test_typing.py): the stand-in fits the fetch task's port
_PORT_CHECK: ReaderPort = StandInReader([], [])


class Paused:
    """The least a cached thing must do (Pausable)."""

    def __init__(self) -> None:
        self.mif: list[int] = []
        self.closed = 0

    def set_max_in_flight(self, max_in_flight: int) -> None:
        self.mif.append(max_in_flight)

    def close(self) -> None:
        self.closed += 1


# mypy --strict (tests/test_typing.py): the least cached thing fits the cache's port
_PAUSED_CHECK: Pausable = Paused()


def as_pausable(port: ReaderPort) -> Pausable:
    """mypy --strict (tests/test_typing.py): every ReaderPort can be cached."""
    return port


class Addr:
    """The one attribute of a responder the decoder reads."""

    address = "127.0.0.1:4150"
