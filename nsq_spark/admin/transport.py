"""The HTTP transport of the admin clients, of lookupd discovery and of ``nsq-spark stat``:
httpcore (h11 underneath), blocking and asyncio, behind two small ports
(:class:`Transport`, :class:`AsyncTransport`) so tests can hand the clients a fake that
mypy checks.

**The one place that bounds an HTTP call.** Every request has

* a *deadline* for the whole request (``timeout`` seconds: the connect, sending, the
  answer's head and every byte of its body, waiting for a pooled connection): each
  socket operation is given what is left of it (:class:`_DeadlineBackend`), so a server
  that answers one byte a second, or stalls halfway, is cut off when the deadline
  passes (:class:`~nsq_spark.admin.errors.HTTPDeadlineError`, transient). A
  ``connect_timeout`` may bound the connect further;
* a *size limit* for the answer's body (``max_bytes``), chosen per kind of answer by
  :func:`answer_limit` from :data:`ANSWER_LIMITS`: an answer whose ``Content-Length``
  says more is refused before any of it is read; one that sends more (chunked for ever)
  is cut off once the limit is reached
  (:class:`~nsq_spark.admin.errors.AnswerTooLargeError`, not transient). The head is
  bounded by h11 (100 KiB). Answers are asked for uncompressed (``Accept-Encoding:
  identity``); one that comes compressed anyway is refused, never inflated.

Nothing else in the library sets an HTTP timeout or a size limit: the clients, the
lookupd poller and ``stat`` pass their ``timeout`` and the kind of each call.

A transport only moves bytes: it returns every status (the meaning of a 404 or a 500 is
:func:`nsq_spark.admin.calls.read_answer`'s), and turns a failure to get any answer
(refused, reset, connect timed out) into
:class:`~nsq_spark.admin.errors.NodeUnreachableError` naming the URL (transient), a failed
TLS handshake into :class:`~nsq_spark.admin.errors.AdminTLSError` (an ``https://`` URL of
a plain-HTTP port says to use ``http://``), and an answer that is not HTTP at all (nsqd's
TCP port answers ``E_BAD_PROTOCOL``) into
:class:`~nsq_spark.admin.errors.UnexpectedAnswerError`: both are the same on every
attempt. ``authorization`` is sent as the ``Authorization`` header (basic from an
address's user info, or a bearer secret: see the clients) and appears in no error, log
or repr.

One transport (its pool of keep-alive connections) serves many requests and threads, so
long-lived users (the Spark driver, a Reader's discovery) keep theirs, and the blocking
helpers that have no owner to keep one (:func:`nsq_spark._lookupd.lookup_sync`, the Spark
driver's :mod:`nsq_spark.spark._backlog`) share :func:`shared_transport`. An SSL context is
made only for the first ``https://`` request (default: the CA bundle httpcore uses).

httpcore is imported when the first transport is made, not with this module: a Reader or
Producer given nsqd addresses only (no lookupd, no admin call) never loads it.
"""

from __future__ import annotations

import contextvars
import os
import ssl
import threading
import time
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from nsq_spark._version import __version__

from .calls import ACCEPT, Answer
from .errors import (AdminTLSError, AnswerTooLargeError, HTTPDeadlineError,
                     NodeUnreachableError, UnexpectedAnswerError)

if TYPE_CHECKING:
    import httpcore

__all__ = ["ANSWER_LIMITS", "AsyncHttpTransport", "AsyncHttpxTransport", "AsyncTransport",
           "HttpTransport", "HttpxTransport", "Transport", "answer_limit",
           "shared_transport"]

#: The size limit of an answer's body, in bytes, per kind of answer (the ``answer`` of a
#: :class:`~nsq_spark.admin.calls.Call`): ``"status"`` for ``/ping``, ``/info`` and the
#: operations (nsqd answers a few bytes); ``"lookup"`` for lookupd's ``/lookup``,
#: ``/nodes``, ``/topics``, ``/channels`` (a producer takes about 250 bytes: 16 MiB is
#: some 60,000 of them); ``"stats"`` for nsqd's ``/stats`` (a client connection takes
#: about 700 bytes: 32 MiB is some 45,000 of them). A client's ``max_answer_bytes``
#: overrides them.
ANSWER_LIMITS: dict[str, int] = {"status": 1 << 20, "lookup": 16 << 20, "stats": 32 << 20}

#: The most ``max_answer_bytes`` may be: an answer is held in memory whole.
MAX_ANSWER_BYTES = 1 << 31


def answer_limit(kind: str, override: int | None = None) -> int:
    """The size limit of an answer of ``kind`` (a key of :data:`ANSWER_LIMITS`), or
    ``override`` when given."""
    return override if override is not None else ANSWER_LIMITS[kind]


