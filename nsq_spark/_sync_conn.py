"""A blocking nsqd connection, for publishing from the caller's thread.

:class:`SyncConnection` does blocking socket IO only: the handshake is
:class:`nsq_spark._handshake.Handshake`'s (the same object :class:`~nsq_spark._conn.Connection`
drives on tornado), the wire format :mod:`nsq_spark.protocol`'s, the compression
:mod:`nsq_spark._codecs`'. Importable from :mod:`nsq_spark._conn` as well, where it lived.

Deadlines are totals, not per socket call, so a server that drips one byte at a time cannot
stretch them: opening the TCP connection takes at most ``connect_timeout``, the whole
handshake after it (IDENTIFY, TLS, compression, AUTH) at most ``response_timeout``, and each
answer to a command at most ``response_timeout`` (or less, when the caller's own deadline
-- the Producer's ``publish_timeout`` -- comes first); past it, NSQTimeoutError.

nsqd refuses an oversize body on its size prefix, writes ``E_BAD_MESSAGE`` and closes while
we are still sending the body: our write then meets a reset. The error frame is already in
our receive buffer, so a write that fails with a reset goes on to read the answers that
came: the caller gets BadMessageError (permanent) instead of a lost connection (retried).
"""

from __future__ import annotations

import ssl
import struct
import threading
import time
from collections import deque
from typing import Any

from . import protocol
from ._addresses import Address
from ._codecs import StreamCodec, make_codec
from .config import ConnectionConfig
from .errors import (ConnectError, ConnectionClosedError, NSQError, NSQTimeoutError,
                     ProtocolError, TLSError, error_from_frame)
from ._handshake import (ConnState, Handshake, InstallCodec, Negotiated, NegotiatedAttributes,
                        SendBytes, StartTLS)

__all__ = ["SyncConnection"]

_NOP = protocol.nop()
_HEARTBEAT = protocol.HEARTBEAT
_OK_FRAME = protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, protocol.OK)


