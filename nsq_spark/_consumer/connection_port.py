"""What the consumer needs of an nsqd connection: the port between the pool and the socket.

As go-nsq's ``delegates.go`` puts the consumer's view of a connection in a small
interface, :class:`ConsumerConnection` names every attribute and method the pool and the
answers ledger use of one, and :class:`ConnectNsqd` how the pool gets one:
``Pool(connect=...)``. The default, :func:`connect_nsqd`, builds the real
:class:`nsq_spark._conn.Connection`; unit tests pass a fake that mypy checks against these
Protocols (tests/fake_nsqd.py), instead of patching a module global.

Deliveries are two callbacks, one per shape: ``on_messages(messages)`` or
``on_blocks(blocks)`` (exactly one is given), once per read chunk; ``on_close(exc)`` once
when the connection ends (None after our own close). The callbacks get no connection
argument: the pool binds them to its record of the connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol, Sequence

from .._conn import Connection  # the one place the consumer names the real class

if TYPE_CHECKING:
    import asyncio

    from ..config import ConnectionConfig
    from .._handshake import ConnState
    from ..message import Message, Responder
    from ..protocol import MessageBlock

__all__ = ["ConsumerConnection", "ConnectNsqd", "connect_nsqd", "OnMessages", "OnBlocks",
           "OnClose"]

OnMessages = Callable[[list["Message"]], None]
OnBlocks = Callable[[list["MessageBlock"]], None]
OnClose = Callable[["BaseException | None"], None]


class ConsumerConnection(Protocol):
    """One subscribed-to-be nsqd connection, as the consumer uses it (loop thread)."""

    @property
    def address(self) -> str:
        """``host:port`` (IPv6 in brackets)."""

    @property
    def state(self) -> "ConnState": ...

    @property
    def closed(self) -> bool: ...

    @property
    def writable(self) -> bool:
        """Answers are still taken (False once the socket closed or close() wrote its last
        buffer): the ledger counts refused answers as dropped."""

    @property
    def max_rdy_count(self) -> int:
        """nsqd's ``--max-rdy-count`` (from IDENTIFY)."""

    @property
    def rdy_count(self) -> int:
        """The last RDY sent."""

    @property
    def msg_timeout(self) -> int:
        """nsqd's message timeout for this connection, in ms (from IDENTIFY): the lease
        of the dedup claims of what it delivers."""

    @property
    def messages_received(self) -> int: ...

    @property
    def last_recv(self) -> float:
        """Loop time of the last bytes received (closing waits until it is quiet)."""

    def connect(self) -> Awaitable[Any]:
        """TCP connect and the handshake (IDENTIFY, TLS, compression, AUTH)."""

    def subscribe(self, topic: str, channel: str) -> Awaitable[bytes]: ...

    def send_rdy(self, count: int) -> None:
        """Raises (ValueError) over ``max_rdy_count``."""

    def send_cls(self) -> "asyncio.Future[bytes]": ...

    def fin_many(self, message_ids: Sequence[bytes]) -> bool: ...

    def fin_blocks(self, blocks: Sequence["MessageBlock"]) -> bool: ...

    def req(self, message_id: bytes, delay_ms: int = 0) -> bool: ...

    def touch(self, message_id: bytes) -> None: ...

    def close(self) -> Awaitable[None]:
        """Send what is queued, then close; ``on_close(None)`` follows."""

    def abort(self, exc: BaseException | None = None) -> None:
        """Close at once, sending nothing more."""


class ConnectNsqd(Protocol):
    """Makes the consumer's connection to one nsqd (not connected yet)."""

    def __call__(self, host: str, port: int, config: "ConnectionConfig", *,
                 on_messages: OnMessages | None, on_blocks: OnBlocks | None,
                 on_close: OnClose, on_heartbeat: Callable[[Any], Any] | None,
                 responder: "Responder") -> ConsumerConnection: ...


def connect_nsqd(host: str, port: int, config: "ConnectionConfig", *,
                 on_messages: OnMessages | None, on_blocks: OnBlocks | None,
                 on_close: OnClose, on_heartbeat: Callable[[Any], Any] | None,
                 responder: "Responder") -> ConsumerConnection:
    """The default :class:`ConnectNsqd`: a real :class:`nsq_spark._conn.Connection`.
    ``on_heartbeat`` gets the Connection (pynsq's ``Reader.heartbeat(conn)`` hook)."""
    if on_blocks is not None:
        blocks = on_blocks
        return Connection(host, port, config, on_blocks=lambda conn, b: blocks(b),
                          on_close=lambda conn, exc: on_close(exc),
                          on_heartbeat=on_heartbeat, responder=responder)
    if on_messages is None:
        raise ValueError("connect_nsqd needs on_messages or on_blocks")
    messages = on_messages
    return Connection(host, port, config, on_messages=lambda conn, m: messages(m),
                      on_close=lambda conn, exc: on_close(exc),
                      on_heartbeat=on_heartbeat, responder=responder)