class Transport(Protocol):
    """What the blocking clients need: one request, its status and body. ``timeout`` is
    the deadline of the whole request in seconds, ``max_bytes`` the size limit of the
    answer's body, ``authorization`` the ``Authorization`` header (None: none)."""

    def request(self, method: str, url: str, timeout: float, *, max_bytes: int,
                authorization: str | None = None) -> Answer: ...

    def close(self) -> None: ...


class AsyncTransport(Protocol):
    """What the asyncio clients need: one request, its status and body (arguments as
    :meth:`Transport.request`'s)."""

    async def request(self, method: str, url: str, timeout: float, *, max_bytes: int,
                      authorization: str | None = None) -> Answer: ...

    async def aclose(self) -> None: ...


# -- the deadline ------------------------------------------------------------------------
#
# httpcore gives each socket operation of a request the same timeout (a read timeout
# bounds each read, so a server that sends a byte a second never times out). The
# backends below give every operation only what is left of the request's deadline, which
# the transport puts in a context variable for the request's duration: per thread for
# the blocking transport, per task for the asyncio one.

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "nsq_spark_http_deadline", default=None)


def _left(timeout: float | None) -> float | None:
    """``timeout`` cut to what is left of the current deadline; raises the deadline's
    timeout when nothing is."""
    deadline = _deadline.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        import httpcore

        raise httpcore.ReadTimeout("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


def _backends() -> tuple[type, type]:
    """The blocking and asyncio deadline backends (classes made once httpcore is
    imported: it is imported lazily)."""
    global _BACKENDS
    if _BACKENDS is not None:
        return _BACKENDS
    import httpcore

    class DeadlineStream(httpcore.NetworkStream):
        def __init__(self, stream: httpcore.NetworkStream) -> None:
            self._stream = stream

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self._stream.read(max_bytes, _left(timeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self._stream.write(buffer, _left(timeout))

        def close(self) -> None:
            self._stream.close()

        def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                      timeout: float | None = None) -> httpcore.NetworkStream:
            return DeadlineStream(self._stream.start_tls(ssl_context, server_hostname,
                                                         _left(timeout)))

        def get_extra_info(self, info: str) -> Any:
            return self._stream.get_extra_info(info)

    class DeadlineBackend(httpcore.NetworkBackend):
        def __init__(self) -> None:
            self._backend = httpcore.SyncBackend()

        def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                        local_address: str | None = None,
                        socket_options: Iterable[Any] | None = None
                        ) -> httpcore.NetworkStream:
            return DeadlineStream(self._backend.connect_tcp(
                host, port, _left(timeout), local_address, socket_options))

        def connect_unix_socket(self, path: str, timeout: float | None = None,
                                socket_options: Iterable[Any] | None = None
                                ) -> httpcore.NetworkStream:  # pragma: no cover - unused
            return DeadlineStream(self._backend.connect_unix_socket(path, _left(timeout),
                                                                    socket_options))

        def sleep(self, seconds: float) -> None:  # pragma: no cover - retries=0
            self._backend.sleep(seconds)

    class AsyncDeadlineStream(httpcore.AsyncNetworkStream):
        def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
            self._stream = stream

        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return await self._stream.read(max_bytes, _left(timeout))

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:
            await self._stream.write(buffer, _left(timeout))

        async def aclose(self) -> None:
            await self._stream.aclose()

        async def start_tls(self, ssl_context: ssl.SSLContext,
                            server_hostname: str | None = None,
                            timeout: float | None = None) -> httpcore.AsyncNetworkStream:
            return AsyncDeadlineStream(await self._stream.start_tls(
                ssl_context, server_hostname, _left(timeout)))

        def get_extra_info(self, info: str) -> Any:
            return self._stream.get_extra_info(info)

    class AsyncDeadlineBackend(httpcore.AsyncNetworkBackend):
        def __init__(self) -> None:
            self._backend = httpcore.AnyIOBackend()

        async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                              local_address: str | None = None,
                              socket_options: Iterable[Any] | None = None
                              ) -> httpcore.AsyncNetworkStream:
            return AsyncDeadlineStream(await self._backend.connect_tcp(
                host, port, _left(timeout), local_address, socket_options))

        async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                      socket_options: Iterable[Any] | None = None
                                      ) -> httpcore.AsyncNetworkStream:  # pragma: no cover
            return AsyncDeadlineStream(await self._backend.connect_unix_socket(
                path, _left(timeout), socket_options))

        async def sleep(self, seconds: float) -> None:  # pragma: no cover - retries=0
            await self._backend.sleep(seconds)

    _BACKENDS = (DeadlineBackend, AsyncDeadlineBackend)
    return _BACKENDS


_BACKENDS: tuple[type, type] | None = None


