"""One connection to one nsqd, on tornado's IOStream.

``Connection`` does tornado IO only. The handshake (magic, IDENTIFY, TLS upgrade, snappy or
deflate, AUTH) is decided by the sans-IO :class:`~nsq_spark._handshake.Handshake`, which this
class drives; commands come from :mod:`nsq_spark.protocol`, compression from
:mod:`nsq_spark._codecs`, the states are :class:`~nsq_spark._handshake.ConnState`. After the
handshake it answers heartbeats, decodes every read chunk in one call and hands all
messages of the chunk to ``on_messages`` at once, and coalesces every command written during
one event-loop turn into a single socket write. The blocking twin,
:class:`~nsq_spark._sync_conn.SyncConnection`, drives the same handshake and is re-exported
here for users who imported it from ``nsq_spark.conn`` (the project imports it from
``_sync_conn``).

Deadlines are totals, so a server that drips one byte at a time cannot stretch them: the TCP
connect takes at most ``connect_timeout``, the whole handshake after it (IDENTIFY, TLS,
compression, AUTH) at most ``response_timeout``, and every command that nsqd answers (SUB,
PUB, MPUB, DPUB, CLS) must be answered within ``response_timeout`` of the previous answer
(or of being sent, when none was outstanding); else the connection is closed with
NSQTimeoutError (answers are matched in order: after a missing one they would be out of
step), failing every outstanding command with it. One timer per connection, not per
command.

nsqd refuses an oversize body on its size prefix, writes ``E_BAD_MESSAGE`` and closes while
we are still sending the body, so our write meets a reset. tornado then closes the socket
with the error frame maybe still unread in the kernel: before the socket is closed after a
reset, what already arrived is read and its frames handled, so the command gets
BadMessageError (permanent) rather than a lost connection (retried).

Flow control is enforced on the read side: every read chunk's messages are counted against
the RDY sent and the FIN/REQ given (:class:`~nsq_spark._rdy_credit.RdyCredit`, pure, one call per
chunk); a server that sends more than it was granted is closed with a ProtocolError naming
the counts before the chunk reaches ``on_messages``, and so is one that stops reading our
answers (``MAX_ANSWER_BACKLOG`` bytes waiting) while it keeps sending. The read loop yields
to the event loop at least every ``_TURN_BYTES`` decoded and decompresses at most a read's
worth per step, so timers (heartbeats, ``response_timeout``) and other connections run
under any flood. go-nsq gets the same bound from its unbuffered hand-off (the read loop
blocks until the handler takes the message); here a chunk is handed over whole, so the
bound is checked instead.

It holds no consumer policy (RDY distribution, backoff, attempts): the Reader decides, the
connection carries out. All methods except the Responder ones must be called on the
connection's event loop thread::

    conn = Connection("127.0.0.1", 4150, ConnectionConfig(snappy=True),
                      on_messages=lambda conn, msgs: ...)
    await conn.connect()
    await conn.subscribe("topic", "channel")
    conn.send_rdy(1000)
    ...
    await conn.close()
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from collections import deque
from typing import Any, Callable, Iterable, Sequence

from tornado.iostream import IOStream, StreamBufferFullError, StreamClosedError
from tornado.netutil import DefaultLoopResolver, Resolver
from tornado.tcpclient import TCPClient

from . import protocol
from ._log import get_logger
from ._loop import LoopBridge
from ._addresses import Address, ip_literal
from ._codecs import StreamCodec, make_codec
from .config import ConnectionConfig
from .errors import (ConnectError, ConnectionClosedError, NSQError, NSQServerError,
                     NSQTimeoutError, ProtocolError, TLSError, error_from_frame)
from ._handshake import (ConnState, Handshake, InstallCodec, Negotiated, NegotiatedAttributes,
                        SendBytes, StartTLS)
from .message import Message, Responder
from ._rdy_credit import RdyCredit
from ._sync_conn import SyncConnection  # re-exported for users (the project imports _sync_conn)

log = get_logger("nsq_spark.conn")  # the name users filter on (docs/logging.md), not the module's

__all__ = ["Connection", "ConnState", "SyncConnection"]

# the states as module names, for code written before ConnState
INIT, CONNECTING, CONNECTED = ConnState.INIT, ConnState.CONNECTING, ConnState.CONNECTED
SUBSCRIBED, CLOSING, CLOSED = ConnState.SUBSCRIBED, ConnState.CLOSING, ConnState.CLOSED

_NOT_OPEN = (ConnState.CLOSED, ConnState.INIT, ConnState.CONNECTING)
_NOP = protocol.nop()
_HEARTBEAT = protocol.HEARTBEAT
_CLOSE_WAIT = protocol.CLOSE_WAIT

#: Decoded bytes the read loop handles before it lets the event loop run other work (when
#: reads keep completing without waiting). A 1 MiB chunk of 100-byte messages takes ~20 ms
#: to decode and hand over here; one yield costs a few microseconds.
_TURN_BYTES = 1 << 20

#: Commands (FIN, REQ, TOUCH, RDY, NOP) a subscribed connection may have waiting for the
#: socket. A live nsqd reads them as they come, and stops sending when it does not (its
#: in-flight count stays at RDY): the backlog stays under RDY times ~40 bytes. A server that
#: floods without reading would grow it without end (measured: 1.2 GB in 15 s before this).
MAX_ANSWER_BACKLOG = 8 << 20


def _step_bound(read_size: int, max_frame_size: int) -> int:
    """Decompressed bytes per step of the read loop: one read's worth (deflate expands
    plain NSQ traffic 3-10x) and at most ``max_frame_size``; never the whole of a
    compression bomb at once (a larger frame still completes, over several steps)."""
    return min(max(read_size, 1 << 18), max_frame_size)


class _Resolver(Resolver):
    """tornado's default resolver (asyncio's ``getaddrinfo`` in the loop's executor),
    except that an IP address is not looked up at all, and a name is looked up on this
    thread when the executor refuses new work. It does at interpreter shutdown: when the
    main thread has ended and a thread of the program still runs its IO loop (a pynsq
    Writer's pattern), every connect failed with "cannot schedule new futures after
    interpreter shutdown" and the healthy nsqd was taken for down; pynsq, which
    resolves blocking, published."""

    async def resolve(self, host: str, port: int,
                      family: socket.AddressFamily = socket.AF_UNSPEC
                      ) -> list[tuple[int, Any]]:
        if ip_literal(host) is not None:
            # AI_NUMERICHOST: no name service is asked, nothing blocks
            infos = socket.getaddrinfo(host.strip("[]"), port, family, socket.SOCK_STREAM,
                                       0, socket.AI_NUMERICHOST)
            return [(fam, address) for fam, _, _, _, address in infos]
        try:
            found: list[tuple[int, Any]] = await DefaultLoopResolver().resolve(host, port,
                                                                              family)
            return found
        except RuntimeError:  # the executor is shut down: look it up here, as pynsq does
            infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
            return [(fam, address) for fam, _, _, _, address in infos]


_RESOLVER = _Resolver()


MessagesCallback = Callable[["Connection", list[Message]], Any]
BlocksCallback = Callable[["Connection", list[protocol.MessageBlock]], Any]
CloseCallback = Callable[["Connection", "BaseException | None"], Any]


class Connection(NegotiatedAttributes):
    """One nsqd connection.

    Args:
        host, port: the nsqd TCP address.
        config: a ConnectionConfig; or pass its options as keywords.
        on_messages: ``f(conn, messages)``, called once per read chunk with every message
            decoded from it. Required for subscribing, unless ``on_blocks`` is given.
        on_blocks: ``f(conn, blocks)`` instead of ``on_messages``: the messages of each read
            chunk as :class:`~nsq_spark.protocol.MessageBlock` s (no object per message).
        on_close: ``f(conn, exc)`` called once when the connection is closed: ``exc`` is None
            after :meth:`close`, else what ended it (ConnectionClosedError, ProtocolError,
            a fatal NSQServerError, NSQTimeoutError on missed heartbeats).
        on_response: ``f(conn, data)`` for responses no command waits for.
        on_error: ``f(conn, exc)`` for every error frame (non-fatal ones included:
            ``E_FIN_FAILED``, ``E_REQ_FAILED``, ``E_TOUCH_FAILED``).
        on_heartbeat: ``f(conn)`` after each heartbeat (already answered with NOP).
        responder: the Responder set on delivered messages (default: this connection, which
            sends FIN/REQ/TOUCH itself).

    Attributes set by the IDENTIFY answer: ``max_rdy_count``, ``msg_timeout`` and
    ``max_msg_timeout`` (in nsqd's milliseconds, unlike ``config.msg_timeout``, which is
    pynsq's seconds), ``tls``, ``snappy``, ``deflate``, ``deflate_level``,
    ``auth_required``, ``sample_rate``, ``output_buffer_size``, ``output_buffer_timeout``,
    ``nsqd_version``, ``identify_response`` (the whole JSON), ``auth_response`` (identity,
    permission count) after AUTH.
    """

    def __init__(self, host: str, port: int, config: ConnectionConfig | None = None, *,
                 on_messages: MessagesCallback | None = None,
                 on_blocks: BlocksCallback | None = None,
                 on_close: CloseCallback | None = None,
                 on_response: Callable[["Connection", bytes], Any] | None = None,
                 on_error: Callable[["Connection", NSQServerError], Any] | None = None,
                 on_heartbeat: Callable[["Connection"], Any] | None = None,
                 responder: Responder | None = None,
                 **options: Any) -> None:
        if config is None:
            config = ConnectionConfig.from_options(**options)
        elif options:
            config = config.replace(**options)
        self.host = host
        self.port = int(port)
        self.address = str(Address(host, self.port))  # IPv6 in brackets
        self._log = log.bind(nsqd=self.address)
        self.config = config
        if on_messages is not None and on_blocks is not None:
            raise ValueError("give on_messages or on_blocks, not both")
        # one callback per delivery shape (exactly one is set for a consumer); _blocks says
        # which decoder feeds the read loop
        self.on_messages: MessagesCallback | None = on_messages
        self.on_blocks: BlocksCallback | None = on_blocks
        self._blocks = on_blocks is not None
        self.on_close = on_close
        self.on_response = on_response
        self.on_error = on_error
        self.on_heartbeat = on_heartbeat
        self.state = ConnState.INIT

        self._adopt(Negotiated())  # nsqd's defaults until IDENTIFY answers

        # consumer bookkeeping (the Reader's policies read these; messages in flight are
        # counted once, by the Reader's RDY policy, not here)
        self.rdy_count = 0           # last RDY sent
        self.messages_received = 0
        self.last_recv = 0.0         # event-loop time of the last bytes received
        self.last_message = 0.0      # event-loop time of the last message received

        self._responder = responder if responder is not None else self
        self._decoder = protocol.FrameDecoder(self._responder, config.max_frame_size)
        # what nsqd may send, from the RDY sent and the answers given (per read chunk)
        self._credit = RdyCredit()
        self._codec: StreamCodec | None = None
        self._stream: IOStream | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        # answers to delivered messages may come from any thread (Responder below)
        self._bridge = LoopBridge(f"the connection to nsqd {self.address} is not open; "
                                  "its messages come again from nsqd")
        self._wbuf: list[bytes] = []
        self._flush_scheduled = False
        self._last_write: "asyncio.Future[None] | None" = None
        self._pending: deque[asyncio.Future[bytes]] = deque()
        self._early: deque[tuple[int, bytes]] = deque()
        self._read_task: asyncio.Task[None] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._close_task: asyncio.Future[None] | None = None
        self._closed_fut: asyncio.Future[None] | None = None
        self._close_reason: BaseException | None = None
        self._closed_by: BaseException | None = None  # what ended it (None: close())
        self._closing_by_us = False
        self._writes_done = False  # close() wrote its last buffer: fin/req refuse
        self._answers: _AnswerClock | None = None  # response_timeout of the commands
        self._last_words = bytearray()  # read after a reset, just before the socket closed

    def __repr__(self) -> str:
        return f"<Connection {self.address} {self.state}>"

    # -- connect and handshake ------------------------------------------------------------

    async def connect(self) -> "Connection":
        """Open the connection: magic, IDENTIFY, TLS/compression upgrade, AUTH. Raises
        ConnectError, TLSError, AuthError, NSQTimeoutError or an NSQServerError."""
        if self.state != ConnState.INIT:
            raise NSQError(f"connect() was already called on {self!r}; make a new Connection "
                           "to reconnect")
        self.state = ConnState.CONNECTING
        self._bridge.bind()
        self._aloop = asyncio.get_running_loop()
        self._closed_fut = self._aloop.create_future()
        cfg = self.config
        try:
            # local_address: go-nsq's LocalAddr, the source IP to dial from
            stream = await asyncio.wait_for(
                TCPClient(resolver=_RESOLVER).connect(self.host, self.port,
                                                      source_ip=cfg.source_ip),
                cfg.connect_timeout)
        except asyncio.TimeoutError:
            self._fail_connect()
            raise ConnectError(f"timed out after {cfg.connect_timeout}s connecting to nsqd at "
                               f"{self.address}; is it reachable?") from None
        except (OSError, StreamClosedError) as exc:
            self._fail_connect()
            real = getattr(exc, "real_error", None) or exc
            raise ConnectError(f"cannot connect to nsqd at {self.address}: {real}; is nsqd "
                               "running and listening there?" + cfg.local_address_hint()
                               ) from exc
        self._stream = stream
        stream.set_nodelay(True)
        _keep_last_words(stream, self._last_words)
        try:
            await self._handshake()
        except BaseException as exc:
            self._fail_connect()
            # No local of this frame may hold the error raised (nor may it be its own
            # cause, as ``raise exc from exc`` made it): its traceback holds this frame, and
            # the cycle would keep the frames' buffers (the answer read, up to 1 MiB, three
            # times) until the cyclic collector ran, on every reconnect: 3 MiB each, 120 MiB
            # after 40 refused AUTH answers with the collector paused
            typed: BaseException | None = _translate(self.address, cfg.response_timeout, exc,
                                                     "during the handshake")
            if typed is exc:
                typed = None
                raise
            try:
                raise typed from exc  # type: ignore[misc]
            finally:
                typed = None
        self.state = ConnState.CONNECTED
        self._credit = RdyCredit(max(self.msg_timeout, 1000) / 1000.0, now=self._aloop.time())
        self._answers = _AnswerClock(self._aloop, cfg.response_timeout, self.address,
                                     lambda: bool(self._pending), self.abort)
        self.last_recv = self._aloop.time()
        self._read_task = asyncio.ensure_future(self._read_loop())
        hb = cfg.heartbeat_interval_ms
        if hb > 0:
            self._watchdog = self._aloop.call_later(hb / 1000.0, self._check_heartbeat)
        self._log.debug("[%s] connected (tls=%s snappy=%s deflate=%s auth=%s)", self.address,
                        self.tls, self.snappy, self.deflate, self.auth_required)
        return self

    def _fail_connect(self) -> None:
        self.state = ConnState.CLOSED
        if self._stream is not None:
            try:
                self._stream.close()
            except Exception:  # a stream half-way through start_tls
                pass
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)

    async def _handshake(self) -> None:
        """Drive the sans-IO handshake (:mod:`nsq_spark._handshake`) over the stream, all of
        it within ``response_timeout``: each wait gets only the time that is left."""
        assert self._stream is not None and self._aloop is not None
        hs = Handshake(self.config, self.host, self.port, self._decoder)
        self._write_now(hs.initial_bytes())
        total = self.config.response_timeout
        deadline = self._aloop.time() + total
        while True:
            n = hs.read_size
            timeout = deadline - self._aloop.time()
            try:
                if timeout <= 0:
                    raise asyncio.TimeoutError
                if n is not None:
                    data = await asyncio.wait_for(self._stream.read_bytes(n), timeout)
                elif self._codec is not None and self._codec.has_pending_output:
                    data = self._codec.decompress(b"", hs.max_frame_size)
                else:
                    raw = await asyncio.wait_for(self._stream.read_bytes(65536, partial=True),
                                                 timeout)
                    assert self._codec is not None
                    data = self._codec.decompress(raw, hs.max_frame_size)
            except asyncio.TimeoutError:
                raise hs.timed_out(total) from None
            except StreamClosedError as exc:
                raise hs.connection_lost(exc.real_error) from exc
            except (ssl.SSLError, ConnectionError) as exc:
                raise hs.connection_lost(exc) from exc
            for action in hs.receive_data(data):
                if isinstance(action, SendBytes):
                    self._write_now(action.data)
                elif isinstance(action, StartTLS):
                    plain, self._stream = self._stream, None  # start_tls detaches it
                    self._stream = await _start_tls(
                        plain, self.config, action.server_hostname,
                        max(0.001, deadline - self._aloop.time()), self.address)
                    _keep_last_words(self._stream, self._last_words)
                elif isinstance(action, InstallCodec):
                    self._codec = make_codec(action.kind, action.level)
                else:
                    self._adopt(action.negotiated)
                    self._early.extend(action.frames)
                    return

    def _write_now(self, data: bytes) -> None:
        assert self._stream is not None
        if self._codec is not None:
            data = self._codec.compress(data)
        self._last_write = self._stream.write(data)

    # -- the read loop ----------------------------------------------------------------------

    async def _read_loop(self) -> None:
        stream = self._stream
        assert stream is not None and self._aloop is not None
        time_ = self._aloop.time
        blocks = self._blocks
        feed: Callable[[bytes], tuple[list[Any], list[tuple[int, bytes]]]] = (
            self._decoder.feed_blocks if blocks else self._decoder.feed)
        # tornado's read_bytes allocates a fresh zeroed buffer of read_chunk_size per socket
        # read; read_into fills one preallocated buffer instead, and one copy makes the bytes
        rbuf = bytearray(self.config.read_size)
        rview = memoryview(rbuf)
        # a Future (typed as an Awaitable): done() tells whether the read completed at once
        read_into: Callable[..., "asyncio.Future[int]"] = stream.read_into  # type: ignore[assignment]
        # decompressed bytes per step: no more than a read's worth of plain bytes, so that
        # one step of a compressed flood costs what one read costs (a frame larger than
        # that still completes: the decoder gathers it over several steps)
        step = _step_bound(self.config.read_size, self.config.max_frame_size)
        credit = self._credit
        now = time_()
        exc: BaseException | None = None
        # bytes handled since the loop last had its turn: a socket that always has data
        # makes every read complete at once (no await suspends), so yield every TURN_BYTES
        # and timers, heartbeats and the other connections keep running under any flood
        handled = 0
        try:
            if self._early:
                others = list(self._early)
                self._early.clear()
                self._handle_frames(others)
            while True:
                codec = self._codec
                if codec is not None and codec.has_pending_output:
                    # a read that expanded past the step: the rest, before reading more
                    data = codec.decompress(b"", step)
                else:
                    fut = read_into(rbuf, partial=True)
                    if not fut.done():
                        handled = 0  # the await below gives the loop its turn
                    n = await fut
                    data = rview[:n].tobytes()
                    self.last_recv = now = time_()
                    if codec is not None:
                        data = codec.decompress(data, step)
                if handled >= _TURN_BYTES:
                    handled = 0
                    await asyncio.sleep(0)
                if not data:
                    continue
                handled += len(data)
                msgs, others = feed(data)
                if others:
                    self._handle_frames(others)
                if msgs:
                    n = sum(map(len, msgs)) if blocks else len(msgs)
                    why = credit.arrive(n, now)  # per chunk, a few integer operations
                    if why is not None:
                        raise ProtocolError(f"nsqd at {self.address} broke flow control: {why}; "
                                            "closing the connection")
                    self.messages_received += n
                    self.last_message = now
                    # the callback of the decoder's shape (msgs holds blocks when blocks)
                    cb: Callable[[Connection, Any], Any] | None = (
                        self.on_blocks if blocks else self.on_messages)
                    if cb is None:
                        raise ProtocolError(f"nsqd at {self.address} sent messages but the "
                                            "connection has no on_messages/on_blocks "
                                            "callback")
                    try:
                        cb(self, msgs)
                    except Exception:
                        self._log.exception("[%s] on_messages callback failed", self.address)
        except StreamClosedError as e:
            exc = self._close_cause(e)
        except Exception as e:  # ProtocolError and anything unexpected end the connection
            self._log.error("[%s] closing connection: %s", self.address, e,
                            exc_info=not isinstance(e, NSQError))
            # kept by the connection and its waiters: without its traceback, so that it
            # holds neither this frame's buffers nor, through them, the connection (a
            # cycle that only the cyclic collector would free, late, on every reconnect)
            exc = e.with_traceback(None)
        self._on_stream_closed(exc)

    def _close_cause(self, e: StreamClosedError) -> BaseException | None:
        if self._closing_by_us:
            return None
        if self._last_words and self._close_reason is None:
            self._handle_frames(_frames_in(self._last_words, self._codec, self._decoder,
                                           self.config.max_frame_size, self.address))
        if self._close_reason is not None:
            return self._close_reason
        partial = self._decoder.buffered + (self._codec.buffered if self._codec else 0)
        real = f" ({e.real_error})" if e.real_error else ""
        if partial:
            return ConnectionClosedError(
                f"nsqd at {self.address} closed the connection in the middle of a frame "
                f"({partial} bytes of an incomplete frame received){real}")
        return ConnectionClosedError(f"nsqd at {self.address} closed the connection{real}")

    def _handle_frames(self, frames: Iterable[tuple[int, bytes]]) -> None:
        answered = False
        for ftype, data in frames:
            if ftype == 0:
                if data == _HEARTBEAT:
                    self._send(_NOP)
                    if self.on_heartbeat is not None:
                        self._callback(self.on_heartbeat, self)
                elif self._pending:
                    fut = self._pending.popleft()
                    answered = True
                    if not fut.done():
                        fut.set_result(data)
                elif self.on_response is not None:
                    self._callback(self.on_response, self, data)
                else:
                    self._log.debug("[%s] unexpected response %r", self.address, data[:100])
            else:
                exc = error_from_frame(data, self.address)
                if exc.fatal:
                    self._log.error("[%s] %s", self.address, exc)
                    self._close_reason = exc
                    if self._pending:
                        fut = self._pending.popleft()
                        answered = True
                        if not fut.done():
                            fut.set_exception(exc)
                            fut.exception()  # mark retrieved; an awaiting caller still gets it
                else:
                    self._log.warning("[%s] %s", self.address, exc)
                if self.on_error is not None:
                    self._callback(self.on_error, self, exc)
                if exc.fatal:  # nsqd closes now: no command may go out on this one any more
                    self.abort(exc)
        if answered and self._answers is not None:
            self._answers.answered()

    def _callback(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            self._log.exception("[%s] %s callback failed", self.address,
                                getattr(fn, "__name__", fn))

    def _check_heartbeat(self) -> None:
        self._watchdog = None
        if self.state is ConnState.CLOSED or self._aloop is None:
            return
        hb = self.config.heartbeat_interval_ms / 1000.0
        silent = self._aloop.time() - self.last_recv
        if silent > 2 * hb:
            self.abort(NSQTimeoutError(
                f"nsqd at {self.address} sent nothing for {silent:.1f}s (heartbeat interval "
                f"{hb:g}s); closing the connection"))
            return
        self._watchdog = self._aloop.call_later(hb, self._check_heartbeat)

    # -- writes (coalesced: one socket write per loop turn) --------------------------------

    def _send(self, data: bytes) -> None:
        self._wbuf.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._aloop.call_soon(self._flush)  # type: ignore[union-attr]

    def _flush(self) -> None:
        self._flush_scheduled = False
        buf = self._wbuf
        if not buf:
            return
        self._wbuf = []
        stream = self._stream
        if stream is None or stream.closed():
            return
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        if self._codec is not None:
            data = self._codec.compress(data)
        try:
            self._last_write = stream.write(data)
        except StreamClosedError:
            pass
        except StreamBufferFullError:
            self.abort(ProtocolError(
                f"nsqd at {self.address} has not read our last {MAX_ANSWER_BACKLOG} bytes of "
                "commands (FIN, REQ, RDY) while it kept sending messages: it ignores flow "
                "control; closing the connection"))

    def send(self, data: bytes) -> None:
        """Queue raw command bytes (flushed with everything else of this loop turn)."""
        self._send(data)

    def command(self, data: bytes) -> "asyncio.Future[bytes]":
        """Queue a command that nsqd answers (SUB, PUB, MPUB, DPUB, CLS); the future gets
        the response (``b"OK"``), or the typed error nsqd sent, or ConnectionClosedError."""
        assert self._aloop is not None, "connect() first"
        fut: asyncio.Future[bytes] = self._aloop.create_future()
        if self.state in _NOT_OPEN or self._closing_by_us:
            fut.set_exception(self._cannot_send())
            return fut
        if not self._pending and self._answers is not None:
            self._answers.start()
        self._pending.append(fut)
        self._send(data)
        return fut

    def _cannot_send(self) -> BaseException:
        """What a command on a connection that is not open gets: what closed it, when
        that was not a lost connection (a ProtocolError is final, not retried), else
        ConnectionClosedError (transient)."""
        if self._closed_by is not None and self.state == ConnState.CLOSED:
            return _unanswered(self.address, self._closed_by)
        return ConnectionClosedError(f"connection to nsqd at {self.address} is "
                                     f"{self.state}; cannot send")

    def command_into(self, data: bytes, waiter: Any) -> None:
        """Like command, with a caller-made waiter: any object with ``set_result``,
        ``set_exception``, ``done`` and ``exception`` (e.g. the Producer's request, which
        retries on failure; a concurrent.futures.Future works too)."""
        if self.state in _NOT_OPEN or self._closing_by_us:
            waiter.set_exception(self._cannot_send())
            return
        if not self._pending and self._answers is not None:
            self._answers.start()
        self._pending.append(waiter)
        self._send(data)

    # -- consumer commands ------------------------------------------------------------------

    def subscribe(self, topic: str, channel: str) -> "asyncio.Future[bytes]":
        """SUB topic channel; await the result (OK, or a typed error such as BadTopicError)."""
        data = protocol.sub(topic, channel)  # validates names before anything is sent
        if self.on_messages is None and self.on_blocks is None:
            raise NSQError("set on_messages (or on_blocks) before subscribing: messages need "
                           "a destination")
        if self.state != ConnState.CONNECTED:
            raise NSQError(f"cannot SUB on a {self.state} connection to {self.address}")
        self.state = ConnState.SUBSCRIBED
        self.topic, self.channel = topic, channel
        if self._stream is not None:  # answers only from here on: bounded (see the constant)
            self._stream.max_write_buffer_size = MAX_ANSWER_BACKLOG
        return self.command(data)

    def send_rdy(self, count: int) -> None:
        """RDY count (0..max_rdy_count, checked: nsqd would close the connection)."""
        if count > self.max_rdy_count:
            raise ValueError(f"RDY {count} is over nsqd {self.address}'s max_rdy_count "
                             f"{self.max_rdy_count} (nsqd --max-rdy-count)")
        self.rdy_count = count
        self._credit.on_rdy(count, self._aloop.time())  # type: ignore[union-attr]
        self._send(protocol.rdy(count))

    @property
    def writable(self) -> bool:
        """True while commands queued now still reach the socket: False once it is closed
        or ``close()`` has written its last buffer (answers then are dropped, not sent)."""
        stream = self._stream
        return (self.state != ConnState.CLOSED and not self._writes_done and stream is not None
                and not stream.closed())

    def fin(self, message_id: bytes) -> bool:
        """FIN one message; False (nothing queued) if the connection can no longer write."""
        if not self.writable:
            return False
        self._credit.answered += 1
        self._send(protocol.fin(message_id))
        return True

    def fin_many(self, message_ids: Sequence[bytes]) -> bool:
        """FIN several messages with one buffer append. False (nothing queued) if the
        connection can no longer write: the caller counts them as dropped, not finished."""
        if not self.writable:
            return False
        if message_ids:
            self._credit.answered += len(message_ids)
            self._send(protocol.fins(message_ids))
        return True

    def fin_blocks(self, blocks: Sequence[protocol.MessageBlock]) -> bool:
        """FIN every message of ``blocks`` with one buffer append; False (nothing queued)
        if the connection can no longer write."""
        if not self.writable:
            return False
        if blocks:
            self._credit.answered += sum(map(len, blocks))
            self._send(b"".join([b.fin_commands() for b in blocks]))
        return True

    def req(self, message_id: bytes, delay_ms: int = 0) -> bool:
        """REQ one message; False (nothing queued) if the connection can no longer write."""
        if not self.writable:
            return False
        self._credit.answered += 1
        self._send(protocol.req(message_id, max(0, int(delay_ms))))
        return True

    def touch(self, message_id: bytes) -> None:
        self._send(protocol.touch(message_id))

    # -- Responder (for messages when no Reader is in between); callable from any thread --

    def on_finish(self, msg: Message) -> None:
        self._bridge.call(self.fin, msg.id)

    def on_requeue(self, msg: Message, delay_ms: int | None, backoff: bool) -> None:
        self._bridge.call(self.req, msg.id, 0 if delay_ms is None else delay_ms)

    def on_touch(self, msg: Message) -> None:
        self._bridge.call(self.touch, msg.id)

    # -- producer commands ------------------------------------------------------------------

    def pub(self, topic: str, body: bytes) -> "asyncio.Future[bytes]":
        return self.command(protocol.pub(topic, body))

    def mpub(self, topic: str, bodies: Sequence[bytes]) -> "asyncio.Future[bytes]":
        return self.command(protocol.mpub(topic, bodies))

    def dpub(self, topic: str, defer_ms: int, body: bytes) -> "asyncio.Future[bytes]":
        return self.command(protocol.dpub(topic, defer_ms, body))

    # -- closing ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.state == ConnState.CLOSED

    @property
    def pending_responses(self) -> int:
        return len(self._pending)

    def send_cls(self) -> "asyncio.Future[bytes]":
        """CLS: nsqd stops sending messages and answers CLOSE_WAIT (the future's result).
        The connection stays open so in-flight messages can still be finished."""
        if self.state != ConnState.SUBSCRIBED:
            fut = self._aloop.create_future()  # type: ignore[union-attr]
            fut.set_result(_CLOSE_WAIT)
            return fut
        fut = self.command(protocol.cls())
        self.state = ConnState.CLOSING
        return fut

    def close(self) -> "asyncio.Future[None]":
        """Orderly close: CLS and wait for CLOSE_WAIT (if subscribed, bounded by
        ``close_timeout``), wait for outstanding publish answers (same bound), flush buffered
        writes, then close the socket. Returns a future (await it, or not)."""
        if self._close_task is None:
            if self.state in (ConnState.INIT, ConnState.CLOSED) or self._aloop is None:
                self.state = ConnState.CLOSED
                loop = self._aloop
                if loop is None or loop.is_closed():
                    loop = asyncio.get_running_loop()  # close() of a never-connected conn
                fut = loop.create_future()
                fut.set_result(None)
                return fut
            self._close_task = asyncio.ensure_future(self._close())
        return self._close_task

    async def _close(self) -> None:
        timeout = self.config.close_timeout
        deadline = self._aloop.time() + timeout  # type: ignore[union-attr]
        if self.state == ConnState.SUBSCRIBED:
            try:
                await asyncio.wait_for(asyncio.shield(self.send_cls()), timeout)
            except Exception:
                pass
        # outstanding answers, within close_timeout; the waiters may be any objects
        # (command_into), so poll rather than wait on them; the rest fail when it closes
        while self._pending and self.state != ConnState.CLOSED \
                and self._aloop.time() < deadline:  # type: ignore[union-attr]
            await asyncio.sleep(0.01)
        self._closing_by_us = True
        # answers (FIN/REQ) queued while we wait for the last write are still sent: flush
        # until nothing new was queued, within close_timeout
        while self.state != ConnState.CLOSED:
            self._flush()
            last = self._last_write
            if last is None or last.done():
                break
            remaining = max(0.01, deadline - self._aloop.time())  # type: ignore[union-attr]
            try:
                await asyncio.wait_for(asyncio.shield(last), remaining)
            except Exception:
                break
            if not self._wbuf and self._last_write is last:
                break
        self._writes_done = True  # from here fin/req refuse (their caller counts drops)
        if self._stream is not None:
            self._stream.close()
        if self._read_task is None:
            self._on_stream_closed(None)
        assert self._closed_fut is not None
        await self._closed_fut

    def abort(self, exc: BaseException | None = None) -> None:
        """Close the socket now (no CLS); on_close gets ``exc``."""
        if self.state == ConnState.CLOSED:
            return
        if exc is None:
            self._closing_by_us = True
        else:
            self._close_reason = exc
        self._writes_done = True
        if self._stream is not None:
            self._stream.close()
        if self._read_task is None:
            self._on_stream_closed(exc)

    async def wait_closed(self) -> None:
        """Wait until the connection is closed (by either side)."""
        if self._closed_fut is not None:
            await asyncio.shield(self._closed_fut)

    def _on_stream_closed(self, exc: BaseException | None) -> None:
        if self.state == ConnState.CLOSED:
            return
        self.state = ConnState.CLOSED
        self._closed_by = exc
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._answers is not None:
            self._answers.stop()
        if self._stream is not None and not self._stream.closed():
            self._stream.close()
        pending, self._pending = self._pending, deque()
        for fut in pending:
            if not fut.done():
                fut.set_exception(_unanswered(self.address, exc))
                fut.exception()  # mark retrieved: the owner may have stopped caring
        self._wbuf = []
        if exc is not None:
            self._log.warning("[%s] connection closed: %s", self.address, exc)
        else:
            self._log.debug("[%s] connection closed", self.address)
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)
        if self.on_close is not None:
            try:
                self.on_close(self, exc)
            except Exception:
                self._log.exception("[%s] on_close callback failed", self.address)


def _translate(address: str, response_timeout: float, exc: BaseException, when: str
               ) -> BaseException:
    """The typed error for what ended a connect or handshake."""
    if isinstance(exc, NSQError) or not isinstance(exc, Exception):
        return exc
    if isinstance(exc, asyncio.TimeoutError):
        return NSQTimeoutError(f"nsqd at {address} did not answer within "
                               f"{response_timeout}s {when}")
    if isinstance(exc, StreamClosedError) and isinstance(exc.real_error, ssl.SSLError):
        exc = exc.real_error
    if isinstance(exc, ssl.SSLError):
        return TLSError(f"TLS with nsqd at {address} failed {when}: {exc} (check "
                        "tls_ca_file / tls_cert_file, or the server's certificate)")
    if isinstance(exc, StreamClosedError):
        real = exc.real_error
        return ConnectionClosedError(f"nsqd at {address} closed the connection {when}"
                                     + (f": {real}" if real else ""))
    return exc


async def _start_tls(plain: IOStream, cfg: ConnectionConfig, server_hostname: str,
                     timeout: float, address: str) -> IOStream:
    """The TLS upgrade of ``plain`` within ``timeout`` (what is left of the handshake's)."""
    try:
        ctx = cfg.ssl_context()
    except (OSError, ssl.SSLError) as exc:
        raise TLSError(f"cannot set up TLS for {address}: {exc} (check tls_ca_file, "
                       "tls_cert_file, tls_key_file)") from exc
    try:
        stream = await asyncio.wait_for(
            plain.start_tls(False, ssl_options=ctx, server_hostname=server_hostname), timeout)
    except asyncio.TimeoutError:
        raise NSQTimeoutError(f"TLS handshake with nsqd at {address} did not finish within "
                              f"the handshake's response_timeout={cfg.response_timeout}s"
                              ) from None
    except (ssl.SSLError, StreamClosedError, OSError) as exc:
        raise _translate(address, cfg.response_timeout, exc, "during the TLS handshake"
                         ) from exc
    stream.set_nodelay(True)
    return stream


class _AnswerClock:
    """``response_timeout`` for a connection's commands, with one timer: while commands
    are outstanding (``waiting()``), an answer must come within ``timeout`` of the
    previous one (or of ``start()``, when none was outstanding); else ``expired(error)``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float, address: str,
                 waiting: Callable[[], bool], expired: Callable[[NSQTimeoutError], Any]
                 ) -> None:
        self.loop, self.timeout, self.address = loop, timeout, address
        self.waiting, self.expired = waiting, expired
        self.progress_at = 0.0
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.progress_at = self.loop.time()
        if self.timer is None:
            self.timer = self.loop.call_at(self.progress_at + self.timeout, self._check)

    def answered(self) -> None:
        self.progress_at = self.loop.time()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _check(self) -> None:
        self.timer = None
        if not self.waiting():
            return
        due = self.progress_at + self.timeout
        if self.loop.time() >= due:
            self.expired(NSQTimeoutError(
                f"nsqd at {self.address} did not answer a command within response_timeout="
                f"{self.timeout}s; closing the connection (raise response_timeout if nsqd "
                "is that slow)"))
        else:
            self.timer = self.loop.call_at(due, self._check)


def _keep_last_words(stream: IOStream, sink: bytearray) -> None:
    """Make ``stream``, when tornado closes it after a reset, first read into ``sink`` what
    already arrived (nsqd's error frame before it closed: see the module docstring)."""
    close_fd = stream.close_fd

    def read_then_close() -> None:
        error, sock = stream.error, stream.socket
        if sock is not None and isinstance(error, OSError) \
                and error.errno in (errno.ECONNRESET, errno.EPIPE):
            try:
                while len(sink) < (1 << 20):  # an error frame is small
                    chunk = sock.recv(65536)  # non-blocking: what is there, no more
                    if not chunk:
                        break
                    sink.extend(chunk)
            except (OSError, ValueError):
                pass
        close_fd()
        # the stream holds this function and this function the stream: undo it, so that a
        # closed stream (and its read buffer) is freed by its last reference, not by the
        # cyclic collector
        vars(stream).pop("close_fd", None)

    # an instance attribute: tornado calls self.close_fd() from close()
    setattr(stream, "close_fd", read_then_close)


def _frames_in(data: bytearray, codec: StreamCodec | None, decoder: protocol.FrameDecoder,
               max_frame_size: int, address: str) -> list[tuple[int, bytes]]:
    """The response/error frames in the bytes read after a reset (consumed); none when
    they do not decode (the reset explains the close then)."""
    raw = bytes(data)
    data.clear()
    try:
        if codec is not None:
            out = [codec.decompress(raw, max_frame_size)]
            while codec.has_pending_output and len(out) < 4:
                out.append(codec.decompress(b"", max_frame_size))
            raw = b"".join(out)
        return decoder.feed(raw)[1]
    except Exception as exc:  # noqa: BLE001 - garbage at the end
        log.for_nsqd(address).debug("[%s] unreadable bytes before the reset: %s", address, exc)
        return []


def _unanswered(address: str, exc: BaseException | None) -> BaseException:
    """What a command still waiting when the connection closed gets. nsqd's fatal error
    frame went to the command it answered; the ones queued behind it were not refused,
    only cut off (another attempt may succeed)."""
    if exc is None:
        return ConnectionClosedError(f"connection to nsqd at {address} closed before it "
                                     "answered")
    if isinstance(exc, NSQServerError):
        return ConnectionClosedError(f"nsqd at {address} closed the connection after "
                                     f"{exc.code} for an earlier command")
    return exc

