"""nsqd and nsqlookupd HTTP clients: :class:`NsqdClient` / :class:`LookupdClient`
(blocking) and :class:`AsyncNsqdClient` / :class:`AsyncLookupdClient` (asyncio).

Each method builds a :class:`~nsq_spark.admin.calls.Call` (names checked before any
request), sends it through the client's transport (httpx by default) and reads the answer
with :func:`~nsq_spark.admin.calls.read_answer`; the blocking and asyncio classes differ
only in how they wait. Clients are context managers (``with`` / ``async with``) and keep
one pool of keep-alive connections; ``close()`` / ``aclose()`` release it.

Errors (:mod:`nsq_spark.admin.errors`): :class:`NodeUnreachableError` when nothing
answers, :class:`AdminTLSError` when the HTTPS handshake fails, :class:`TopicNotFoundError` / :class:`ChannelNotFoundError` for a 404,
:class:`HTTPStatusError` for any other non-2xx answer, with nsqd's message;
:class:`~nsq_spark.errors.InvalidNameError` for a bad name before any request.
"""

from __future__ import annotations

import ssl
from typing import Self, TypeVar

from nsq_spark import validate
from nsq_spark.errors import ConfigError
from nsq_spark.validate import MAX_SECONDS

from . import calls
from .calls import Call, read_answer
from .model import Lookup, LookupdInfo, LookupdProducer, NsqdInfo, NsqdStats
from .transport import AsyncHttpxTransport, AsyncTransport, HttpxTransport, Transport

__all__ = ["AsyncLookupdClient", "AsyncNsqdClient", "DEFAULT_TIMEOUT", "LookupdClient",
           "NsqdClient"]

T = TypeVar("T")

#: The default ``timeout``: seconds each stage of a request may take (see NsqdClient).
DEFAULT_TIMEOUT = 5.0


def _one_of(transport: object, ssl_context: ssl.SSLContext | None) -> None:
    if transport is not None and ssl_context is not None:
        raise ConfigError("give ssl_context or transport, not both: a transport given "
                          "carries its own TLS settings")


def _checked_timeout(timeout: float) -> float:
    return float(validate.number(timeout, "timeout", lo=0, lo_open=True, hi=MAX_SECONDS,
                                 unit="seconds"))


