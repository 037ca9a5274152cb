"""Publishing: ``Producer`` (PUB, MPUB, DPUB over TCP, or nsqd's HTTP ``/pub``/``/mpub``),
directly or through a durable local spool (``spool_dir=``).

One class, one signature, the same API in every mode:

* blocking: ``publish``, ``mpublish``, ``close`` and the context manager. A blocking call
  talks to nsqd from the calling thread over a plain socket (an nsqd round trip on a local
  network is ~10 us; a hop to an IO thread and back would cost ten times that). Threads
  share a few connections per nsqd (``blocking_connections``) and pipeline on them.
* futures: ``publish_async``/``mpublish_async`` return a ``concurrent.futures.Future`` at
  once; the IO runs on a background thread with its own event loop
  (:class:`nsq_spark._loop.LoopThread`), so one thread can keep thousands of publishes in
  flight, *pipelined* on one connection (answers matched in order), with every command
  written during one loop turn going out in one socket write.
* asyncio: ``await apublish(...)``, ``await ampublish(...)``, ``publish_nowait(...)``,
  ``async with``. On first use from a running event loop (unless the futures API started
  the IO thread first) the producer binds to that loop and uses no thread at all; used
  from another loop, calls hop to the producer's loop.

With ``spool_dir`` the producer owns every message until nsqd acknowledged it: each call
appends to the spool (:mod:`nsq_spark.spool`) and returns -- or settles its future --
once the message is durable there; a drain thread sends the spool to nsqd directly.

The Producer is a facade over one *transport* (:class:`~nsq_spark._publish.transport.
Transport`), chosen once in ``__init__``: :class:`~.direct.DirectTransport` or, with
``spool_dir``, :class:`~.spooled.SpooledTransport`. ``Producer(addr, spool_dir=d)`` is a
``Producer``, with the same public attributes as any other (those of the other mode hold
their defaults: ``spool_dir`` is None without a spool, ``config`` is there with one). Its promise: what ``publish()``
accepted is delivered to nsqd or stays on disk and is retried, unless nsqd itself refused
that message for a reason a retry cannot fix (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``,
``E_BAD_BODY``, ``E_INVALID`` to PUB/MPUB/DPUB: it goes to ``spool_dir/rejected``, and
:meth:`redrive` puts it back). A failing connection -- nsqd down, the wrong port, AUTH
refused or its server down, TLS -- is retried for as long as the producer lives, and is
shown by ``stats()["health"]``, ``on_error`` and an ERROR log; :meth:`flush` returns
False meanwhile. Unlike the direct mode, where such failures raise at once (a caller is
waiting), see :func:`nsq_spark.spool._drain.refused`.

Publish ids and replicas (``docs/publishing.md``). With ``publish_ids=True`` the facade
stamps each body with a publish id (:mod:`nsq_spark.envelope`, version 3) *before* it
reaches the transport, in every mode: the spool stores the stamped body, so its resend
after a crash carries the same id, and every replica and retry carries it too. A new id
per message per call, or the caller's ``idempotency_key``. ``replicas=N`` puts each
message on N distinct nsqds and returns once ``write_quorum`` acknowledged
(:mod:`.replicated`; which nsqds: :mod:`.replicas`); with ``spool_dir`` a message stays
on disk until all N have it.

Bodies follow one rule in every mode: ``bytes``, ``bytearray`` or ``memoryview``, not
empty, at most ``max_msg_size`` when given; anything else (``str`` included) raises
:class:`~nsq_spark.errors.InvalidBodyError` before anything is sent or spooled.

Answers are matched to commands in order (nsqd answers each connection's commands in
order). With several nsqd, commands go round-robin to the connected ones
(``strategy="round_robin"``) or to the first healthy one in the given order
(``strategy="failover"``). Failures are classified by the one rule,
:func:`nsq_spark.errors.is_transient`: a transient one (connection lost, nsqd unreachable
or exiting, timeout) is retried on a connection that works with the one retry policy
(:class:`nsq_spark._retry.RetryPolicy`: until ``retry_deadline``, exponential
backoff with jitter); a permanent one (bad topic, body too big, refused AUTH or TLS
certificate, a malformed answer) is raised at once. ``publish_timeout`` bounds a whole
call, retries included, in every mode. A retried publish whose first attempt reached nsqd
before the connection broke may be stored twice: NSQ is at-least-once, and so is
publishing.

``stats()`` counts messages and bytes (not commands), retries and errors, per nsqd too;
an nsqd going down is logged once (WARNING) and its return once (INFO), see
:mod:`nsq_spark._publish.stats`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from nsq_spark import protocol, _validate as validate
from nsq_spark._addresses import parse_address_list, parse_http_address, split_list
from nsq_spark._options import documented
from nsq_spark.config import PRODUCER, ConnectionConfig, ProducerOptions
from nsq_spark.envelope import PublishIds, publish_id_for, stamp, stamp_many
from nsq_spark.errors import ConfigError
from nsq_spark.spool._drain import Sender
from nsq_spark.spool._store import CorruptSegment, SpoolStats
from nsq_spark.telemetry import checked as checked_telemetry

from .._log import get_logger
from .direct import DirectTransport
from .instrument import TracedTransport, drain_sender
from .replicas import default_quorum
from .replicated import ReplicatedTransport
from .spooled import SpooledTransport
from .stats import PublishStats
from .transport import Transport

if TYPE_CHECKING:
    from nsq_spark.telemetry import Telemetry

log = get_logger("nsq_spark.producer")   # the name users filter on

__all__ = ["Producer", "DEFAULT_MAX_MPUB_BYTES"]

#: the options' defaults: each is its row's (nsq_spark.config.ProducerOptions)
_P = ProducerOptions()

#: nsqd's default --max-body-size: an mpublish larger than this is sent as several MPUBs.
DEFAULT_MAX_MPUB_BYTES = _P.max_mpub_bytes


def _one_server(sender: "Sender | DirectTransport | ReplicatedTransport"
                ) -> tuple[str, int] | None:
    """``server.address``/``server.port`` of the telemetry: the one nsqd, if one."""
    one = sender.nsqd_tcp_addresses \
        if isinstance(sender, (DirectTransport, ReplicatedTransport)) else []
    if len(one) != 1:
        return None
    host, port = parse_address_list(one, "nsqd_tcp_addresses")[0]
    return host, port


def _key_without_ids(param: str) -> ConfigError:
    return ConfigError(f"{param} needs publish ids: create the Producer with "
                       "publish_ids=True (or replicas=N, which turns them on); without them "
                       "a key has nothing to name")


def _publish_id(key: Any, param: str) -> bytes:
    """:func:`~nsq_spark.envelope.publish_id_for` with its errors named and typed."""
    try:
        return publish_id_for(key)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{param}: {exc}") from None


@documented(PRODUCER, before="**connection_options")
class Producer:
    """Publish to one or more nsqd, directly or through a durable local spool.

    The arguments that are values or spool callbacks (``strategy``, the retry budget,
    ``replicas``, the spool's options, ...) are the rows of
    :class:`~nsq_spark.config.ProducerOptions`, which bound and document each one; their
    descriptions follow the other arguments' below.

    Args:
        nsqd_tcp_addresses: ``"host:port"`` or a list of them (a comma-separated string
            works too; IPv6 as ``"[::1]:4150"``).
        nsqd_http_addresses: publish through nsqd's HTTP API instead (``/pub``, ``/mpub``),
            for places where only HTTP is open: ``"host:port"`` or ``"https://host:port"``.
            Give either TCP or HTTP addresses.
        telemetry: a :class:`~nsq_spark.telemetry.Telemetry`: OpenTelemetry metrics and a
            ``send`` span per publish call (with ``Telemetry(trace_context=True)`` the
            span's context travels in each body's envelope). With ``spool_dir`` the span
            is still the publish call's (the append to the spool), but
            ``messaging.client.sent.messages`` and ``operation.duration`` are recorded
            by the drain, per send to nsqd (each retry counts, ``error.type`` when nsqd
            refuses): what is only spooled is not counted as sent. Default None: not
            instrumented, and nothing of it on the publish path.
        **connection_options: ConnectionConfig options (TLS, snappy/deflate, auth_secret,
            heartbeat_interval, ...), with pynsq's names and units (seconds, except
            ``output_buffer_timeout`` in milliseconds).
    """

    def __init__(self, nsqd_tcp_addresses: str | Sequence[str] | None = None, *,
                 nsqd_http_addresses: str | Sequence[str] | None = None,
                 strategy: str = _P.strategy, max_tries: int | None = _P.max_tries,
                 retry_wait: float = _P.retry_wait,
                 retry_max_wait: float = _P.retry_max_wait,
                 retry_deadline: float | None = _P.retry_deadline,
                 publish_timeout: float | None = _P.publish_timeout,
                 max_msg_size: int | None = _P.max_msg_size,
                 max_mpub_bytes: int = _P.max_mpub_bytes,
                 blocking_connections: int = _P.blocking_connections,
                 publish_ids: bool | None = _P.publish_ids, replicas: int | None = _P.replicas,
                 write_quorum: int | None = _P.write_quorum,
                 spool_dir: str | os.PathLike[str] | None = _P.spool_dir,
                 spool_fsync: str | int | None = _P.spool_fsync,
                 spool_max_bytes: int = _P.spool_max_bytes, spool_full: str = _P.spool_full,
                 spool_block_timeout: float | None = _P.spool_block_timeout,
                 message_id_digest: bool = _P.message_id_digest,
                 batch_size: int = _P.batch_size, batch_bytes: int = _P.batch_bytes,
                 rescan_interval: float = _P.rescan_interval,
                 on_corrupt: Callable[[CorruptSegment], None] | None = _P.on_corrupt,
                 on_rejected: Callable[[str, bytes, BaseException], None] | None =
                 _P.on_rejected,
                 on_error: Callable[[BaseException], None] | None = _P.on_error,
                 producer_factory: Callable[[], Sender] | None = _P.producer_factory,
                 telemetry: "Telemetry | None" = None,
                 **connection_options: Any) -> None:
        # every option, by its row (the one rule, and what needs spool_dir or replicas)
        options = ProducerOptions.of(locals())
        spooled = options.spooled
        # the spool retries without end itself: the sender it drives fails fast, so that
        # close() and outages stay responsive
        if spooled and options.max_tries is None:
            options = dataclasses.replace(options, max_tries=1)
        self._options = options
        # every public attribute is set here, for both modes alike
        self.max_tries: int | None = options.max_tries  # None: retry_deadline is the budget
        self.strategy = options.strategy
        self.retry_wait = options.retry_wait
        self.retry_max_wait = options.retry_max_wait
        self.retry_deadline = options.retry_deadline
        self.publish_timeout = options.publish_timeout
        self.max_msg_size = options.max_msg_size
        self.max_mpub_bytes = options.max_mpub_bytes
        self.blocking_connections = options.blocking_connections
        #: the copies of each message, and how many must acknowledge (None: no replication)
        self.replicas: int | None = options.replicas
        self.write_quorum: int | None = None if replicas is None else (
            default_quorum(replicas) if write_quorum is None else write_quorum)
        #: stamp each body with a publish id (on by default with replicas)
        self.publish_ids = bool(replicas is not None if publish_ids is None else publish_ids)
        self._ids: PublishIds | None = PublishIds() if self.publish_ids else None
        self.message_id_digest = options.message_id_digest
        self.batch_size = options.batch_size
        self.batch_bytes = options.batch_bytes
        self.rescan_interval = options.rescan_interval
        self.config = ConnectionConfig.from_options(**connection_options)
        # the one choice of mode: a transport, and the addresses it was given
        self._direct: DirectTransport | None = None   # without spool_dir (for Writer)
        spool: SpooledTransport | None = None
        transport: Transport
        sender: Sender | DirectTransport | ReplicatedTransport
        # chosen once: the transport itself, or the transport measured
        self.telemetry = checked_telemetry(telemetry, "Producer")
        server: tuple[str, int] | None = None
        if not spooled:
            self._direct = sender = self._direct_transport(
                nsqd_tcp_addresses, nsqd_http_addresses, spooled)
            transport = self._replicated(sender)
            server = _one_server(sender)
        else:
            if producer_factory is not None:
                sender = producer_factory()
            else:   # built now, so that a bad option fails here, not in the drain thread
                sender = self._direct_transport(nsqd_tcp_addresses, nsqd_http_addresses,
                                                spooled)
            server = _one_server(sender)
            if isinstance(sender, DirectTransport) and self.replicas is not None:
                sender = self._replicated(sender)   # the drain completes every replica
            # instrumented: what the drain sends to nsqd is what is counted as sent
            drained: Sender = sender if self.telemetry is None else \
                drain_sender(self.telemetry, sender, server)
            transport = spool = SpooledTransport(options, drained)
        if self.telemetry is not None:
            # spooled: the send span (and the envelope's traceparent) at the publish call,
            # the sent count and duration at the drain (above)
            transport = TracedTransport(self.telemetry, transport, server,
                                        measure=spool is None)
        self._transport = transport
        self._spool = spool   # None without spool_dir; with telemetry, _transport wraps it
        if isinstance(sender, (DirectTransport, ReplicatedTransport)):
            self.nsqd_tcp_addresses = sender.nsqd_tcp_addresses
            self.nsqd_http_addresses = sender.nsqd_http_addresses
        else:   # a producer_factory's sender: the addresses as given, for repr and stats
            self.nsqd_tcp_addresses = [] if nsqd_tcp_addresses is None else [
                str(a) for a in split_list(nsqd_tcp_addresses, "nsqd_tcp_addresses")]
            self.nsqd_http_addresses = []
        self.http_mode = bool(self.nsqd_http_addresses)
        self.spool_dir: Path | None = None if spool is None else spool.spool_dir

    def _replicated(self, direct: DirectTransport) -> DirectTransport | ReplicatedTransport:
        """``direct`` itself, or with ``replicas`` the replicated transport over it."""
        if self.replicas is None or self.write_quorum is None:
            return direct
        count = len(direct.nsqd_http_addresses or direct.nsqd_tcp_addresses)
        if self.replicas > count:
            direct.close(0)
            raise ConfigError(f"replicas={self.replicas} needs at least {self.replicas} "
                              f"distinct nsqd addresses; {count} given: give more "
                              f"addresses, or replicas 1 .. {count}")
        try:
            return ReplicatedTransport(direct, replicas=self.replicas,
                                       quorum=self.write_quorum)
        except ValueError as exc:   # the HTTP endpoints repeat an nsqd
            direct.close(0)
            raise ConfigError(f"replicas: {exc}; give each nsqd once") from None

    def _direct_transport(self, tcp_given: Any, http_given: Any, spooled: bool
                          ) -> DirectTransport:
        tcp = parse_address_list(tcp_given, "nsqd_tcp_addresses")
        http = [parse_http_address(a, "nsqd_http_addresses", "127.0.0.1:4151")
                for a in split_list(http_given, "nsqd_http_addresses")]
        if spooled and not tcp and not http:
            raise ConfigError("a spooling Producer needs nsqd_tcp_addresses (or "
                              "nsqd_http_addresses, or a producer_factory)")
        if bool(tcp) == bool(http):
            raise ConfigError("give nsqd_tcp_addresses or nsqd_http_addresses (one of them, "
                              "e.g. Producer('127.0.0.1:4150'))")
        return DirectTransport(tcp, http, self.config, self._options, stats=PublishStats(log))

    def __repr__(self) -> str:
        addrs = self.nsqd_http_addresses if self.http_mode else self.nsqd_tcp_addresses
        if self.spool_dir is not None:
            return f"<Producer {addrs} spool={self.spool_dir}>"
        return f"<Producer {addrs} {'http' if self.http_mode else 'tcp'}>"

    # -- blocking API ------------------------------------------------------------------------

    # -- publish ids: stamped here, before any transport (one place for every mode) -------

    def _stamp(self, body: bytes, key: bytes | str | None) -> bytes:
        """``body`` with its publish id (a new one, or ``key``'s), or as it is without
        publish ids (then a key is an error)."""
        ids = self._ids
        if ids is None:
            if key is not None:
                raise _key_without_ids("idempotency_key")
            return body
        if type(body) is not bytes or not body:   # the body rule, before the envelope
            protocol._check_body(body, None)       # would hide an empty one
        return stamp(body, ids.new() if key is None else _publish_id(key, "idempotency_key"))

    def _stamp_many(self, bodies: Sequence[bytes], keys: Iterable[bytes | str] | None
                    ) -> Sequence[bytes]:
        ids = self._ids
        if ids is None:
            if keys is not None:
                raise _key_without_ids("idempotency_keys")
            return bodies
        for i, body in enumerate(bodies):
            if type(body) is not bytes or not body:   # the rest, named, only when needed
                protocol._check_body(body, None, f"message body #{i}")
        if keys is None:
            return stamp_many(list(bodies), ids.many(len(bodies)))
        if isinstance(keys, (bytes, str)) or not isinstance(keys, Iterable):
            raise ConfigError(f"idempotency_keys={keys!r:.60}: give one key per body, e.g. "
                              "[b'order-1', b'order-2']")
        pids = [_publish_id(k, f"idempotency_keys[{i}]") for i, k in enumerate(keys)]
        if len(pids) != len(bodies):
            raise ConfigError(f"idempotency_keys has {len(pids)} keys for {len(bodies)} "
                              "bodies: give one key per body, in the same order")
        return stamp_many(list(bodies), pids)

    # -- blocking API ------------------------------------------------------------------------

    def publish(self, topic: str, body: bytes, defer_ms: int | None = None, *,
                idempotency_key: bytes | str | None = None) -> None:
        """Publish one message (DPUB when ``defer_ms`` is given); returns when nsqd
        acknowledged it -- with ``spool_dir``, when it is in the spool; with
        ``replicas``, when ``write_quorum`` nsqd did (else ReplicationError). Raises
        InvalidNameError/InvalidBodyError for bad input, a typed NSQServerError for a
        refusal, ConnectError when no nsqd can be reached. ``idempotency_key`` (with
        ``publish_ids``): the publish id is derived from it
        (:func:`nsq_spark.envelope.publish_id_for`), so publishing again under the same
        key publishes the same message as far as a consumer deduplicating by publish id
        is concerned."""
        self._transport.publish(topic, self._stamp(body, idempotency_key),
                                validate.defer_ms(defer_ms))

    def mpublish(self, topic: str, bodies: Iterable[bytes], *,
                 idempotency_keys: Iterable[bytes | str] | None = None) -> None:
        """Publish several messages with MPUB; returns when nsqd acknowledged all (with
        ``spool_dir``: when all are in the spool, with one write and one sync).
        ``idempotency_keys``: one key per body, in order (see :meth:`publish`)."""
        self._transport.mpublish(topic, self._stamp_many(validate.bodies(bodies),
                                                         idempotency_keys))

    def flush(self, timeout: float | None = None) -> bool:
        """With ``spool_dir``: wait until nsqd has acknowledged everything this producer
        holds: its own messages, and every leftover segment in the directory that no other
        live producer holds (a crashed producer's, or what ``redrive()`` put back), claimed
        a few at a time. True only if nsqd took all of it within ``timeout``; False when
        time ran out (nsqd unreachable, AUTH or TLS failing, ...: the messages stay in the
        spool and are retried; ``stats()`` has ``health`` and ``last_error``), and False
        once when nsqd refused messages for good since the previous flush that saw the
        queue empty (``stats()["rejected"]``; they are in ``spool_dir/rejected``). It
        returns rather than raises, as before: callers that only test the bool keep
        working and never read a refusal as delivered.
        ``timeout=None`` waits for as long as it takes. Without a spool every blocking
        call already waited: True."""
        return self._transport.flush(timeout)

    def redrive(self) -> int:
        """With ``spool_dir``: move the messages of ``spool_dir/rejected`` back into the
        queue (once the cause of the refusal is fixed); returns how many. The command
        line does the same: ``nsq-spark spool redrive DIR``. Without ``spool_dir``:
        ConfigError."""
        return self._transport.redrive()

    # -- futures API ---------------------------------------------------------------------

    def publish_async(self, topic: str, body: bytes, defer_ms: int | None = None, *,
                      idempotency_key: bytes | str | None = None
                      ) -> concurrent.futures.Future[bytes]:
        """Like publish, but returns a concurrent.futures.Future at once (pipelining).
        Bad input raises here. With ``spool_dir`` the future is settled once the message
        is in the spool (the append happens in this call)."""
        return self._transport.publish_async(topic, self._stamp(body, idempotency_key),
                                             validate.defer_ms(defer_ms))

    def mpublish_async(self, topic: str, bodies: Iterable[bytes], *,
                       idempotency_keys: Iterable[bytes | str] | None = None
                       ) -> concurrent.futures.Future[Any]:
        """Like mpublish, but returns a concurrent.futures.Future at once."""
        return self._transport.mpublish_async(
            topic, self._stamp_many(validate.bodies(bodies), idempotency_keys))

    # -- asyncio API -----------------------------------------------------------------------

    async def apublish(self, topic: str, body: bytes, defer_ms: int | None = None, *,
                       idempotency_key: bytes | str | None = None) -> None:
        """Publish one message; returns when nsqd acknowledged it (with ``spool_dir``:
        when it is in the spool; the append runs in a worker thread)."""
        await self._transport.apublish(topic, self._stamp(body, idempotency_key),
                                       validate.defer_ms(defer_ms))

    async def ampublish(self, topic: str, bodies: Iterable[bytes], *,
                        idempotency_keys: Iterable[bytes | str] | None = None) -> None:
        """Publish several messages with MPUB; returns when nsqd acknowledged all."""
        await self._transport.ampublish(
            topic, self._stamp_many(validate.bodies(bodies), idempotency_keys))

    def publish_nowait(self, topic: str, body: bytes, defer_ms: int | None = None, *,
                       idempotency_key: bytes | str | None = None
                       ) -> "asyncio.Future[bytes]":
        """On the producer's loop: queue a publish and return an asyncio future of the
        answer without a coroutine per call (the cheapest way to pipeline from asyncio).
        Transient failures are retried like apublish. With ``spool_dir`` the message is
        appended in this call and the future is already settled."""
        return self._transport.publish_nowait(topic, self._stamp(body, idempotency_key),
                                              validate.defer_ms(defer_ms))

    # -- state -----------------------------------------------------------------------------

    @property
    def published(self) -> int:
        """Commands acknowledged so far (a PUB, an MPUB, an HTTP request each count 1);
        ``stats()["messages"]`` counts messages."""
        return self._transport.published

    @property
    def spool_stats(self) -> SpoolStats | None:
        """The spool's counters (live object); None without ``spool_dir``."""
        return None if self._spool is None else self._spool.spool_stats

    @property
    def last_error(self) -> BaseException | None:
        """With ``spool_dir``: the last failure of the drain (None once a send worked);
        always None without (a direct call raises its failure to its caller)."""
        return self._transport.last_error

    def pending_bytes(self) -> int:
        """Spooled bytes this producer holds that nsqd has not acknowledged (0 without a
        spool)."""
        return self._transport.pending_bytes()

    def stats(self) -> dict[str, Any]:
        """Counters: ``messages``, ``bytes``, ``retries``, ``errors`` (ints, in messages
        and body bytes), ``commands``, and per nsqd ``"nsqd": {address: {"up",
        "messages", "bytes", "last_error"}}``; with ``spool_dir`` also ``spool_pending``
        (messages), ``spool_pending_bytes``, the spool's own counters (``acked``: taken
        by nsqd; ``rejected``: refused for good, never in ``acked``; ``redriven``) and
        its health: ``health`` (``"ok"`` or ``"failing"``), ``last_error`` (the cause),
        ``failing_since`` (epoch seconds), ``consecutive_failures``."""
        return self._transport.stats()

    # -- closing ---------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Wait (bounded) for outstanding answers, close the connections, stop the IO
        thread. With ``spool_dir``: try for ``timeout`` seconds (default 5) to send what
        the spool holds, and leave the rest on disk for the next start (or another
        process on the same directory). Safe to call twice."""
        self._transport.close(timeout)

    async def aclose(self) -> None:
        """Close from the producer's loop (async users)."""
        await self._transport.aclose()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "Producer":
        await self._transport.enter_async()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._transport.exit_async()

    # -- for pynsq's Writer (nsq_spark.writer), which takes no spool_dir, and the
    # -- connection tests: the direct transport's parts --------------------------------

    @property
    def _direct_only(self) -> DirectTransport:
        if self._direct is None:   # set exactly when there is no spool_dir
            raise ConfigError("this needs a Producer without spool_dir")
        return self._direct

    @property
    def _tcp(self) -> Any:
        return self._direct_only.tcp

    def _encode_mpub(self, topic: str, bodies: Sequence[bytes]) -> list[bytes]:
        return self._direct_only.encode_mpub(topic, bodies)

    def _bind_running_loop(self) -> asyncio.AbstractEventLoop:
        return self._direct_only.home.bind_running()

    def _sync_slot(self, address: str) -> Any:
        """This thread's blocking connection to ``address`` (tests of the connection
        layer look at its negotiated features)."""
        return self._direct_only.blocking._slot(address)