# -- the answer's body ---------------------------------------------------------------------


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n:,} bytes"


def _too_large(method: str, url: str, max_bytes: int, what: str) -> AnswerTooLargeError:
    return AnswerTooLargeError(
        f"{method} {url}: the answer is larger than its size limit of {_size(max_bytes)} "
        f"({what}); is this address an nsqd or nsqlookupd HTTP port? A node that really "
        "answers that much: raise the limit (max_answer_bytes= of the admin clients, "
        "--http-client-max-answer-bytes of nsq-spark stat/topic/channel)")


class _Body:
    """The body of one answer, read within its size limit."""

    def __init__(self, method: str, url: str, max_bytes: int,
                 headers: list[tuple[bytes, bytes]]) -> None:
        self.method, self.url, self.max_bytes = method, url, max_bytes
        self.data = bytearray()
        for name, value in headers:
            key = name.lower()
            if key == b"content-length":
                # h11 checked it is a number; refused before a byte of the body is read
                if int(value) > max_bytes:
                    raise _too_large(method, url, max_bytes,
                                     f"Content-Length {int(value):,} bytes")
            elif key == b"content-encoding" and value.strip().lower() not in (b"",
                                                                               b"identity"):
                raise UnexpectedAnswerError(
                    f"{method} {url}: the answer is compressed "
                    f"({value.decode('latin-1')[:40]!r}) though it was asked for "
                    "uncompressed; nsqd and nsqlookupd never compress: is a proxy in "
                    "front of them, or is this some other server?")

    def add(self, chunk: bytes) -> None:
        if len(self.data) + len(chunk) > self.max_bytes:
            raise _too_large(self.method, self.url, self.max_bytes,
                             f"more than {self.max_bytes:,} bytes arrived")
        self.data += chunk


# -- errors --------------------------------------------------------------------------------


