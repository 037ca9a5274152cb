"""nsqd and nsqlookupd HTTP clients: :class:`NsqdClient` / :class:`LookupdClient`
(blocking) and :class:`AsyncNsqdClient` / :class:`AsyncLookupdClient` (asyncio).

Each method builds a :class:`~nsq_spark.admin.calls.Call` (names checked before any
request), sends it through the client's transport (:mod:`~nsq_spark.admin.transport`:
httpcore, every request under one deadline and its answer under the size limit of its
kind) and reads the answer with :func:`~nsq_spark.admin.calls.read_answer`; the blocking
and asyncio classes differ only in how they wait. Clients are context managers (``with``
/ ``async with``) and keep one pool of keep-alive connections; ``close()`` /
``aclose()`` release it.

Authorization: an address with user info (``http://user:password@host:4161``) sends it as
``Authorization: Basic``; else ``auth_secret`` (if given) is sent as ``Authorization:
Bearer <secret>``, as go-nsq sends the AUTH secret to lookupd. Neither appears in the
client's ``address``, its repr, or any error.

Errors (:mod:`nsq_spark.admin.errors`): :class:`NodeUnreachableError` when nothing
answers (:class:`HTTPDeadlineError` when no complete answer came within ``timeout``),
:class:`AdminTLSError` when the HTTPS handshake fails,
:class:`TopicNotFoundError` / :class:`ChannelNotFoundError` for a 404,
:class:`HTTPStatusError` for any other non-2xx answer, with nsqd's message,
:class:`UnexpectedAnswerError` for an answer that is not NSQ's
(:class:`AnswerTooLargeError` over its size limit);
:class:`~nsq_spark.errors.InvalidNameError` for a bad name before any request.
"""

from __future__ import annotations

import ssl
from typing import Any, Self, TypeVar

from nsq_spark import _validate as validate
from nsq_spark._addresses import http_authorization, strip_userinfo
from nsq_spark.errors import ConfigError
from nsq_spark._validate import MAX_SECONDS

from . import calls
from .calls import Call, read_answer
from .model import Lookup, LookupdInfo, LookupdProducer, NsqdInfo, NsqdStats
from .transport import (MAX_ANSWER_BYTES, AsyncHttpTransport, AsyncTransport, HttpTransport,
                        Transport, answer_limit)

__all__ = ["AsyncLookupdClient", "AsyncNsqdClient", "DEFAULT_TIMEOUT", "LookupdClient",
           "NsqdClient"]

T = TypeVar("T")

#: The default ``timeout``: seconds a whole request may take (see NsqdClient).
DEFAULT_TIMEOUT = 5.0


def _one_of(transport: object, ssl_context: ssl.SSLContext | None) -> None:
    if transport is not None and ssl_context is not None:
        raise ConfigError("give ssl_context or transport, not both: a transport given "
                          "carries its own TLS settings")


def _checked_timeout(timeout: float) -> float:
    return float(validate.number(timeout, "timeout", lo=0, lo_open=True, hi=MAX_SECONDS,
                                 unit="seconds"))


def checked_max_answer_bytes(value: int | None, name: str = "max_answer_bytes"
                             ) -> int | None:
    """``max_answer_bytes``: None (the limit of each kind of answer) or 1 byte to 2 GiB."""
    checked: int | None = validate.integer(
        value, name, lo=1, hi=MAX_ANSWER_BYTES, unit="bytes",
        none="the limit of each kind of answer (nsq_spark.admin.transport.ANSWER_LIMITS)")
    return checked


def authorization(address: str, auth_secret: str | bytes | None) -> str | None:
    """The ``Authorization`` header for ``address``: basic from its user info, else a
    bearer of ``auth_secret`` (bytes are sent as they are), else None. The one rule of
    the admin clients, lookupd discovery and ``nsq-spark stat``. A secret that cannot be
    a header (a line break, a NUL) is a ConfigError that does not show it."""
    basic = http_authorization(address)
    if basic is not None:
        return basic
    if auth_secret is None or auth_secret in ("", b""):
        return None
    if isinstance(auth_secret, bytes):
        secret = auth_secret.decode("latin-1")  # byte for byte (see transport._headers)
    elif isinstance(auth_secret, str):
        secret = auth_secret
    else:
        raise ConfigError(f"auth_secret: give a string (the AUTH secret), not "
                          f"{type(auth_secret).__name__}")
    if any(c in secret for c in "\r\n\0"):
        raise ConfigError("auth_secret holds a line break or a NUL, so it cannot be sent "
                          "as an HTTP Authorization header (not shown here); give the "
                          "secret without it, or do not send it to the HTTP API "
                          "(lookupd_authorization=False for a Reader)")
    return f"Bearer {secret}"


class _Base:
    kind = "nsqd"

    def __init__(self, address: str, timeout: float, transport: object,
                 ssl_context: ssl.SSLContext | None, max_answer_bytes: int | None,
                 auth_secret: str | bytes | None) -> None:
        self.timeout = _checked_timeout(timeout)
        calls.base_url(address, self.kind)  # a bad address fails here, not at first use
        _one_of(transport, ssl_context)
        self.max_answer_bytes = checked_max_answer_bytes(max_answer_bytes)
        #: the address as given, without its user info (sent as a header instead)
        self.address = strip_userinfo(address.strip())
        self._authorization = authorization(address, auth_secret)
        self._own = transport is None

    def _limit(self, call: Call[Any]) -> int:
        return answer_limit(call.answer, self.max_answer_bytes)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r}, timeout={self.timeout:g})"