class _Sync:
    kind = "nsqd"

    def __init__(self, address: str, *, timeout: float = DEFAULT_TIMEOUT,
                 transport: Transport | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.timeout = _checked_timeout(timeout)
        calls.base_url(address, self.kind)  # a bad address fails here, not at first use
        _one_of(transport, ssl_context)
        self.address = address
        self._own = transport is None
        self._transport: Transport = transport or HttpxTransport(ssl_context=ssl_context)

    def _send(self, call: Call[T]) -> T:
        return read_answer(call, self._transport.request(call.method, call.url, self.timeout))

    def ping(self) -> str:
        """``"OK"`` when the node is healthy."""
        return self._send(calls.ping(self.address, self.kind))

    def close(self) -> None:
        """Release the connections (a transport given to the constructor stays open)."""
        if self._own:
            self._transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Async:
    kind = "nsqd"

    def __init__(self, address: str, *, timeout: float = DEFAULT_TIMEOUT,
                 transport: AsyncTransport | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.timeout = _checked_timeout(timeout)
        calls.base_url(address, self.kind)
        _one_of(transport, ssl_context)
        self.address = address
        self._own = transport is None
        self._transport: AsyncTransport = transport or AsyncHttpxTransport(
            ssl_context=ssl_context)

    async def _send(self, call: Call[T]) -> T:
        answer = await self._transport.request(call.method, call.url, self.timeout)
        return read_answer(call, answer)

    async def ping(self) -> str:
        """``"OK"`` when the node is healthy."""
        return await self._send(calls.ping(self.address, self.kind))

    async def aclose(self) -> None:
        """Release the connections (a transport given to the constructor stays open)."""
        if self._own:
            await self._transport.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class NsqdClient(_Sync):
    """Blocking client of one nsqd's HTTP API.

    Args:
        address: nsqd's HTTP address, ``host:port`` (the port is required: nsqd's
            ``--http-address`` opens 4151 unless told otherwise) or an ``http(s)://`` URL.
        timeout: seconds each stage of a request may take, each on its own (httpx's
            timeouts): the connect (unless the transport has a ``connect_timeout``),
            sending, each read of the answer, waiting for a pooled connection. Not a
            bound on the whole request: a server that keeps sending slowly can take
            longer. > 0, at most a year; default 5.
        transport: the :class:`~nsq_spark.admin.transport.Transport` to send through
            (default: a new httpx client, closed by :meth:`close`).
        ssl_context: for an ``https://`` address (nsqd's ``--https-address``): verifies
            the node and may carry a client certificate, e.g.
            ``ConnectionConfig(tls_v1=True, tls_ca_file=..., tls_cert_file=...,
            tls_key_file=...).ssl_context()``; default None: the system's CAs. Not with
            ``transport``.

    ::

        with NsqdClient("127.0.0.1:4151") as nsqd:
            nsqd.pause_channel("orders", "billing")
            print(nsqd.stats("orders").channel("orders", "billing").depth)
    """

    kind = "nsqd"

    def info(self) -> NsqdInfo:
        """Version, broadcast address and ports."""
        return self._send(calls.nsqd_info(self.address))

    def stats(self, topic: str | None = None, channel: str | None = None,
              include_clients: bool = True) -> NsqdStats:
        """``/stats``: every topic (or ``topic`` only; ``channel`` narrows further), their
        channels and, unless ``include_clients`` is False, each channel's clients."""
        return self._send(calls.nsqd_stats(self.address, topic, channel, include_clients))

    def create_topic(self, topic: str) -> None:
        """Create ``topic`` (no-op if it exists); lookupd learns of it."""
        self._send(calls.topic_action(self.address, "create", topic))

    def delete_topic(self, topic: str) -> None:
        """Delete ``topic``, its channels and every message in them."""
        self._send(calls.topic_action(self.address, "delete", topic))

    def empty_topic(self, topic: str) -> None:
        """Drop the messages ``topic`` has not copied into its channels yet."""
        self._send(calls.topic_action(self.address, "empty", topic))

    def pause_topic(self, topic: str) -> None:
        """Stop copying ``topic``'s messages into its channels (they wait on the topic)."""
        self._send(calls.topic_action(self.address, "pause", topic))

    def unpause_topic(self, topic: str) -> None:
        self._send(calls.topic_action(self.address, "unpause", topic))

    def create_channel(self, topic: str, channel: str) -> None:
        """Create ``channel`` on ``topic`` (no-op if it exists; 404 if the topic does
        not): from now on it gets a copy of every message."""
        self._send(calls.channel_action(self.address, "create", topic, channel))

    def delete_channel(self, topic: str, channel: str) -> None:
        """Delete ``channel`` and its messages; nsqd closes its consumers' connections."""
        self._send(calls.channel_action(self.address, "delete", topic, channel))

    def empty_channel(self, topic: str, channel: str) -> None:
        """Drop every message of ``channel``: queued (memory and disk), in flight and
        deferred (nsqd's ``Channel.Empty``). Consumers still hold the in-flight ones, but
        their FIN, REQ or TOUCH of them then fails (``E_FIN_FAILED``...)."""
        self._send(calls.channel_action(self.address, "empty", topic, channel))

    def pause_channel(self, topic: str, channel: str) -> None:
        """Stop sending ``channel``'s messages to consumers (they wait, connected)."""
        self._send(calls.channel_action(self.address, "pause", topic, channel))

    def unpause_channel(self, topic: str, channel: str) -> None:
        self._send(calls.channel_action(self.address, "unpause", topic, channel))


class LookupdClient(_Sync):
    """Blocking client of one nsqlookupd's HTTP API (arguments as :class:`NsqdClient`'s,
    ``address`` being nsqlookupd's HTTP port, 4161 by default)."""

    kind = "nsqlookupd"

    def info(self) -> LookupdInfo:
        return self._send(calls.lookupd_info(self.address))

    def nodes(self) -> list[LookupdProducer]:
        """Every nsqd registered here, with its topics and tombstones."""
        return self._send(calls.lookupd_nodes(self.address))

    def lookup(self, topic: str) -> Lookup:
        """The nsqds carrying ``topic`` and its channels (empty if unknown)."""
        return self._send(calls.lookup(self.address, topic))

    def topics(self) -> list[str]:
        return self._send(calls.lookupd_topics(self.address))

    def channels(self, topic: str) -> list[str]:
        return self._send(calls.lookupd_channels(self.address, topic))

    def tombstone_topic_producer(self, topic: str, node: str) -> None:
        """Stop listing nsqd ``node`` (its ``broadcast_address:http_port``) for
        ``topic`` for nsqlookupd's ``--tombstone-lifetime`` (45 s by default): consumers
        stop finding it there, e.g. while it is drained and retired.

        lookupd answers 200 even when no producer matched, so ``/nodes`` is asked
        afterwards: :class:`~nsq_spark.admin.errors.NotFoundError` (``message``
        ``"NODE_NOT_FOUND"``) names the producers of ``topic`` it knows when none at
        ``node`` is tombstoned, and says whether that is known or, the node missing from
        ``/nodes`` altogether (inactive, or none there), not confirmed
        (:func:`~nsq_spark.admin.calls.check_tombstoned`)."""
        call = calls.tombstone(self.address, topic, node)
        self._send(call)
        calls.check_tombstoned(call, self.nodes(), node)


class AsyncNsqdClient(_Async):
    """asyncio client of one nsqd's HTTP API: :class:`NsqdClient`'s methods, awaited."""

    kind = "nsqd"

    async def info(self) -> NsqdInfo:
        return await self._send(calls.nsqd_info(self.address))

    async def stats(self, topic: str | None = None, channel: str | None = None,
                    include_clients: bool = True) -> NsqdStats:
        return await self._send(calls.nsqd_stats(self.address, topic, channel,
                                                 include_clients))

    async def topic_action(self, action: str, topic: str) -> None:
        """``action`` (create, delete, empty, pause, unpause) on ``topic``."""
        await self._send(calls.topic_action(self.address, action, topic))

    async def channel_action(self, action: str, topic: str, channel: str) -> None:
        """``action`` (create, delete, empty, pause, unpause) on ``channel``."""
        await self._send(calls.channel_action(self.address, action, topic, channel))

    async def create_topic(self, topic: str) -> None:
        await self.topic_action("create", topic)

    async def delete_topic(self, topic: str) -> None:
        await self.topic_action("delete", topic)

    async def empty_topic(self, topic: str) -> None:
        await self.topic_action("empty", topic)

    async def pause_topic(self, topic: str) -> None:
        await self.topic_action("pause", topic)

    async def unpause_topic(self, topic: str) -> None:
        await self.topic_action("unpause", topic)

    async def create_channel(self, topic: str, channel: str) -> None:
        await self.channel_action("create", topic, channel)

    async def delete_channel(self, topic: str, channel: str) -> None:
        await self.channel_action("delete", topic, channel)

    async def empty_channel(self, topic: str, channel: str) -> None:
        """As :meth:`NsqdClient.empty_channel`: queued, in-flight and deferred messages
        are dropped."""
        await self.channel_action("empty", topic, channel)

    async def pause_channel(self, topic: str, channel: str) -> None:
        await self.channel_action("pause", topic, channel)

    async def unpause_channel(self, topic: str, channel: str) -> None:
        await self.channel_action("unpause", topic, channel)


class AsyncLookupdClient(_Async):
    """asyncio client of one nsqlookupd: :class:`LookupdClient`'s methods, awaited."""

    kind = "nsqlookupd"

    async def info(self) -> LookupdInfo:
        return await self._send(calls.lookupd_info(self.address))

    async def nodes(self) -> list[LookupdProducer]:
        return await self._send(calls.lookupd_nodes(self.address))

    async def lookup(self, topic: str) -> Lookup:
        return await self._send(calls.lookup(self.address, topic))

    async def topics(self) -> list[str]:
        return await self._send(calls.lookupd_topics(self.address))

    async def channels(self, topic: str) -> list[str]:
        return await self._send(calls.lookupd_channels(self.address, topic))

    async def tombstone_topic_producer(self, topic: str, node: str) -> None:
        call = calls.tombstone(self.address, topic, node)
        await self._send(call)
        calls.check_tombstoned(call, await self.nodes(), node)
