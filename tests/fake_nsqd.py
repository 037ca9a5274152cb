"""A fake nsqd connection for the consumer's unit tests, typed against the port.

:class:`FakeConnections` is a :class:`~nsq_spark._consumer.connection_port.ConnectNsqd` (the
Reader takes it as ``connection_factory=``); the :class:`FakeConn` s it makes are
:class:`~nsq_spark._consumer.connection_port.ConsumerConnection` s that record what would be
written (RDY, FIN, REQ, TOUCH, CLS) and deliver the chunks a test gives them. mypy checks
both against the Protocols (the assignments at the end of this module; tests/test_typing.py
runs mypy on this file), so a change to the port that the fake does not follow fails a
test instead of passing unnoticed.
"""

from __future__ import annotations

import asyncio
from array import array
from typing import Any, Callable, Sequence

from nsq_spark.config import ConnectionConfig
from nsq_spark._consumer.connection_port import (ConnectNsqd, ConsumerConnection, OnBlocks,
                                                OnClose, OnMessages)
from nsq_spark._handshake import ConnState
from nsq_spark.message import Message, Responder
from nsq_spark.protocol import MessageBlock, encode_message_frame

__all__ = ["FakeConn", "FakeConnections"]

Logged = tuple[Any, ...]


class FakeConn:
    """Stands in for a subscribed nsqd connection; ``log`` holds what it was asked to send."""

    def __init__(self, host: str, port: int, *, on_messages: OnMessages | None,
                 on_blocks: OnBlocks | None, on_close: OnClose,
                 responder: Responder) -> None:
        self.address = f"{host}:{port}"
        self.on_messages = on_messages
        self.on_blocks = on_blocks
        self.on_close = on_close
        self.responder = responder
        self.max_rdy_count = 2500
        self.msg_timeout = 60_000  # ms, nsqd's default
        self.rdy_count = 0
        self.state = ConnState.INIT
        self.log: list[Logged] = []
        self.last_recv = 0.0
        self.messages_received = 0
        self._next_id = 0

    # -- the port ---------------------------------------------------------------------------

    async def connect(self) -> "FakeConn":
        self.state = ConnState.CONNECTED
        return self

    async def subscribe(self, topic: str, channel: str) -> bytes:
        self.state = ConnState.SUBSCRIBED
        return b"OK"

    @property
    def closed(self) -> bool:
        return self.state is ConnState.CLOSED

    @property
    def writable(self) -> bool:
        return self.state is not ConnState.CLOSED

    def send_rdy(self, count: int) -> None:
        if count > self.max_rdy_count:
            raise ValueError(f"RDY {count} is over max_rdy_count {self.max_rdy_count}")
        self.rdy_count = count
        self.log.append(("RDY", count))

    def fin_many(self, message_ids: Sequence[bytes]) -> bool:
        self.log.append(("FIN", tuple(message_ids)))
        return True

    def fin_blocks(self, blocks: Sequence[MessageBlock]) -> bool:
        self.log.append(("FIN", tuple(i for b in blocks for i in b.ids())))
        return True

    def req(self, message_id: bytes, delay_ms: int = 0) -> bool:
        self.log.append(("REQ", message_id, delay_ms))
        return True

    def touch(self, message_id: bytes) -> None:
        self.log.append(("TOUCH", message_id))

    def send_cls(self) -> "asyncio.Future[bytes]":
        self.log.append(("CLS",))
        self.state = ConnState.CLOSING
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        fut.set_result(b"CLOSE_WAIT")
        return fut

    async def close(self) -> None:
        if self.state is not ConnState.CLOSED:
            self.state = ConnState.CLOSED
            self.on_close(None)

    def abort(self, exc: BaseException | None = None) -> None:
        self.state = ConnState.CLOSED

    # -- the test's side --------------------------------------------------------------------

    def next_id(self) -> bytes:
        self._next_id += 1
        return b"%016d" % self._next_id

    def deliver(self, n: int, attempts: int = 1) -> list[Message]:
        """One read chunk of ``n`` messages."""
        assert self.on_messages is not None, (
            "a blocks connection (a Reader started with blocks=True): use deliver_blocks()")
        msgs = [Message(self.next_id(), b"body", 0, attempts, self.responder)
                for _ in range(n)]
        self.messages_received += n
        self.on_messages(msgs)
        return msgs

    def deliver_blocks(self, n: int, attempts: int = 1) -> list[MessageBlock]:
        """One read chunk of ``n`` messages as one MessageBlock (a blocks connection)."""
        assert self.on_blocks is not None, "a Message connection: use deliver()"
        frames = [encode_message_frame(self.next_id(), b"body", 0, attempts)
                  for _ in range(n)]
        offsets = array("i", [0])
        for f in frames:
            offsets.append(offsets[-1] + len(f))
        blocks = [MessageBlock(b"".join(frames), offsets, attempts, self.responder)]
        self.messages_received += n
        self.on_blocks(blocks)
        return blocks

    def upcoming_ids(self, n: int) -> list[bytes]:
        """The ids of the next ``n`` messages :meth:`deliver` makes."""
        return [b"%016d" % (self._next_id + 1 + i) for i in range(n)]

    def rewind(self) -> None:
        """The next delivery repeats the ids from the first (redeliveries)."""
        self._next_id = 0

    def fins(self) -> list[bytes]:
        return [i for e in self.log if e[0] == "FIN" for i in e[1]]

    def reqs(self) -> list[tuple[bytes, int]]:
        return [(e[1], e[2]) for e in self.log if e[0] == "REQ"]

    def rdys(self) -> list[int]:
        return [e[1] for e in self.log if e[0] == "RDY"]


class FakeConnections:
    """The connection factory of a test: makes :class:`FakeConn` s, keeps them in
    :attr:`made` (in connection order)."""

    def __init__(self) -> None:
        self.made: list[FakeConn] = []

    def __call__(self, host: str, port: int, config: ConnectionConfig, *,
                 on_messages: OnMessages | None, on_blocks: OnBlocks | None,
                 on_close: OnClose, on_heartbeat: Callable[[Any], Any] | None,
                 responder: Responder) -> FakeConn:
        conn = FakeConn(host, port, on_messages=on_messages, on_blocks=on_blocks,
                        on_close=on_close, responder=responder)
        self.made.append(conn)
        return conn


def _conforms(nsqd: FakeConnections, conn: FakeConn) -> tuple[ConnectNsqd, ConsumerConnection]:
    """Never called: mypy checks here that the fakes satisfy the port's Protocols."""
    return nsqd, conn
