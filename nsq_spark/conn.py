"""One connection to one nsqd, on tornado's IOStream.

``Connection`` does the IO around the sans-IO :mod:`nsq_spark.protocol`: it sends the magic
and IDENTIFY, obeys the negotiated features (TLS upgrade, snappy or deflate stream
compression, AUTH), answers heartbeats, decodes every read chunk in one call and hands all
messages of the chunk to ``on_messages`` at once, and coalesces every command written during
one event-loop turn into a single socket write.

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
import json
import logging
import ssl
import struct
import threading
import time
import zlib
from collections import deque
from typing import Any, Callable, Iterable, Sequence

import cramjam
from tornado.iostream import IOStream, StreamClosedError
from tornado.tcpclient import TCPClient

from . import protocol
from .config import ConnectionConfig
from .errors import (AuthError, ConnectError, ConnectionClosedError, NSQError, NSQServerError,
                     NSQTimeoutError, ProtocolError, TLSError, error_from_frame)
from .message import Message, Responder

log = logging.getLogger(__name__)

__all__ = ["Connection"]

# connection states
INIT = "init"
CONNECTING = "connecting"
CONNECTED = "connected"      # handshake done, not subscribed (a producer connection)
SUBSCRIBED = "subscribed"
CLOSING = "closing"          # CLS sent, or closing
CLOSED = "closed"

_SIZE = struct.Struct(">i")
_NOP = protocol.nop()
_HEARTBEAT = protocol.HEARTBEAT
_CLOSE_WAIT = protocol.CLOSE_WAIT
_OK_FRAME = protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, protocol.OK)

MessagesCallback = Callable[["Connection", list[Message]], Any]
BlocksCallback = Callable[["Connection", list[protocol.MessageBlock]], Any]
CloseCallback = Callable[["Connection", "BaseException | None"], Any]


# -----------------------------------------------------------------------------------------
# stream compression (bulk: a whole read chunk is decompressed at once, then decoded)


class _SnappyStream:
    """Snappy *framed* stream format (what nsqd speaks), on cramjam.

    cramjam decompresses complete framed streams only, so incoming bytes are cut at chunk
    boundaries here (4-byte chunk header: type, 24-bit little-endian length); the complete
    chunks of each read go to cramjam in one call, the partial chunk waits for more bytes.
    """

    STREAM_ID = b"\xff\x06\x00\x00sNaPpY"

    def __init__(self) -> None:
        self._buf = b""

    def decompress(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        n = len(buf)
        pos = 0
        while n - pos >= 4:
            end = pos + 4 + (buf[pos + 1] | buf[pos + 2] << 8 | buf[pos + 3] << 16)
            if end > n:
                break
            pos = end
        if pos == 0:
            self._buf = buf
            return b""
        if pos == n:
            complete, self._buf = buf, b""
        else:
            complete, self._buf = buf[:pos], buf[pos:]
        if not complete.startswith(self.STREAM_ID):
            complete = self.STREAM_ID + complete  # cramjam insists on the stream header first
        try:
            return bytes(cramjam.snappy.decompress(complete))
        except Exception as exc:  # cramjam.DecompressionError and friends
            raise ProtocolError(f"corrupt snappy stream from nsqd: {exc}") from exc

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def compress(self, data: bytes) -> bytes:
        # each write is a complete framed stream; repeated stream identifiers are allowed
        return bytes(cramjam.snappy.compress(data))


class _DeflateStream:
    """Raw deflate (no zlib header), sync-flushed after each write, as nsqd does."""

    def __init__(self, level: int) -> None:
        self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        self._c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)

    def decompress(self, data: bytes) -> bytes:
        try:
            return self._d.decompress(data)
        except zlib.error as exc:
            raise ProtocolError(f"corrupt deflate stream from nsqd: {exc}") from exc

    @property
    def buffered(self) -> int:
        return len(self._d.unconsumed_tail)

    def compress(self, data: bytes) -> bytes:
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)


# -----------------------------------------------------------------------------------------


class _Negotiated:
    """What the IDENTIFY answer decided (shared by the async and the blocking connection)."""

    address: str
    config: ConnectionConfig

    def _init_negotiated(self) -> None:
        # defaults are nsqd's
        self.identify_response: dict[str, Any] = {}
        self.auth_response: dict[str, Any] = {}
        self.max_rdy_count = 2500
        self.msg_timeout = 60000
        self.max_msg_timeout = 15 * 60 * 1000
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
        self.auth_required = False
        self.sample_rate = 0
        self.output_buffer_size: int | None = None
        self.output_buffer_timeout: int | None = None
        self.nsqd_version: str | None = None

    def _apply_identify(self, resp: dict[str, Any]) -> None:
        self.identify_response = resp
        self.max_rdy_count = int(resp.get("max_rdy_count", self.max_rdy_count))
        self.msg_timeout = int(resp.get("msg_timeout", self.msg_timeout))
        self.max_msg_timeout = int(resp.get("max_msg_timeout", self.max_msg_timeout))
        self.tls = bool(resp.get("tls_v1", False))
        self.snappy = bool(resp.get("snappy", False))
        self.deflate = bool(resp.get("deflate", False))
        self.deflate_level = int(resp.get("deflate_level", 0) or 0)
        self.auth_required = bool(resp.get("auth_required", False))
        self.sample_rate = int(resp.get("sample_rate", 0) or 0)
        self.output_buffer_size = resp.get("output_buffer_size")
        self.output_buffer_timeout = resp.get("output_buffer_timeout")
        self.nsqd_version = resp.get("version")
        cfg = self.config
        if cfg.snappy and not self.snappy:
            log.warning("[%s] snappy requested but nsqd refused it (--snappy=false?)", self.address)
        if cfg.deflate and not self.deflate:
            log.warning("[%s] deflate requested but nsqd refused it (--deflate=false?)", self.address)


class Connection(_Negotiated):
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
        self.address = f"{host}:{self.port}"
        self.config = config
        if on_messages is not None and on_blocks is not None:
            raise ValueError("give on_messages or on_blocks, not both")
        # one delivery callback; _blocks says which decoder feeds it
        self.on_messages: MessagesCallback | BlocksCallback | None = on_messages or on_blocks
        self._blocks = on_blocks is not None
        self.on_close = on_close
        self.on_response = on_response
        self.on_error = on_error
        self.on_heartbeat = on_heartbeat
        self.state = INIT

        self._init_negotiated()

        # consumer bookkeeping (the Reader's policies read these)
        self.rdy_count = 0           # last RDY sent
        self.in_flight = 0           # delivered and not yet FIN/REQ'd through this conn
        self.messages_received = 0
        self.last_recv = 0.0         # event-loop time of the last bytes received
        self.last_message = 0.0      # event-loop time of the last message received

        self._responder = responder if responder is not None else self
        self._decoder = protocol.FrameDecoder(self._responder, config.max_frame_size)
        self._codec: _SnappyStream | _DeflateStream | None = None
        self._stream: IOStream | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._thread_id: int | None = None
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
        self._closing_by_us = False
        self._writes_done = False  # close() wrote its last buffer: fin/req refuse

    def __repr__(self) -> str:
        return f"<Connection {self.address} {self.state}>"

    # -- connect and handshake ------------------------------------------------------------

    async def connect(self) -> "Connection":
        """Open the connection: magic, IDENTIFY, TLS/compression upgrade, AUTH. Raises
        ConnectError, TLSError, AuthError, NSQTimeoutError or an NSQServerError."""
        if self.state != INIT:
            raise NSQError(f"connect() was already called on {self!r}; make a new Connection "
                           "to reconnect")
        self.state = CONNECTING
        self._aloop = asyncio.get_running_loop()
        self._thread_id = threading.get_ident()
        self._closed_fut = self._aloop.create_future()
        cfg = self.config
        try:
            stream = await asyncio.wait_for(TCPClient().connect(self.host, self.port),
                                            cfg.connect_timeout)
        except asyncio.TimeoutError:
            self._fail_connect()
            raise ConnectError(f"timed out after {cfg.connect_timeout}s connecting to nsqd at "
                               f"{self.address}; is it reachable?") from None
        except (OSError, StreamClosedError) as exc:
            self._fail_connect()
            real = getattr(exc, "real_error", None) or exc
            raise ConnectError(f"cannot connect to nsqd at {self.address}: {real}; is nsqd "
                               "running and listening there?") from exc
        self._stream = stream
        stream.set_nodelay(True)
        try:
            await self._handshake()
        except BaseException as exc:
            self._fail_connect()
            raise self._translate(exc, "during the handshake") from exc
        self.state = CONNECTED
        self.last_recv = self._aloop.time()
        self._read_task = asyncio.ensure_future(self._read_loop())
        hb = cfg.heartbeat_interval_ms
        if hb > 0:
            self._watchdog = self._aloop.call_later(hb / 1000.0, self._check_heartbeat)
        log.debug("[%s] connected (tls=%s snappy=%s deflate=%s auth=%s)", self.address,
                  self.tls, self.snappy, self.deflate, self.auth_required)
        return self

    def _fail_connect(self) -> None:
        self.state = CLOSED
        if self._stream is not None:
            try:
                self._stream.close()
            except Exception:  # a stream half-way through start_tls
                pass
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)

    def _translate(self, exc: BaseException, when: str) -> BaseException:
        if isinstance(exc, NSQError) or not isinstance(exc, Exception):
            return exc
        if isinstance(exc, asyncio.TimeoutError):
            return NSQTimeoutError(f"nsqd at {self.address} did not answer within "
                                   f"{self.config.response_timeout}s {when}")
        if isinstance(exc, ssl.SSLError):
            return TLSError(f"TLS with nsqd at {self.address} failed {when}: {exc} (check "
                            "tls_ca_file / tls_cert_file, or the server's certificate)")
        if isinstance(exc, StreamClosedError):
            real = exc.real_error
            if isinstance(real, ssl.SSLError):
                return TLSError(f"TLS with nsqd at {self.address} failed {when}: {real} (check "
                                "tls_ca_file / tls_cert_file, or the server's certificate)")
            return ConnectionClosedError(f"nsqd at {self.address} closed the connection {when}"
                                         + (f": {real}" if real else ""))
        return exc

    async def _handshake(self) -> None:
        cfg = self.config
        self._write_now(protocol.MAGIC_V2 + protocol.identify(cfg.identify_payload()))
        ftype, data = await self._read_handshake_frame()
        if ftype == protocol.FRAME_TYPE_ERROR:
            raise error_from_frame(data, self.address)
        resp = protocol.parse_identify_response(data)
        self._apply_identify(resp)

        if cfg.tls_v1 and not self.tls:
            raise TLSError(f"nsqd at {self.address} does not offer TLS (start it with "
                           "--tls-cert and --tls-key) but tls_v1 was requested")
        if self.tls:
            await self._upgrade_tls()
            try:
                await self._expect_ok("the TLS upgrade")
            except (StreamClosedError, ssl.SSLError, ConnectionError) as exc:
                real = getattr(exc, "real_error", None) or exc
                raise TLSError(f"nsqd at {self.address} dropped the connection right after the "
                               f"TLS handshake ({real}): it refused our client certificate? "
                               "(check tls_cert_file/tls_key_file against nsqd's "
                               "--tls-client-auth-policy and --tls-root-ca-file)") from exc
        if self.snappy:
            self._codec = _SnappyStream()
            await self._expect_ok("the snappy upgrade")
        elif self.deflate:
            self._codec = _DeflateStream(self.deflate_level or cfg.deflate_level)
            await self._expect_ok("the deflate upgrade")

        if self.auth_required:
            if cfg.auth_secret is None:
                raise AuthError(f"nsqd at {self.address} requires AUTH: set the auth_secret "
                                "connection option")
            self._write_now(protocol.auth(cfg.auth_secret))
            ftype, data = await self._read_handshake_frame()
            if ftype == protocol.FRAME_TYPE_ERROR:
                raise error_from_frame(data, self.address)
            try:
                self.auth_response = json.loads(data)
            except ValueError as exc:
                raise ProtocolError(f"AUTH response from {self.address} is not JSON: "
                                    f"{data[:100]!r}") from exc
            log.info("[%s] authenticated as %r (%s permissions)", self.address,
                     self.auth_response.get("identity"),
                     self.auth_response.get("permission_count"))
        elif cfg.auth_secret is not None:
            log.warning("[%s] auth_secret is set but nsqd does not require AUTH; not sent",
                        self.address)

    async def _upgrade_tls(self) -> None:
        assert self._stream is not None
        cfg = self.config
        try:
            ctx = cfg.ssl_context()
        except (OSError, ssl.SSLError) as exc:
            raise TLSError(f"cannot set up TLS for {self.address}: {exc} (check tls_ca_file, "
                           "tls_cert_file, tls_key_file)") from exc
        server_hostname = cfg.tls_server_hostname or self.host
        plain, self._stream = self._stream, None  # start_tls detaches the plain stream
        try:
            self._stream = await asyncio.wait_for(
                plain.start_tls(False, ssl_options=ctx, server_hostname=server_hostname),
                cfg.response_timeout)
        except asyncio.TimeoutError:
            raise TLSError(f"TLS handshake with nsqd at {self.address} timed out") from None
        except (ssl.SSLError, StreamClosedError, OSError) as exc:
            raise self._translate(exc, "during the TLS handshake") from exc
        self._stream.set_nodelay(True)

    async def _expect_ok(self, what: str) -> None:
        ftype, data = await self._read_handshake_frame()
        if ftype == protocol.FRAME_TYPE_ERROR:
            raise error_from_frame(data, self.address)
        if data != protocol.OK:
            raise ProtocolError(f"nsqd at {self.address} answered {data[:100]!r} after {what}, "
                                "expected OK")

    async def _read_handshake_frame(self) -> tuple[int, bytes]:
        """The next response/error frame. Before compression, frames are read exactly (so no
        byte of the upgraded stream is read as plain); after it, through the codec."""
        assert self._stream is not None
        timeout = self.config.response_timeout
        while True:
            while self._early:
                ftype, data = self._early.popleft()
                if ftype == protocol.FRAME_TYPE_RESPONSE and data == _HEARTBEAT:
                    self._write_now(_NOP)
                    continue
                return ftype, data
            if self._codec is None:
                header = await asyncio.wait_for(self._stream.read_bytes(4), timeout)
                size = _SIZE.unpack(header)[0]
                if size < 4 or size > self.config.max_frame_size:
                    raise ProtocolError(f"nsqd at {self.address} sent a frame of size {size} "
                                        "during the handshake; is this an NSQ V2 server?")
                body = await asyncio.wait_for(self._stream.read_bytes(size), timeout)
                chunk = header + body
            else:
                raw = await asyncio.wait_for(self._stream.read_bytes(65536, partial=True), timeout)
                chunk = self._codec.decompress(raw)
            msgs, others = self._decoder.feed(chunk)
            if msgs:
                raise ProtocolError(f"nsqd at {self.address} sent messages before SUB")
            self._early.extend(others)

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
        feed = self._decoder.feed_blocks if blocks else self._decoder.feed
        # tornado's read_bytes allocates a fresh zeroed buffer of read_chunk_size per socket
        # read; read_into fills one preallocated buffer instead, and one copy makes the bytes
        rbuf = bytearray(self.config.read_size)
        rview = memoryview(rbuf)
        read_into = stream.read_into
        exc: BaseException | None = None
        try:
            if self._early:
                others = list(self._early)
                self._early.clear()
                self._handle_frames(others)
            while True:
                n = await read_into(rbuf, partial=True)
                data = rview[:n].tobytes()
                self.last_recv = now = time_()
                codec = self._codec
                if codec is not None:
                    data = codec.decompress(data)
                    if not data:
                        continue
                msgs, others = feed(data)
                if others:
                    self._handle_frames(others)
                if msgs:
                    n = sum(map(len, msgs)) if blocks else len(msgs)
                    self.in_flight += n
                    self.messages_received += n
                    self.last_message = now
                    cb = self.on_messages
                    if cb is None:
                        raise ProtocolError(f"nsqd at {self.address} sent messages but the "
                                            "connection has no on_messages/on_blocks "
                                            "callback")
                    try:
                        cb(self, msgs)
                    except Exception:
                        log.exception("[%s] on_messages callback failed", self.address)
        except StreamClosedError as e:
            exc = self._close_cause(e)
        except Exception as e:  # ProtocolError and anything unexpected end the connection
            exc = e
            log.error("[%s] closing connection: %s", self.address, e)
        self._on_stream_closed(exc)

    def _close_cause(self, e: StreamClosedError) -> BaseException | None:
        if self._closing_by_us:
            return None
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
        for ftype, data in frames:
            if ftype == 0:
                if data == _HEARTBEAT:
                    self._send(_NOP)
                    if self.on_heartbeat is not None:
                        self._callback(self.on_heartbeat, self)
                elif self._pending:
                    fut = self._pending.popleft()
                    if not fut.done():
                        fut.set_result(data)
                elif self.on_response is not None:
                    self._callback(self.on_response, self, data)
                else:
                    log.debug("[%s] unexpected response %r", self.address, data[:100])
            else:
                exc = error_from_frame(data, self.address)
                if exc.fatal:
                    log.error("[%s] %s", self.address, exc)
                    self._close_reason = exc
                    if self._pending:
                        fut = self._pending.popleft()
                        if not fut.done():
                            fut.set_exception(exc)
                            fut.exception()  # mark retrieved; an awaiting caller still gets it
                else:
                    log.warning("[%s] %s", self.address, exc)
                if self.on_error is not None:
                    self._callback(self.on_error, self, exc)

    def _callback(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("[%s] %s callback failed", self.address, getattr(fn, "__name__", fn))

    def _check_heartbeat(self) -> None:
        self._watchdog = None
        if self.state in (CLOSED,) or self._aloop is None:
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

    def send(self, data: bytes) -> None:
        """Queue raw command bytes (flushed with everything else of this loop turn)."""
        self._send(data)

    def command(self, data: bytes) -> "asyncio.Future[bytes]":
        """Queue a command that nsqd answers (SUB, PUB, MPUB, DPUB, CLS); the future gets
        the response (``b"OK"``), or the typed error nsqd sent, or ConnectionClosedError."""
        assert self._aloop is not None, "connect() first"
        fut: asyncio.Future[bytes] = self._aloop.create_future()
        if self.state in (CLOSED, INIT, CONNECTING) or self._closing_by_us:
            fut.set_exception(ConnectionClosedError(
                f"connection to nsqd at {self.address} is {self.state}; cannot send"))
            return fut
        self._pending.append(fut)
        self._send(data)
        return fut

    def command_into(self, data: bytes, waiter: Any) -> None:
        """Like command, with a caller-made waiter: any object with ``set_result``,
        ``set_exception``, ``done`` and ``exception`` (e.g. the Producer's request, which
        retries on failure; a concurrent.futures.Future works too)."""
        if self.state in (CLOSED, INIT, CONNECTING) or self._closing_by_us:
            waiter.set_exception(ConnectionClosedError(
                f"connection to nsqd at {self.address} is {self.state}; cannot send"))
            return
        self._pending.append(waiter)
        self._send(data)

    # -- consumer commands ------------------------------------------------------------------

    def subscribe(self, topic: str, channel: str) -> "asyncio.Future[bytes]":
        """SUB topic channel; await the result (OK, or a typed error such as BadTopicError)."""
        data = protocol.sub(topic, channel)  # validates names before anything is sent
        if self.on_messages is None:
            raise NSQError("set on_messages (or on_blocks) before subscribing: messages need "
                           "a destination")
        if self.state != CONNECTED:
            raise NSQError(f"cannot SUB on a {self.state} connection to {self.address}")
        self.state = SUBSCRIBED
        self.topic, self.channel = topic, channel
        return self.command(data)

    def send_rdy(self, count: int) -> None:
        """RDY count (0..max_rdy_count, checked: nsqd would close the connection)."""
        if count > self.max_rdy_count:
            raise ValueError(f"RDY {count} is over nsqd {self.address}'s max_rdy_count "
                             f"{self.max_rdy_count} (nsqd --max-rdy-count)")
        self.rdy_count = count
        self._send(protocol.rdy(count))

    @property
    def writable(self) -> bool:
        """True while commands queued now still reach the socket: False once it is closed
        or ``close()`` has written its last buffer (answers then are dropped, not sent)."""
        stream = self._stream
        return (self.state != CLOSED and not self._writes_done and stream is not None
                and not stream.closed())

    def fin(self, message_id: bytes) -> bool:
        """FIN one message; False (nothing queued) if the connection can no longer write."""
        if not self.writable:
            return False
        self.in_flight -= 1
        self._send(b"FIN " + message_id + b"\n")
        return True

    def fin_many(self, message_ids: Sequence[bytes]) -> bool:
        """FIN several messages with one buffer append. False (nothing queued) if the
        connection can no longer write: the caller counts them as dropped, not finished."""
        if not self.writable:
            return False
        if message_ids:
            self.in_flight -= len(message_ids)
            self._send(b"".join([b"FIN " + i + b"\n" for i in message_ids]))
        return True

    def fin_blocks(self, blocks: Sequence[protocol.MessageBlock]) -> bool:
        """FIN every message of ``blocks`` with one buffer append; False (nothing queued)
        if the connection can no longer write."""
        if not self.writable:
            return False
        if blocks:
            self.in_flight -= sum(map(len, blocks))
            self._send(b"".join([b.fin_commands() for b in blocks]))
        return True

    def req(self, message_id: bytes, delay_ms: int = 0) -> bool:
        """REQ one message; False (nothing queued) if the connection can no longer write."""
        if not self.writable:
            return False
        self.in_flight -= 1
        self._send(b"REQ " + message_id + b" %d\n" % max(0, int(delay_ms)))
        return True

    def touch(self, message_id: bytes) -> None:
        self._send(b"TOUCH " + message_id + b"\n")

    # -- Responder (for messages when no Reader is in between); callable from any thread --

    def _on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        if threading.get_ident() == self._thread_id:
            fn(*args)
        else:
            self._aloop.call_soon_threadsafe(fn, *args)  # type: ignore[union-attr]

    def on_finish(self, msg: Message) -> None:
        self._on_loop(self.fin, msg.id)

    def on_requeue(self, msg: Message, delay_ms: int | None, backoff: bool) -> None:
        self._on_loop(self.req, msg.id, 0 if delay_ms is None else delay_ms)

    def on_touch(self, msg: Message) -> None:
        self._on_loop(self.touch, msg.id)

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
        return self.state == CLOSED

    @property
    def pending_responses(self) -> int:
        return len(self._pending)

    def send_cls(self) -> "asyncio.Future[bytes]":
        """CLS: nsqd stops sending messages and answers CLOSE_WAIT (the future's result).
        The connection stays open so in-flight messages can still be finished."""
        if self.state != SUBSCRIBED:
            fut = self._aloop.create_future()  # type: ignore[union-attr]
            fut.set_result(_CLOSE_WAIT)
            return fut
        fut = self.command(protocol.cls())
        self.state = CLOSING
        return fut

    def close(self) -> "asyncio.Future[None]":
        """Orderly close: CLS and wait for CLOSE_WAIT (if subscribed, bounded by
        ``close_timeout``), wait for outstanding publish answers (same bound), flush buffered
        writes, then close the socket. Returns a future (await it, or not)."""
        if self._close_task is None:
            if self.state in (INIT, CLOSED) or self._aloop is None:
                self.state = CLOSED
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
        if self.state == SUBSCRIBED:
            try:
                await asyncio.wait_for(asyncio.shield(self.send_cls()), timeout)
            except Exception:
                pass
        if self._pending and self.state != CLOSED:
            remaining = max(0.0, deadline - self._aloop.time())  # type: ignore[union-attr]
            await asyncio.wait(list(self._pending), timeout=remaining)
        self._closing_by_us = True
        # answers (FIN/REQ) queued while we wait for the last write are still sent: flush
        # until nothing new was queued, within close_timeout
        while self.state != CLOSED:
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
        if self.state == CLOSED:
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
        if self.state == CLOSED:
            return
        self.state = CLOSED
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._stream is not None and not self._stream.closed():
            self._stream.close()
        pending, self._pending = self._pending, deque()
        for fut in pending:
            if not fut.done():
                fut.set_exception(exc if exc is not None else ConnectionClosedError(
                    f"connection to nsqd at {self.address} closed before it answered"))
                fut.exception()  # mark retrieved: the owner may have stopped caring
        self._wbuf = []
        if exc is not None:
            log.warning("[%s] connection closed: %s", self.address, exc)
        else:
            log.debug("[%s] connection closed", self.address)
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)
        if self.on_close is not None:
            try:
                self.on_close(self, exc)
            except Exception:
                log.exception("[%s] on_close callback failed", self.address)


# -----------------------------------------------------------------------------------------


class SyncConnection(_Negotiated):
    """A blocking nsqd connection for publishing from the caller's thread.

    On loopback an nsqd round trip takes about 10 microseconds; a hop to an event-loop
    thread and back costs ten times that. So the Producer's blocking calls talk to nsqd
    directly through this class: same handshake as :class:`Connection` (IDENTIFY, TLS,
    snappy/deflate, AUTH), plain sockets. Threads that share it pipeline: each writes its
    command at once (in order, under a write lock), then whichever thread holds the read
    lock reads answers in order and hands each to the thread whose command it answers, until
    its own has come (leader/follower). Heartbeats that arrive while waiting for an answer
    are answered with NOP; a connection left idle for longer than the heartbeat interval
    is reopened before use (nsqd drops clients silent for two intervals).
    """

    def __init__(self, host: str, port: int, config: ConnectionConfig | None = None) -> None:
        self.host = host
        self.port = int(port)
        self.address = f"{host}:{self.port}"
        self.config = config or ConnectionConfig()
        self._init_negotiated()
        self._sock: Any = None
        self._codec: _SnappyStream | _DeflateStream | None = None
        self._decoder = protocol.FrameDecoder(None, self.config.max_frame_size)
        self._frames: deque[tuple[int, bytes]] = deque()
        self._wlock = threading.Lock()  # writes, and the order of _waiting
        self._rlock = threading.Lock()  # reading answers
        self._waiting: deque[_Waiter] = deque()
        self.last_used = 0.0
        self.closed = True

    def __repr__(self) -> str:
        return f"<SyncConnection {self.address} {'closed' if self.closed else 'open'}>"

    # -- connect ----------------------------------------------------------------------------

    def connect(self) -> "SyncConnection":
        """Open and negotiate; raises the same typed errors as Connection.connect."""
        import socket

        cfg = self.config
        try:
            sock = socket.create_connection((self.host, self.port), timeout=cfg.connect_timeout)
        except socket.timeout:
            raise ConnectError(f"timed out after {cfg.connect_timeout}s connecting to nsqd at "
                               f"{self.address}; is it reachable?") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to nsqd at {self.address}: {exc}; is nsqd "
                               "running and listening there?") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(cfg.response_timeout)
        self._sock = sock
        self._codec = None
        self._decoder.reset()
        self._frames.clear()
        self.closed = False
        try:
            self._handshake()
        except BaseException as exc:
            self.close()
            if isinstance(exc, NSQError) or not isinstance(exc, Exception):
                raise
            if isinstance(exc, socket.timeout):
                raise NSQTimeoutError(f"nsqd at {self.address} did not answer within "
                                      f"{cfg.response_timeout}s during the handshake") from exc
            if isinstance(exc, ssl.SSLError):
                raise TLSError(f"TLS with nsqd at {self.address} failed: {exc} (check "
                               "tls_ca_file / tls_cert_file, or the server's certificate)") from exc
            raise ConnectionClosedError(f"nsqd at {self.address} closed the connection during "
                                        f"the handshake: {exc}") from exc
        # From here on a blocking socket with kernel timeouts: a Python-level timeout
        # costs a poll() before every send and recv, which doubles a 10 us round trip.
        try:
            t = cfg.response_timeout
            tv = struct.pack("ll", int(t), int((t - int(t)) * 1e6))
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
            self._sock.settimeout(None)
        except (OSError, struct.error):  # pragma: no cover - platform without them
            pass
        self.last_used = time.monotonic()
        return self

    def _handshake(self) -> None:
        cfg = self.config
        self._sock.sendall(protocol.MAGIC_V2 + protocol.identify(cfg.identify_payload()))
        ftype, data = self._read_frame(exact=True)
        if ftype == protocol.FRAME_TYPE_ERROR:
            raise error_from_frame(data, self.address)
        self._apply_identify(protocol.parse_identify_response(data))
        if cfg.tls_v1 and not self.tls:
            raise TLSError(f"nsqd at {self.address} does not offer TLS (start it with "
                           "--tls-cert and --tls-key) but tls_v1 was requested")
        if self.tls:
            try:
                ctx = cfg.ssl_context()
                self._sock = ctx.wrap_socket(self._sock,
                                             server_hostname=cfg.tls_server_hostname or self.host)
            except (OSError, ssl.SSLError) as exc:
                raise TLSError(f"TLS with nsqd at {self.address} failed: {exc} (check "
                               "tls_ca_file / tls_cert_file, or the server's certificate)") from exc
            try:
                self._expect_ok(exact=True)
            except (ssl.SSLError, ConnectionError, OSError) as exc:
                raise TLSError(f"nsqd at {self.address} dropped the connection right after the "
                               f"TLS handshake ({exc}): it refused our client certificate? "
                               "(check tls_cert_file/tls_key_file)") from exc
        if self.snappy:
            self._codec = _SnappyStream()
            self._expect_ok()
        elif self.deflate:
            self._codec = _DeflateStream(self.deflate_level or cfg.deflate_level)
            self._expect_ok()
        if self.auth_required:
            if cfg.auth_secret is None:
                raise AuthError(f"nsqd at {self.address} requires AUTH: set the auth_secret "
                                "connection option")
            self._write(protocol.auth(cfg.auth_secret))
            ftype, data = self._read_frame()
            if ftype == protocol.FRAME_TYPE_ERROR:
                raise error_from_frame(data, self.address)
            try:
                self.auth_response = json.loads(data)
            except ValueError as exc:
                raise ProtocolError(f"AUTH response from {self.address} is not JSON") from exc

    def _expect_ok(self, exact: bool = False) -> None:
        ftype, data = self._read_frame(exact)
        if ftype == protocol.FRAME_TYPE_ERROR:
            raise error_from_frame(data, self.address)
        if data != protocol.OK:
            raise ProtocolError(f"nsqd at {self.address} answered {data[:100]!r}, expected OK")

    # -- IO ---------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self._codec is not None:
            data = self._codec.compress(data)
        self._sock.sendall(data)

    def _recv_exact(self, n: int) -> bytes:
        parts = []
        while n:
            chunk = self._sock.recv(n)
            if not chunk:
                raise ConnectionClosedError(f"nsqd at {self.address} closed the connection")
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def _read_frame(self, exact: bool = False) -> tuple[int, bytes]:
        """The next response/error frame (heartbeats answered and skipped). ``exact``
        reads frame by frame (before a TLS or compression upgrade nothing more may be
        read)."""
        while True:
            while self._frames:
                ftype, data = self._frames.popleft()
                if ftype == protocol.FRAME_TYPE_RESPONSE and data == _HEARTBEAT:
                    self._answer_heartbeat()
                    continue
                return ftype, data
            if exact:
                header = self._recv_exact(4)
                size = _SIZE.unpack(header)[0]
                if size < 4 or size > self.config.max_frame_size:
                    raise ProtocolError(f"nsqd at {self.address} sent a frame of size {size}; "
                                        "is this an NSQ V2 server?")
                chunk = header + self._recv_exact(size)
            else:
                raw = self._sock.recv(65536)
                if not raw:
                    partial = self._decoder.buffered
                    where = (f" in the middle of a frame ({partial} bytes of an incomplete "
                             "frame received)") if partial else ""
                    raise ConnectionClosedError(f"nsqd at {self.address} closed the "
                                                f"connection{where}")
                chunk = self._codec.decompress(raw) if self._codec is not None else raw
            msgs, others = self._decoder.feed(chunk)
            if msgs:
                raise ProtocolError(f"nsqd at {self.address} sent messages to a publisher")
            self._frames.extend(others)

    def _answer_heartbeat(self) -> None:
        # Another thread may be half-way through writing a command (a large MPUB takes
        # several send calls; compressed data must go out in compression order): a NOP
        # written then corrupts the stream. Write it only under the write lock; if a writer
        # holds it, skip: the command being written resets nsqd's read deadline as well.
        if self._wlock.acquire(blocking=False):
            try:
                if self._sock is not None:
                    self._write(_NOP)
            finally:
                self._wlock.release()

    def command(self, data: bytes) -> bytes:
        """Send one command and return nsqd's answer (``b"OK"``), or raise its typed
        error (a fatal one also closes this connection). Thread-safe, pipelined."""
        w = _Waiter()
        with self._wlock:
            if self.closed:
                raise ConnectionClosedError(f"connection to nsqd at {self.address} is closed")
            self._waiting.append(w)
            try:
                self._write(data)
            except Exception as exc:
                self._abort(self._map_error(exc))
        with self._rlock:
            while not w.done:
                try:
                    ftype, resp = self._next_answer()
                except Exception as exc:
                    self._abort(self._map_error(exc))
                    break
                except BaseException:
                    self._abort(ConnectionClosedError(f"reading from nsqd at {self.address} "
                                                      "was interrupted"))
                    raise
                try:
                    head = self._waiting.popleft()
                except IndexError:
                    self._abort(ProtocolError(f"nsqd at {self.address} answered a command "
                                              "that was not sent"))
                    break
                head.ftype, head.data, head.done = ftype, resp, True
            self.last_used = time.monotonic()
        if w.exc is not None:
            raise w.exc
        if w.ftype == protocol.FRAME_TYPE_ERROR:
            exc2 = error_from_frame(w.data, self.address)
            if exc2.fatal:
                self._abort(ConnectionClosedError(
                    f"nsqd at {self.address} closed the connection after {exc2.code}"))
            raise exc2
        return w.data

    def _next_answer(self) -> tuple[int, bytes]:
        if self._sock is None:
            raise ConnectionClosedError(f"connection to nsqd at {self.address} is closed")
        if self._codec is None and not self._frames and not self._decoder.buffered:
            raw = self._sock.recv(65536)
            if raw == _OK_FRAME:  # the usual answer, whole: skip the decoder
                return protocol.FRAME_TYPE_RESPONSE, protocol.OK
            if not raw:
                raise ConnectionClosedError(f"nsqd at {self.address} closed the connection")
            self._frames.extend(self._decoder.feed(raw)[1])
        return self._read_frame()

    def _map_error(self, exc: Exception) -> Exception:
        import socket

        if isinstance(exc, (socket.timeout, BlockingIOError, ssl.SSLWantReadError,
                            ssl.SSLWantWriteError)):  # the kernel timeout surfaces as EAGAIN
            return NSQTimeoutError(f"nsqd at {self.address} did not answer within "
                                   f"{self.config.response_timeout}s")
        if isinstance(exc, NSQError):
            return exc
        if isinstance(exc, (OSError, AttributeError)):  # AttributeError: socket gone
            return ConnectionClosedError(f"connection to nsqd at {self.address} failed: {exc}")
        return exc

    def _abort(self, exc: Exception) -> None:
        """Close, and fail every command still waiting for an answer."""
        self._close_socket()
        while self._waiting:
            try:
                w = self._waiting.popleft()
            except IndexError:
                break
            if not w.done:
                w.exc, w.done = exc, True

    def ensure_open(self) -> "SyncConnection":
        """Connect if closed, reconnect if stale; thread-safe."""
        with self._wlock, self._rlock:
            if not self.closed and not self.stale:
                return self
            self._abort(ConnectionClosedError(f"connection to nsqd at {self.address} was "
                                              "reopened"))
            self._frames.clear()
            self.connect()
        return self

    @property
    def stale(self) -> bool:
        """Idle past the heartbeat interval: nsqd may be about to drop it; reopen first."""
        hb = self.config.heartbeat_interval_ms
        return hb > 0 and time.monotonic() - self.last_used > hb / 1000.0

    def close(self) -> None:
        """Close now; commands still waiting get ConnectionClosedError."""
        self._abort(ConnectionClosedError(f"connection to nsqd at {self.address} was closed"))

    def _close_socket(self) -> None:
        import socket

        self.closed = True
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass


class _Waiter:
    """One blocking command waiting for its answer (see SyncConnection.command)."""

    __slots__ = ("done", "ftype", "data", "exc")

    def __init__(self) -> None:
        self.done = False
        self.ftype = 0
        self.data = b""
        self.exc: Exception | None = None
