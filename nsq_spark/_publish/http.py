"""Publishing through nsqd's HTTP API (``POST /pub``, ``POST /mpub?binary=true``), for
places where only HTTP is open.

Requests go round-robin over the given nsqd; a transient failure (connection refused,
HTTP 5xx, nsqd exiting) is retried on the next one with the one retry policy. HTTP
statuses are mapped to the same typed errors the TCP path raises, so the one retry
classification (:func:`nsq_spark.errors.is_transient`) applies unchanged.

It posts with tornado's ``SimpleAsyncHTTPClient``, not the admin package's transport
(:mod:`nsq_spark.admin.transport`) that discovery and the admin clients use: that port
sends no request body, and its asyncio connection pool must be closed by an awaited
``aclose()`` on the loop that made it, while :meth:`HttpPublisher.close` is synchronous
and may run after that loop (the caller's, :class:`~nsq_spark._loop.LoopHome`) has ended.
Moving over needs a port with a body and a close handshake through the loop home; until
then this is the library's second HTTP client. Its bounds are the transport's all the
same: tornado's ``request_timeout`` is a deadline for the whole request
(``response_timeout``), and an answer is limited to the transport's limit of a
``"status"`` answer (1 MiB).
"""

from __future__ import annotations

import itertools
import ssl
from typing import Any, Callable, Sequence
from urllib.parse import quote

from nsq_spark import protocol
from nsq_spark._addresses import Address
from nsq_spark.config import ConnectionConfig
from nsq_spark.errors import (BadMessageError, BadTopicError, ConnectError, NSQError,
                              NSQServerError, PubFailedError, TLSError)

from .._retry import RetryPolicy
from .stats import PublishStats, command_size

__all__ = ["HttpPublisher", "http_error"]


def http_error(addr: str, code: int, body: bytes) -> NSQError:
    """The typed error for an HTTP answer of nsqd (``code`` 599: no connection)."""
    text = body.decode("utf-8", "replace").strip()
    if code == 599:
        return ConnectError(f"cannot reach nsqd HTTP at {addr}: {text or 'connection failed'}")
    detail = f"HTTP {code} from nsqd {addr}: {text}"
    if "MSG_TOO_BIG" in text or "BODY_TOO_BIG" in text:
        return BadMessageError("E_BAD_MESSAGE", detail, addr)
    if "INVALID_TOPIC" in text or "BAD_TOPIC" in text:
        return BadTopicError("E_BAD_TOPIC", detail, addr)
    if "EXITING" in text or code >= 500:
        return PubFailedError("E_PUB_FAILED", detail, addr)
    return NSQServerError("E_HTTP", detail, addr)