class SyncConnection(NegotiatedAttributes):
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
        self.address = str(Address(host, self.port))  # IPv6 in brackets
        self.config = config or ConnectionConfig()
        self._adopt(Negotiated())  # nsqd's defaults until IDENTIFY answers
        self._sock: Any = None
        self._codec: StreamCodec | None = None
        self._decoder = protocol.FrameDecoder(None, self.config.max_frame_size)
        self._frames: deque[tuple[int, bytes]] = deque()
        self._wlock = threading.Lock()  # writes, and the order of _waiting
        self._rlock = threading.Lock()  # reading answers
        self._waiting: deque[_Waiter] = deque()
        self._write_failed: OSError | None = None  # a reset met while writing: read, no write
        self._rcvtimeo = 0.0  # the kernel receive timeout now set (seconds)
        self.last_used = 0.0
        self.closed = True

    def __repr__(self) -> str:
        return f"<SyncConnection {self.address} {'closed' if self.closed else 'open'}>"

    @property
    def state(self) -> ConnState:
        """CONNECTED while open (a publisher never subscribes), else CLOSED."""
        return ConnState.CLOSED if self.closed else ConnState.CONNECTED

    # -- connect ----------------------------------------------------------------------------

    def connect(self, deadline: float | None = None) -> "SyncConnection":
        """Open and negotiate; raises the same typed errors as Connection.connect. The TCP
        connect takes at most ``connect_timeout``, the handshake as a whole at most
        ``response_timeout``; both end earlier at ``deadline`` (``time.monotonic()``)."""
        import socket

        cfg = self.config
        connect_timeout = cfg.connect_timeout
        if deadline is not None:
            connect_timeout = min(connect_timeout, deadline - time.monotonic())
            if connect_timeout <= 0:
                raise NSQTimeoutError(f"no time left to connect to nsqd at {self.address}")
        try:
            # local_address: go-nsq's LocalAddr, the source IP to dial from (port: the OS's)
            source = None if cfg.source_ip is None else (cfg.source_ip, 0)
            sock = socket.create_connection((self.host, self.port), timeout=connect_timeout,
                                            source_address=source)
        except socket.timeout:
            raise ConnectError(f"timed out after {cfg.connect_timeout}s connecting to nsqd at "
                               f"{self.address}; is it reachable?") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to nsqd at {self.address}: {exc}; is nsqd "
                               "running and listening there?" + cfg.local_address_hint()
                               ) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(cfg.response_timeout)
        self._sock = sock
        self._codec = None
        self._decoder.reset()
        self._frames.clear()
        self._write_failed = None
        self.closed = False
        handshake_deadline = time.monotonic() + cfg.response_timeout
        if deadline is not None:
            handshake_deadline = min(handshake_deadline, deadline)
        try:
            self._handshake(handshake_deadline)
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
            self._rcvtimeo = t
        except (OSError, struct.error):  # pragma: no cover - platform without them
            pass
        self.last_used = time.monotonic()
        return self

    def _handshake(self, deadline: float) -> None:
        """Drive the sans-IO handshake (:mod:`nsq_spark._handshake`) over the socket, all of
        it before ``deadline``: every socket call gets only the time that is left."""
        import socket

        hs = Handshake(self.config, self.host, self.port, self._decoder)
        self._sock.settimeout(max(0.001, deadline - time.monotonic()))
        self._sock.sendall(hs.initial_bytes())
        while True:
            n = hs.read_size
            try:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout
                self._sock.settimeout(left)
                if n is not None:
                    data = self._recv_exact(n, deadline)
                elif self._codec is not None and self._codec.has_pending_output:
                    data = self._codec.decompress(b"", hs.max_frame_size)
                else:
                    raw = self._sock.recv(65536)
                    if not raw:
                        raise ConnectionClosedError("end of stream")  # made typed below
                    assert self._codec is not None
                    data = self._codec.decompress(raw, hs.max_frame_size)
            except socket.timeout:
                raise hs.timed_out(self.config.response_timeout) from None
            except ConnectionClosedError:  # end of stream
                raise hs.connection_lost() from None
            except NSQError:
                raise
            except (ssl.SSLError, OSError) as exc:
                raise hs.connection_lost(exc) from exc
            for action in hs.receive_data(data):
                if isinstance(action, SendBytes):
                    self._write(action.data)
                elif isinstance(action, StartTLS):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise hs.timed_out(self.config.response_timeout)
                    self._sock.settimeout(left)  # the TLS handshake shares the deadline
                    self._start_tls(action.server_hostname)
                elif isinstance(action, InstallCodec):
                    self._codec = make_codec(action.kind, action.level)
                else:
                    self._adopt(action.negotiated)
                    self._frames.extend(action.frames)
                    return

    def _start_tls(self, server_hostname: str) -> None:
        try:
            ctx = self.config.ssl_context()
            self._sock = ctx.wrap_socket(self._sock, server_hostname=server_hostname)
        except (OSError, ssl.SSLError) as exc:
            raise TLSError(f"TLS with nsqd at {self.address} failed: {exc} (check "
                           "tls_ca_file / tls_cert_file, or the server's certificate)") from exc

    # -- IO ---------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self._codec is not None:
            data = self._codec.compress(data)
        self._sock.sendall(data)

    def _recv_exact(self, n: int, deadline: float | None = None) -> bytes:
        parts = []
        while n:
            if deadline is not None:  # the handshake: the socket has a Python timeout
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("handshake deadline")
                self._sock.settimeout(left)
            chunk = self._sock.recv(n)
            if not chunk:
                raise ConnectionClosedError(f"nsqd at {self.address} closed the connection")
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def _recv(self, deadline: float) -> bytes:
        """One read, waiting at most until ``deadline``: the kernel timeout is shortened
        when less time is left than it allows (a drip of bytes cannot extend an answer)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("answer deadline")
        if left < self._rcvtimeo:
            self._set_rcvtimeo(left)
        data: bytes = self._sock.recv(65536)
        return data

    def _set_rcvtimeo(self, seconds: float) -> None:
        import socket

        seconds = max(seconds, 0.001)  # 0 would mean "no timeout"
        tv = struct.pack("ll", int(seconds), int((seconds - int(seconds)) * 1e6))
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            self._rcvtimeo = seconds
        except (OSError, AttributeError):  # gone, or TLS-wrapped
            pass

    def _read_frame(self, deadline: float | None = None) -> tuple[int, bytes]:
        """The next response/error frame (heartbeats answered and skipped), by
        ``deadline`` (default: ``response_timeout`` from now)."""
        if deadline is None:
            deadline = time.monotonic() + self.config.response_timeout
        while True:
            while self._frames:
                ftype, data = self._frames.popleft()
                if ftype == protocol.FRAME_TYPE_RESPONSE and data == _HEARTBEAT:
                    self._answer_heartbeat()
                    continue
                return ftype, data
            codec = self._codec
            if codec is not None and codec.has_pending_output:  # a bounded step's rest
                self._feed(codec.decompress(b"", self.config.max_frame_size))
                continue
            raw = self._recv(deadline)
            if not raw:
                partial = self._decoder.buffered
                where = (f" in the middle of a frame ({partial} bytes of an incomplete "
                         "frame received)") if partial else ""
                raise ConnectionClosedError(f"nsqd at {self.address} closed the "
                                            f"connection{where}")
            self._feed(codec.decompress(raw, self.config.max_frame_size)
                       if codec is not None else raw)

    def _feed(self, chunk: bytes) -> None:
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

    def command(self, data: bytes, deadline: float | None = None) -> bytes:
        """Send one command and return nsqd's answer (``b"OK"``), or raise its typed
        error (a fatal one also closes this connection). Thread-safe, pipelined. The
        answer must come within ``response_timeout`` and before ``deadline``
        (``time.monotonic()``), else NSQTimeoutError (and the connection is closed: the
        answers after it would be out of step)."""
        w = _Waiter()
        start = time.monotonic()
        answer_by = start + self.config.response_timeout
        if deadline is not None and deadline < answer_by:
            answer_by = deadline
        with self._wlock:
            if self.closed or self._write_failed is not None:
                raise ConnectionClosedError(f"connection to nsqd at {self.address} is closed")
            self._waiting.append(w)
            try:
                self._write(data)
            except (ConnectionResetError, BrokenPipeError) as exc:
                # nsqd may have answered before it closed (E_BAD_MESSAGE for an oversize
                # body): read what came instead of losing it; nothing more is written
                self._write_failed = exc
            except Exception as exc:
                self._abort(self._map_error(exc))
        if not self._rlock.acquire(timeout=max(0.0, answer_by - time.monotonic())):
            raise NSQTimeoutError(f"nsqd at {self.address} did not answer within "
                                  f"{answer_by - start:.3g}s (response_timeout="
                                  f"{self.config.response_timeout}s, or the caller's "
                                  "publish_timeout)")
        try:
            while not w.done:
                try:
                    ftype, resp = self._next_answer(answer_by)
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
            if self._rcvtimeo != self.config.response_timeout and self._sock is not None:
                self._set_rcvtimeo(self.config.response_timeout)  # shortened for a deadline
        finally:
            self._rlock.release()
        if w.exc is not None:
            raise w.exc
        if w.ftype == protocol.FRAME_TYPE_ERROR:
            exc2 = error_from_frame(w.data, self.address)
            if exc2.fatal:
                self._abort(ConnectionClosedError(
                    f"nsqd at {self.address} closed the connection after {exc2.code}"))
            raise exc2
        return w.data

    def _next_answer(self, deadline: float) -> tuple[int, bytes]:
        if self._sock is None:
            raise ConnectionClosedError(f"connection to nsqd at {self.address} is closed")
        if self._codec is None and not self._frames and not self._decoder.buffered:
            raw = self._recv(deadline)
            if raw == _OK_FRAME:  # the usual answer, whole: skip the decoder
                return protocol.FRAME_TYPE_RESPONSE, protocol.OK
            if not raw:
                raise ConnectionClosedError(f"nsqd at {self.address} closed the connection")
            self._frames.extend(self._decoder.feed(raw)[1])
        return self._read_frame(deadline)

    def _map_error(self, exc: Exception) -> Exception:
        import socket

        if isinstance(exc, (socket.timeout, BlockingIOError, ssl.SSLWantReadError,
                            ssl.SSLWantWriteError)):  # the kernel timeout surfaces as EAGAIN
            return NSQTimeoutError(f"nsqd at {self.address} did not answer in time "
                                   f"(response_timeout={self.config.response_timeout}s per "
                                   "answer, or the caller's publish_timeout)")
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

    def ensure_open(self, deadline: float | None = None) -> "SyncConnection":
        """Connect if closed, reconnect if stale; thread-safe. ``deadline``
        (``time.monotonic()``) bounds the wait for the other threads and the connect."""
        if deadline is None:
            with self._wlock, self._rlock:
                return self._reopen(None)
        if not self._wlock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise NSQTimeoutError(f"no time left to open the connection to {self.address}")
        try:
            if not self._rlock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise NSQTimeoutError(f"no time left to open the connection to {self.address}")
            try:
                return self._reopen(deadline)
            finally:
                self._rlock.release()
        finally:
            self._wlock.release()

    def _reopen(self, deadline: float | None) -> "SyncConnection":
        if not self.closed and not self.stale and self._write_failed is None:
            return self
        self._abort(ConnectionClosedError(f"connection to nsqd at {self.address} was "
                                          "reopened"))
        self._frames.clear()
        return self.connect(deadline)

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