class _Sync(_Base):
    def __init__(self, address: str, *, timeout: float = DEFAULT_TIMEOUT,
                 transport: Transport | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 max_answer_bytes: int | None = None,
                 auth_secret: str | bytes | None = None) -> None:
        super().__init__(address, timeout, transport, ssl_context, max_answer_bytes,
                         auth_secret)
        self._transport: Transport = transport or HttpTransport(ssl_context=ssl_context)

    def _send(self, call: Call[T]) -> T:
        return read_answer(call, self._transport.request(
            call.method, call.url, self.timeout, max_bytes=self._limit(call),
            authorization=self._authorization))

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


class _Async(_Base):
    def __init__(self, address: str, *, timeout: float = DEFAULT_TIMEOUT,
                 transport: AsyncTransport | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 max_answer_bytes: int | None = None,
                 auth_secret: str | bytes | None = None) -> None:
        super().__init__(address, timeout, transport, ssl_context, max_answer_bytes,
                         auth_secret)
        self._transport: AsyncTransport = transport or AsyncHttpTransport(
            ssl_context=ssl_context)

    async def _send(self, call: Call[T]) -> T:
        answer = await self._transport.request(
            call.method, call.url, self.timeout, max_bytes=self._limit(call),
            authorization=self._authorization)
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
            ``--http-address`` opens 4151 unless told otherwise) or an ``http(s)://``
            URL; user info (``http://user:password@host:4151``, for an nsqd behind an
            authenticating proxy) is sent as ``Authorization: Basic``.
        timeout: seconds a whole request may take: the connect (the transport's
            ``connect_timeout`` may bound it further), sending, waiting for a pooled
            connection, and the whole answer however slowly it comes
            (:class:`~nsq_spark.admin.errors.HTTPDeadlineError` then). > 0, at most a
            year; default 5.
        max_answer_bytes: the size limit of every answer's body (default None: the
            limit of each kind of answer, 1 MiB for an operation, 32 MiB for
            ``stats()``: :data:`~nsq_spark.admin.transport.ANSWER_LIMITS`); a larger one is
            an :class:`~nsq_spark.admin.errors.AnswerTooLargeError`. 1 byte to 2 GiB.
        auth_secret: sent as ``Authorization: Bearer <auth_secret>`` when ``address``
            has no user info (for a proxy that checks NSQ's AUTH secret; default None:
            no header). Never shown.
        transport: the :class:`~nsq_spark.admin.transport.Transport` to send through
            (default: a new :class:`~nsq_spark.admin.transport.HttpTransport`, closed by
            :meth:`close`).
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
        """Delete ``topic``, its channels and every message in them, on this nsqd only:
        lookupd keeps the registrations (its channels are made again with the topic).
        To delete as nsqadmin does, on every nsqd of the topic and every lookupd's
        registration: :func:`nsq_spark.admin.delete_topic`."""
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
        """Delete ``channel`` and its messages on this nsqd only; nsqd closes its
        consumers' connections. lookupd keeps the channel's registration, so an nsqd that
        makes the topic again makes the channel with it, and it collects messages no one
        reads: to delete as nsqadmin does, on every nsqd of the topic and every lookupd's
        registration, use :func:`nsq_spark.admin.delete_channel`."""
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

    def create_topic(self, topic: str) -> None:
        """Register ``topic`` here (no nsqd carries it until one makes it)."""
        self._send(calls.lookupd_topic_action(self.address, "create", topic))

    def delete_topic(self, topic: str) -> None:
        """Drop the registration of ``topic`` and of all its channels here (an nsqd that
        still carries the topic registers it again at its next heartbeat; to delete as
        nsqadmin does: :func:`nsq_spark.admin.delete_topic`)."""
        self._send(calls.lookupd_topic_action(self.address, "delete", topic))

    def create_channel(self, topic: str, channel: str) -> None:
        """Register ``channel`` of ``topic`` here."""
        self._send(calls.lookupd_channel_action(self.address, "create", topic, channel))

    def delete_channel(self, topic: str, channel: str) -> None:
        """Drop the registration of ``channel`` here, so that an nsqd that makes the topic
        again does not make the channel with it;
        :class:`~nsq_spark.admin.errors.ChannelNotFoundError` when none is registered. To
        delete as nsqadmin does: :func:`nsq_spark.admin.delete_channel`."""
        self._send(calls.lookupd_channel_action(self.address, "delete", topic, channel))

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

    async def create_topic(self, topic: str) -> None:
        await self._send(calls.lookupd_topic_action(self.address, "create", topic))

    async def delete_topic(self, topic: str) -> None:
        """As :meth:`LookupdClient.delete_topic`."""
        await self._send(calls.lookupd_topic_action(self.address, "delete", topic))

    async def create_channel(self, topic: str, channel: str) -> None:
        await self._send(calls.lookupd_channel_action(self.address, "create", topic,
                                                      channel))

    async def delete_channel(self, topic: str, channel: str) -> None:
        """As :meth:`LookupdClient.delete_channel`."""
        await self._send(calls.lookupd_channel_action(self.address, "delete", topic,
                                                      channel))

    async def tombstone_topic_producer(self, topic: str, node: str) -> None:
        call = calls.tombstone(self.address, topic, node)
        await self._send(call)
        calls.check_tombstoned(call, await self.nodes(), node)
