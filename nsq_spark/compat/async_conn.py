"""pynsq's ``AsyncConn``: one nsqd connection with an events API, over
:class:`nsq_spark._conn.Connection` (which does the IO and the whole handshake).

The caller drives it as in pynsq::

    conn = AsyncConn("127.0.0.1", 4150, snappy=True)
    conn.on("ready", lambda conn, **kw: conn.send(nsq.protocol.subscribe("t", "c")))
    conn.on("message", lambda conn, message, **kw: message.finish())
    conn.connect()          # returns at once; the current IOLoop does the work

Events, each called with keyword arguments (``conn=`` always): ``connect``, ``identify``
(``data``: the IDENTIFY body sent), ``identify_response`` (``data``: nsqd's JSON), ``auth``
(``data``: the secret) and ``auth_response`` (``data``: nsqd's JSON) when nsqd asked for
AUTH, ``ready`` (handshake done: send commands), ``message`` (``message``), ``response``
(``data``: a response frame, e.g. ``b"OK"`` for SUB), ``error`` (``error``: an
:class:`~nsq_spark.errors.NSQError`, also ``nsq.protocol.Error``), ``heartbeat`` (already
answered with NOP), ``close``, and from the messages' answers ``resume`` (FIN),
``backoff`` / ``continue`` (REQ with or without backoff).

Differences from pynsq, each because the handshake is ours and runs as one step:
``connect``, ``identify``, ``identify_response``, ``auth`` and ``auth_response`` are
triggered in that order once the handshake has finished, right before ``ready`` (so a
listener of ``identify`` sees the body that was sent and cannot change it); ``data``
events (raw frames) are not triggered; the compression/TLS wrapper sockets pynsq exposes
as ``conn.socket`` do not exist (``conn.tls`` / ``conn.snappy`` / ``conn.deflate`` say what
was negotiated). ``send()`` queues the bytes for the next write (commands of one loop turn
go out in one write) and returns a future that is already done.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tornado.ioloop import IOLoop

from .._log import get_logger
from ..config import ConnectionConfig
from .._conn import Connection
from ..errors import ConnectionClosedError, NSQServerError
from ..message import Message
from . import event
from .event import EventedMixin

log = get_logger("nsq_spark.compat.async_conn")

__all__ = ["AsyncConn", "INIT", "CONNECTING", "CONNECTED", "DISCONNECTED"]

# pynsq's connection states (strings, as pynsq programs compare them)
INIT = "INIT"
CONNECTING = "CONNECTING"
CONNECTED = "CONNECTED"
DISCONNECTED = "DISCONNECTED"


class AsyncConn(EventedMixin):
    """pynsq's evented nsqd connection. Arguments are pynsq's, with pynsq's units
    (``timeout`` and ``heartbeat_interval`` and ``msg_timeout`` in seconds,
    ``output_buffer_timeout`` in milliseconds); None means our default. Bad values raise
    :class:`~nsq_spark.errors.ConfigError` (an AssertionError, as pynsq's checks are)."""

    def __init__(self, host: str, port: int, timeout: float | None = None,
                 heartbeat_interval: float | None = None, requeue_delay: float | None = None,
                 tls_v1: bool = False, tls_options: Any = None, snappy: bool = False,
                 deflate: bool = False, deflate_level: int | None = None,
                 user_agent: str | None = None, output_buffer_size: int | None = None,
                 output_buffer_timeout: int | None = None, sample_rate: int | None = None,
                 auth_secret: str | bytes | None = None, msg_timeout: float | None = None,
                 hostname: str | None = None) -> None:
        super().__init__()
        options = {"timeout": timeout, "heartbeat_interval": heartbeat_interval,
                   "requeue_delay": requeue_delay, "tls_v1": tls_v1,
                   "tls_options": tls_options, "snappy": snappy, "deflate": deflate,
                   "deflate_level": deflate_level, "user_agent": user_agent,
                   "output_buffer_size": output_buffer_size,
                   "output_buffer_timeout": output_buffer_timeout, "sample_rate": sample_rate,
                   "auth_secret": auth_secret, "msg_timeout": msg_timeout,
                   "hostname": hostname}
        self.config = ConnectionConfig.from_options(
            **{k: v for k, v in options.items() if v is not None})
        self.host = host
        self.port = int(port)
        self.state = INIT
        self.in_flight = 0
        self.rdy = 0
        self.last_rdy = 0
        self.max_rdy_count = 2500  # nsqd's default until IDENTIFY answers
        self.last_recv_timestamp = time.time()
        self.last_msg_timestamp = time.time()
        self.requeue_delay = self.config.requeue_delay
        self.callback_queue: list[Any] = []  # pynsq's Writer keeps its callbacks here
        self.conn: Connection | None = None
        self.address = self.id  # the Responder protocol's name (IPv6 in brackets once open)

    # -- pynsq's identity and state -----------------------------------------------------

    @property
    def id(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    def connected(self) -> bool:
        return self.state == CONNECTED

    def connecting(self) -> bool:
        return self.state == CONNECTING

    def closed(self) -> bool:
        return self.state in (INIT, DISCONNECTED)

    def __getattr__(self, name: str) -> Any:
        # what IDENTIFY negotiated (tls, snappy, deflate, identify_response, ...)
        conn = self.__dict__.get("conn")
        if conn is not None and not name.startswith("_"):
            return getattr(conn, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- connecting -----------------------------------------------------------------------

    def connect(self) -> None:
        """Start connecting on the current IOLoop (returns at once); nothing happens if
        the connection is already connecting or connected."""
        if not self.closed():
            return
        self.state = CONNECTING
        self.conn = Connection(self.host, self.port, self.config,
                               on_messages=self._on_messages, on_close=self._on_close,
                               on_response=self._on_response, on_error=self._on_error,
                               on_heartbeat=self._on_heartbeat, responder=self)
        self.address = self.conn.address
        IOLoop.current().add_callback(self._start)

    def _start(self) -> None:
        asyncio.ensure_future(self._open())

    async def _open(self) -> None:
        conn = self.conn
        assert conn is not None
        try:
            await conn.connect()
        except Exception as exc:
            self.state = DISCONNECTED
            self.trigger(event.ERROR, conn=self, error=exc)
            self.trigger(event.CLOSE, conn=self)
            return
        self.state = CONNECTED
        self.max_rdy_count = conn.max_rdy_count
        self.trigger(event.CONNECT, conn=self)
        self.trigger(event.IDENTIFY, conn=self, data=self.config.identify_payload())
        if conn.identify_response:
            self.trigger(event.IDENTIFY_RESPONSE, conn=self, data=conn.identify_response)
        if conn.auth_required and self.config.auth_secret is not None:
            self.trigger(event.AUTH, conn=self, data=self.config.auth_secret)
            self.trigger(event.AUTH_RESPONSE, conn=self, data=conn.auth_response)
        self.trigger(event.READY, conn=self)

    def close(self) -> None:
        """Close the socket now (as pynsq: no CLS); ``close`` is triggered."""
        if self.conn is not None:
            self.conn.abort()

    # -- sending ------------------------------------------------------------------------

    def send(self, data: bytes) -> "asyncio.Future[None]":
        """Queue raw command bytes (e.g. ``nsq.protocol.subscribe(...)``); nsqd's answer
        comes as a ``response`` or ``error`` event."""
        conn = self.conn
        if conn is None or not conn.writable:
            raise ConnectionClosedError(f"connection to nsqd {self} is not open "
                                        "(wait for its 'ready' event)")
        conn.send(data)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    def send_rdy(self, value: int) -> bool:
        """RDY ``value`` (not sent again if unchanged). False if it could not be sent (the
        connection is closed and ``error`` was triggered)."""
        if self.last_rdy != value:
            try:
                assert self.conn is not None
                self.conn.send_rdy(value)
            except Exception as exc:
                self.close()
                self.trigger(event.ERROR, conn=self, error=exc)
                return False
        self.last_rdy = self.rdy = value
        return True

    # -- what the connection reports ----------------------------------------------------

    def _on_messages(self, conn: Connection, msgs: list[Message]) -> None:
        self.last_recv_timestamp = self.last_msg_timestamp = time.time()
        for msg in msgs:
            self.in_flight += 1
            self.trigger(event.MESSAGE, conn=self, message=msg)

    def _on_response(self, conn: Connection, data: bytes) -> None:
        self.last_recv_timestamp = time.time()
        self.trigger(event.RESPONSE, conn=self, data=data)

    def _on_error(self, conn: Connection, exc: NSQServerError) -> None:
        self.trigger(event.ERROR, conn=self, error=exc)

    def _on_heartbeat(self, conn: Connection) -> None:
        self.last_recv_timestamp = time.time()
        self.trigger(event.HEARTBEAT, conn=self)

    def _on_close(self, conn: Connection, exc: BaseException | None) -> None:
        self.state = DISCONNECTED
        if exc is not None and not isinstance(exc, NSQServerError):  # those had 'error'
            self.trigger(event.ERROR, conn=self, error=exc)
        self.trigger(event.CLOSE, conn=self)

    # -- Responder: the answers of delivered messages -------------------------------------

    def on_finish(self, msg: Message) -> None:
        self.in_flight -= 1
        self.trigger(event.RESUME, conn=self)
        if self.conn is not None:
            self.conn.on_finish(msg)

    def on_requeue(self, msg: Message, delay_ms: int | None, backoff: bool) -> None:
        self.in_flight -= 1
        self.trigger(event.BACKOFF if backoff else event.CONTINUE, conn=self)
        if delay_ms is None or delay_ms < 0:  # pynsq's default: requeue_delay per attempt
            delay_ms = round(self.requeue_delay * msg.attempts * 1000)
        if self.conn is not None:
            self.conn.on_requeue(msg, delay_ms, backoff)

    def on_touch(self, msg: Message) -> None:
        if self.conn is not None:
            self.conn.on_touch(msg)
