"""The HTTP transport of the admin clients and of lookupd discovery: httpx, blocking and
asyncio, behind two small ports (:class:`Transport`, :class:`AsyncTransport`) so tests can
hand the clients a fake that mypy checks.

A transport only moves bytes: it returns every status (the meaning of a 404 or a 500 is
:func:`nsq_spark.admin.calls.read_answer`'s), and turns a failure to get any answer
(refused, reset, timed out) into :class:`~nsq_spark.admin.errors.NodeUnreachableError`
naming the URL (transient), a failed TLS handshake into
:class:`~nsq_spark.admin.errors.AdminTLSError` (an ``https://`` URL of a plain-HTTP port
says to use ``http://``), and an answer that is not HTTP at all (nsqd's TCP port answers
``E_BAD_PROTOCOL``) into :class:`~nsq_spark.admin.errors.UnexpectedAnswerError`: both are
the same on every attempt.

One httpx client (its pool of keep-alive connections) serves many requests and threads;
creating one builds an SSL context, about a millisecond or more, so long-lived users (the
Spark driver, a Reader's discovery) keep theirs, and the blocking helpers that have no
owner to keep one (:func:`nsq_spark.lookupd.lookup_sync`, the Spark driver's
:mod:`nsq_spark.spark.backlog`) share :func:`shared_transport` (measured: a new
``httpx.Client`` costs 21 ms here; the driver asks nsqd's ``/stats`` at every trigger).

httpx is imported when the first transport is made, not with this module: a Reader or
Producer given nsqd addresses only (no lookupd, no admin call) never loads it (measured:
importing it costs about 40 ms and 6 MB of a process's peak RSS).
"""

from __future__ import annotations

import os
import ssl
import threading
from typing import TYPE_CHECKING, Protocol

from .calls import ACCEPT, Answer
from .errors import AdminTLSError, NodeUnreachableError, UnexpectedAnswerError

if TYPE_CHECKING:
    import httpx

__all__ = ["AsyncHttpxTransport", "AsyncTransport", "HttpxTransport", "Transport",
           "shared_transport"]


class Transport(Protocol):
    """What the blocking clients need: one request, its status and body."""

    def request(self, method: str, url: str, timeout: float) -> Answer: ...

    def close(self) -> None: ...


class AsyncTransport(Protocol):
    """What the asyncio clients need: one request, its status and body."""

    async def request(self, method: str, url: str, timeout: float) -> Answer: ...

    async def aclose(self) -> None: ...


def _timeout(timeout: float, connect_timeout: float | None) -> httpx.Timeout:
    import httpx

    return httpx.Timeout(timeout, connect=connect_timeout or timeout)


def _tls_cause(exc: BaseException) -> ssl.SSLError | None:
    """The TLS failure under an httpx error, unless it is a stream cut short."""
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
    """Whether an httpx error says the answer was not HTTP (h11 could not parse it), as
    opposed to a connection that closed (no answer)."""
    import httpx

    return (isinstance(exc, httpx.RemoteProtocolError)
            and str(exc).lstrip().lower().startswith(tuple(m.lower() for m in _NOT_HTTP)))


def _failure(method: str, url: str, exc: Exception
             ) -> NodeUnreachableError | AdminTLSError | UnexpectedAnswerError:
    """The admin error of an httpx transport error: no answer, a TLS failure, or an
    answer that is not HTTP."""
    if _not_http(exc):
        # bytes came back, but not an HTTP answer (a closed connection is below)
        return UnexpectedAnswerError(
            f"{method} {url}: the server answered, but not HTTP ({exc}); is this the HTTP "
            "port? (nsqd 4151, nsqlookupd 4161 by default; 4150 and 4160 are their TCP "
            "ports)")
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


class HttpxTransport:
    """:class:`Transport` on ``httpx.Client``. ``connect_timeout`` (seconds) bounds the
    TCP (and TLS) connect (default: the request's ``timeout``); a request's ``timeout``
    bounds each of its other stages on its own (each write, each read, waiting for a
    pooled connection), not the request as a whole; ``ssl_context`` verifies
    ``https://`` nodes (and may carry a client certificate); default: the system's CAs."""

    def __init__(self, connect_timeout: float | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        import httpx

        self.connect_timeout = connect_timeout
        self._transport_error = httpx.TransportError
        self._client = httpx.Client(headers={"Accept": ACCEPT}, follow_redirects=False,
                                    verify=ssl_context if ssl_context is not None else True)

    def request(self, method: str, url: str, timeout: float) -> Answer:
        try:
            resp = self._client.request(method, url,
                                        timeout=_timeout(timeout, self.connect_timeout))
        except self._transport_error as exc:
            raise _failure(method, url, exc) from exc
        return Answer(resp.status_code, resp.content)

    def close(self) -> None:
        self._client.close()


class AsyncHttpxTransport:
    """:class:`AsyncTransport` on ``httpx.AsyncClient`` (used on one event loop);
    arguments as :class:`HttpxTransport`'s."""

    def __init__(self, connect_timeout: float | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        import httpx

        self.connect_timeout = connect_timeout
        self._transport_error = httpx.TransportError
        self._client = httpx.AsyncClient(headers={"Accept": ACCEPT}, follow_redirects=False,
                                         verify=ssl_context if ssl_context is not None
                                         else True)

    async def request(self, method: str, url: str, timeout: float) -> Answer:
        try:
            resp = await self._client.request(method, url,
                                              timeout=_timeout(timeout, self.connect_timeout))
        except self._transport_error as exc:
            raise _failure(method, url, exc) from exc
        return Answer(resp.status_code, resp.content)

    async def aclose(self) -> None:
        await self._client.aclose()


_shared: tuple[int, HttpxTransport] | None = None
_shared_lock = threading.Lock()


def shared_transport() -> Transport:
    """The process's blocking transport for callers with no client of their own (safe
    from any thread). A forked child gets a new one: the parent's pooled sockets are not
    its to use."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid():
            _shared = (os.getpid(), HttpxTransport())
        return _shared[1]