class HttpPublisher:
    """POSTs to nsqd's HTTP API on the running loop (tornado's HTTP client).

    Args:
        endpoints: ``(scheme, address, path prefix)`` per nsqd, as
            :func:`nsq_spark._addresses.parse_http_address` returns them.
        config: TLS and timeouts.
        retry: the retry policy; ``stopped()`` ends retrying (the producer is closing).
        stats: where acknowledged messages are counted.
    """

    def __init__(self, endpoints: Sequence[tuple[str, Address, str]], config: ConnectionConfig,
                 retry: RetryPolicy, stats: PublishStats, stopped: Callable[[], bool]) -> None:
        self.endpoints = [(f"{scheme}://{address}{path}", str(address))
                          for scheme, address, path in endpoints]
        self.config = config
        self.retry = retry
        self.stats = stats
        self.stopped = stopped
        self._rr = itertools.count()
        self._client: Any = None

    def _http(self) -> Any:
        if self._client is None:
            from tornado.simple_httpclient import SimpleAsyncHTTPClient

            from nsq_spark.admin.transport import answer_limit
            # a private (non-shared) client: its lifetime is the producer's. nsqd answers
            # "OK": the answer's size limit is the admin transport's for a "status" answer
            # (1 MiB; tornado's own default is 100 MB), and request_timeout (below) is
            # tornado's deadline for the whole request
            self._client = SimpleAsyncHTTPClient(
                force_instance=True, max_clients=64, max_body_size=answer_limit("status"),
                max_buffer_size=answer_limit("status"))
        return self._client

    async def _once(self, base: str, key: str, path_qs: str, body: bytes) -> bytes:
        from tornado.httpclient import HTTPClientError, HTTPRequest

        ssl_options = self.config.ssl_context() if base.startswith("https://") else None
        req = HTTPRequest(base + path_qs, method="POST", body=body,
                          connect_timeout=self.config.connect_timeout,
                          request_timeout=self.config.response_timeout,
                          ssl_options=ssl_options)
        try:
            resp = await self._http().fetch(req)
        except HTTPClientError as exc:
            error = http_error(key, exc.code, exc.response.body if exc.response else b"")
            if isinstance(error, ConnectError):
                self.stats.down(key, error)
            raise error from None
        except ssl.SSLError as exc:
            # a refused certificate is not a lost connection: the same on every attempt
            raise TLSError(f"TLS with nsqd HTTPS at {key} failed: {exc} (check tls_ca_file / "
                           "tls_cert_file, or the server's certificate)") from exc
        except OSError as exc:
            error = ConnectError(f"cannot reach nsqd HTTP at {key}: {exc}")
            self.stats.down(key, error)
            raise error from exc
        self.stats.up(key)
        return bytes(resp.body)

    async def _post(self, path_qs: str, body: bytes, messages: int, size: int) -> bytes:
        def on_retry(_: Any) -> None:
            self.stats.retried()

        result = b""
        key = ""
        async for attempt in self.retry.async_retrying(stopped=self.stopped, on_retry=on_retry):
            with attempt:
                base, key = self.endpoints[next(self._rr) % len(self.endpoints)]
                result = await self._once(base, key, path_qs, body)
        self.stats.acked_http(messages, size, key)
        return result

    async def pub(self, topic: str, body: bytes, defer_ms: int | None) -> bytes:
        qs = f"/pub?topic={quote(protocol.check_topic(topic))}"
        if defer_ms:
            qs += f"&defer={int(defer_ms)}"
        data = bytes(body)
        try:
            return await self._post(qs, data, 1, len(data))
        except Exception:
            self.stats.failed(None, 1)
            raise

    async def mpub(self, topic: str, datas: list[bytes]) -> bytes:
        """``datas``: encoded MPUB commands (one HTTP request each)."""
        qs = f"/mpub?topic={quote(protocol.check_topic(topic))}&binary=true"
        result = b""
        for i, data in enumerate(datas):
            messages, size = command_size(data)
            try:
                # an MPUB command's body (count, then sized messages) is /mpub?binary=true's
                result = await self._post(qs, data[data.index(b"\n") + 5:], messages, size)
            except Exception:
                self.stats.failed(None, sum(command_size(d)[0] for d in datas[i:]))
                raise
        return result

    # -- one nsqd, for a replicated publish (the planner substitutes; no retry here) ------

    @property
    def addresses(self) -> list[str]:
        """The nsqd of each endpoint (``host:port``), in the configured order."""
        return [key for _, key in self.endpoints]

    async def pub_to(self, key: str, topic: str, body: bytes, defer_ms: int | None) -> None:
        """POST one message to the one nsqd ``key``; raises its failure."""
        qs = f"/pub?topic={quote(protocol.check_topic(topic))}"
        if defer_ms:
            qs += f"&defer={int(defer_ms)}"
        data = bytes(body)
        await self._once(self._base(key), key, qs, data)
        self.stats.acked_http(1, len(data), key)

    async def mpub_to(self, key: str, topic: str, datas: Sequence[bytes]) -> None:
        """POST encoded MPUB commands (in order) to the one nsqd ``key``."""
        qs = f"/mpub?topic={quote(protocol.check_topic(topic))}&binary=true"
        base = self._base(key)
        for data in datas:
            messages, size = command_size(data)
            await self._once(base, key, qs, data[data.index(b"\n") + 5:])
            self.stats.acked_http(messages, size, key)

    def _base(self, key: str) -> str:
        return next(base for base, k in self.endpoints if k == key)

    def forget(self) -> None:
        """Drop the client without closing it (its event loop is gone)."""
        self._client = None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