def _tls_cause(exc: BaseException) -> ssl.SSLError | None:
    """The TLS failure under a transport error, unless it is a stream cut short."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError) and not isinstance(
                seen, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


#: The starts of h11's messages (h11 0.14-0.16) when the bytes that came back do not
#: parse as an HTTP answer: an illegal status line (nsqd's TCP port answers a framed
#: ``E_BAD_PROTOCOL``: "illegal request line"), header or chunk, or a head too long.
#: Every other protocol error is a connection closed or cut short ("peer unexpectedly
#: closed connection", "peer closed connection without sending complete message body",
#: httpcore's "Server disconnected without sending a response."): no answer, transient.
_NOT_HTTP = ("illegal ", "malformed ", "invalid ", "continuation line at start of headers",
             "no response line received", "Receive buffer too long", "bad Content-Length",
             "conflicting Content-Length", "multiple Transfer-Encoding",
             "Only Transfer-Encoding", "Response status_code",
             "InformationalResponse status_code")


def _not_http(exc: Exception) -> bool:
    """Whether a transport error says the answer was not HTTP (h11 could not parse it),
    as opposed to a connection that closed (no answer)."""
    import httpcore

    return (isinstance(exc, httpcore.RemoteProtocolError)
            and str(exc).lstrip().lower().startswith(tuple(m.lower() for m in _NOT_HTTP)))


def _failure(method: str, url: str, exc: Exception, timeout: float | None = None,
             deadline: float | None = None
             ) -> NodeUnreachableError | AdminTLSError | UnexpectedAnswerError:
    """The admin error of a transport error: no answer in time (the deadline), no answer,
    a TLS failure, or an answer that is not HTTP."""
    import httpcore

    if _not_http(exc):
        # bytes came back, but not an HTTP answer (a closed connection is below)
        return UnexpectedAnswerError(
            f"{method} {url}: the server answered, but not HTTP ({exc}); is this the HTTP "
            "port? (nsqd 4151, nsqlookupd 4161 by default; 4150 and 4160 are their TCP "
            "ports)")
    if isinstance(exc, httpcore.TimeoutException) and deadline is not None \
            and timeout is not None and time.monotonic() >= deadline - 0.005:
        return HTTPDeadlineError(
            f"{method} {url}: no complete answer within the request's deadline of "
            f"{timeout:.3g} s (the whole request, however slowly the server sends); check "
            "that the server runs there and is not overloaded, or give it a longer "
            "timeout")
    tls = _tls_cause(exc)
    if tls is not None and getattr(tls, "reason", None) == "WRONG_VERSION_NUMBER":
        return AdminTLSError(
            f"{method} {url}: the server does not speak TLS there ({tls}); it is a "
            "plain-HTTP port: use http://, or nsqd's --https-address port for https://")
    if tls is not None:
        return AdminTLSError(
            f"{method} {url}: the TLS handshake failed ({tls}); give the CA that signed "
            "the server's certificate, and a client certificate if it asks for one "
            "(ssl_context=ConnectionConfig(tls_v1=True, tls_ca_file=..., tls_cert_file=..., "
            "tls_key_file=...).ssl_context())")
    return NodeUnreachableError(
        f"{method} {url}: no answer ({type(exc).__name__}: {exc or 'timed out'}); check "
        "that the server runs there and that this is its HTTP port (nsqd 4151, "
        "nsqlookupd 4161 by default)")


# -- the transports ------------------------------------------------------------------------

_USER_AGENT = f"nsq_spark/{__version__}"


def _headers(authorization: str | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"Accept", ACCEPT.encode()), (b"Accept-Encoding", b"identity"),
               (b"User-Agent", _USER_AGENT.encode())]
    if authorization:
        try:  # a bytes secret was decoded as latin-1: its bytes go out unchanged
            value = authorization.encode("latin-1")
        except UnicodeEncodeError:
            value = authorization.encode("utf-8")
        headers.append((b"Authorization", value))
    return headers


def _timeouts(timeout: float, connect_timeout: float | None) -> dict[str, Any]:
    # every stage may take the whole deadline; the deadline backend cuts each operation
    # to what is left of it
    return {"timeout": {"connect": min(connect_timeout or timeout, timeout), "read": timeout,
                        "write": timeout, "pool": timeout}}


def _transport_errors() -> tuple[type[Exception], ...]:
    import httpcore

    return (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
            httpcore.UnsupportedProtocol, httpcore.ProxyError)


class HttpTransport:
    """:class:`Transport` on an httpcore connection pool (keep-alive, thread-safe).
    ``connect_timeout`` (seconds) bounds the TCP (and TLS) connect further (default: the
    request's deadline only); ``ssl_context`` verifies ``https://`` nodes (and may carry a
    client certificate); default: httpcore's CA bundle."""

    def __init__(self, connect_timeout: float | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        import httpcore

        self.connect_timeout = connect_timeout
        self._errors = _transport_errors()
        backend, _ = _backends()
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context, max_connections=100, max_keepalive_connections=20,
            keepalive_expiry=5.0, network_backend=backend())

    def request(self, method: str, url: str, timeout: float, *, max_bytes: int,
                authorization: str | None = None) -> Answer:
        deadline = time.monotonic() + timeout
        token = _deadline.set(deadline)
        try:
            with self._pool.stream(method, url, headers=_headers(authorization),
                                   content=b"" if method == "POST" else None,
                                   extensions=_timeouts(timeout, self.connect_timeout)
                                   ) as resp:
                body = _Body(method, url, max_bytes, resp.headers)
                for chunk in resp.iter_stream():
                    body.add(chunk)
                return Answer(resp.status, bytes(body.data))
        except self._errors as exc:
            raise _failure(method, url, exc, timeout, deadline) from exc
        finally:
            _deadline.reset(token)

    def close(self) -> None:
        self._pool.close()


class AsyncHttpTransport:
    """:class:`AsyncTransport` on an httpcore asyncio connection pool (used on one event
    loop); arguments as :class:`HttpTransport`'s."""

    def __init__(self, connect_timeout: float | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        import httpcore

        self.connect_timeout = connect_timeout
        self._errors = _transport_errors()
        _, backend = _backends()
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context, max_connections=100, max_keepalive_connections=20,
            keepalive_expiry=5.0, network_backend=backend())

    async def request(self, method: str, url: str, timeout: float, *, max_bytes: int,
                      authorization: str | None = None) -> Answer:
        deadline = time.monotonic() + timeout
        token = _deadline.set(deadline)
        try:
            async with self._pool.stream(method, url, headers=_headers(authorization),
                                         content=b"" if method == "POST" else None,
                                         extensions=_timeouts(timeout, self.connect_timeout)
                                         ) as resp:
                body = _Body(method, url, max_bytes, resp.headers)
                async for chunk in resp.aiter_stream():
                    body.add(chunk)
                return Answer(resp.status, bytes(body.data))
        except self._errors as exc:
            raise _failure(method, url, exc, timeout, deadline) from exc
        finally:
            _deadline.reset(token)

    async def aclose(self) -> None:
        await self._pool.aclose()


#: The names these transports had when they were built on httpx (kept for users).
HttpxTransport = HttpTransport
AsyncHttpxTransport = AsyncHttpTransport

_shared: tuple[int, HttpTransport] | None = None
_shared_lock = threading.Lock()


def shared_transport() -> Transport:
    """The process's blocking transport for callers with no client of their own (safe
    from any thread). A forked child gets a new one: the parent's pooled sockets are not
    its to use."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid():
            _shared = (os.getpid(), HttpTransport())
        return _shared[1]
