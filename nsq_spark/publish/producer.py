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

The Producer is a facade over one *transport* (:class:`~nsq_spark.publish.transport.
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
waiting), see :func:`nsq_spark.spool.drain.refused`.

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
(:class:`nsq_spark.publish.retry.RetryPolicy`: until ``retry_deadline``, exponential
backoff with jitter); a permanent one (bad topic, body too big, refused AUTH or TLS
certificate, a malformed answer) is raised at once. ``publish_timeout`` bounds a whole
call, retries included, in every mode. A retried publish whose first attempt reached nsqd
before the connection broke may be stored twice: NSQ is at-least-once, and so is
publishing.

``stats()`` counts messages and bytes (not commands), retries and errors, per nsqd too;
an nsqd going down is logged once (WARNING) and its return once (INFO), see
:mod:`nsq_spark.publish.stats`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from nsq_spark import protocol, validate
from nsq_spark.addresses import parse_address_list, parse_http_address, split_list
from nsq_spark.config import ConnectionConfig, check_producer_options
from nsq_spark.envelope import PublishIds, publish_id_for, stamp, stamp_many
from nsq_spark.errors import ConfigError
from nsq_spark.spool.drain import Sender
from nsq_spark.spool.store import FSYNC_ALWAYS, CorruptSegment, SpoolStats
from nsq_spark.telemetry import checked as checked_telemetry

from .._log import get_logger
from .direct import DirectTransport
from .instrument import TracedTransport, drain_sender
from .replicas import default_quorum
from .replicated import ReplicatedTransport
from .._retry import RetryPolicy
from .spooled import SpooledTransport
from .stats import PublishStats
from .transport import Transport

if TYPE_CHECKING:
    from nsq_spark.telemetry import Telemetry

log = get_logger("nsq_spark.producer")   # the name users filter on

__all__ = ["Producer", "DEFAULT_MAX_MPUB_BYTES"]

#: nsqd's default --max-body-size: an mpublish larger than this is sent as several MPUBs.
DEFAULT_MAX_MPUB_BYTES = 5 * 1024 * 1024

#: spool options and their defaults: changing one without spool_dir is an error
_SPOOL_DEFAULTS: dict[str, Any] = {
    "spool_fsync": FSYNC_ALWAYS, "spool_max_bytes": 1 << 30, "spool_full": "block",
    "spool_block_timeout": None, "message_id_digest": False, "batch_size": 1000,
    "batch_bytes": 1 << 20, "rescan_interval": 1.0, "on_corrupt": None, "on_rejected": None,
    "on_error": None, "producer_factory": None,
}


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


class Producer:
    """Publish to one or more nsqd, directly or through a durable local spool.

    Args:
        nsqd_tcp_addresses: ``"host:port"`` or a list of them (a comma-separated string
            works too; IPv6 as ``"[::1]:4150"``).
        nsqd_http_addresses: publish through nsqd's HTTP API instead (``/pub``, ``/mpub``),
            for places where only HTTP is open: ``"host:port"`` or ``"https://host:port"``.
            Give either TCP or HTTP addresses.
        strategy: ``"round_robin"`` (default) spreads commands over the connected nsqd;
            ``"failover"`` uses the first healthy one in the given order.
        max_tries: attempts per publish for transient failures (1 = no retry); default
            None: no count, ``retry_deadline`` is the budget (an nsqd restart costs no
            error); 1 with ``spool_dir`` (the spool retries without end itself).
        retry_wait: base of the exponential backoff between attempts, seconds (jittered).
        retry_max_wait: cap of one backoff wait, seconds.
        retry_deadline: seconds of retrying after the first failure (no wait sleeps past).
        publish_timeout: the total wall time of one publish call in every mode (blocking,
            ``publish_async``'s future, ``apublish``; TCP or HTTP), retries included: it
            caps ``retry_deadline``; past it, NSQTimeoutError naming this option (None:
            ``retry_deadline`` bounds it). Inside it ``connect_timeout`` bounds each TCP
            connect, ``response_timeout`` each whole handshake and each answer.
        max_msg_size: if set, bodies over this many bytes raise InvalidBodyError before
            anything is sent (nsqd itself answers E_BAD_MESSAGE and closes the connection).
        max_mpub_bytes: an mpublish whose MPUB body would exceed this is split into several
            MPUBs (nsqd's ``--max-body-size``); each MPUB is atomic, the whole call is not.
        blocking_connections: connections per nsqd shared by the threads that use the
            blocking calls (a thread always uses the same one).
        publish_ids: stamp each body with a publish id before it is sent (the version-3
            envelope of :mod:`nsq_spark.envelope`, 27 bytes more, counted against
            ``max_msg_size``): a new id per message per call, or one derived from the
            ``idempotency_key`` given to the call; every copy and retry of it (the spool's
            resend after a crash too) carries the same id, so a consumer with
            ``dedup_key="publish_id"`` handles each publish once. Default None: on
            exactly when ``replicas`` is given. An idempotency key without publish ids
            raises ConfigError (turning them on for one call would envelope some bodies
            and not others). ``False`` with ``replicas`` sends raw copies (as NSQ's
            ``to_nsq`` does), which a consumer can only tell apart by content.
        replicas: put each message (each MPUB batch as one unit) on this many distinct
            nsqd of those given (1 .. their number; needs TCP or HTTP addresses, not a
            ``producer_factory``): the first rotates over the healthy nsqd, the others
            follow in order, a failed one is replaced by the next one not holding it.
            Default None: one copy, ``strategy`` picks the nsqd. See
            ``docs/publishing.md``.
        write_quorum: with ``replicas``: a publish returns once this many nsqd
            acknowledged it (the blocking calls once every replica answered; futures and
            asyncio at the quorum), else :class:`~nsq_spark.errors.ReplicationError`
            within ``publish_timeout``. Default None: a majority, ``replicas // 2 + 1``.
            With ``spool_dir`` the drain moves on at the quorum and keeps each message on
            disk until all ``replicas`` have it.
        spool_dir: publish through a durable local spool in this directory (see
            :mod:`nsq_spark.spool`): every call returns once the message is in
            the spool, a background thread sends it and keeps it until nsqd acknowledged
            it; :meth:`flush` waits for that. The options below apply only with
            ``spool_dir`` (changing one without it raises ConfigError).
        spool_fsync: ``"always"`` (sync before returning), an interval in ms, or
            ``"never"``.
        spool_max_bytes: bound on the directory's segment files.
        spool_full: ``"block"`` or ``"raise"`` (SpoolFullError) when the bound is reached.
        spool_block_timeout: seconds ``"block"`` waits before raising (None: for ever).
        message_id_digest: wrap each body in the message-id envelope.
        batch_size: messages per MPUB from the spool (also bounds duplicates per crash).
        batch_bytes: bytes per MPUB from the spool (below nsqd's ``--max-body-size``).
        rescan_interval: seconds between two looks for segments left by other processes.
        on_corrupt: called with a :class:`~nsq_spark.spool.store.CorruptSegment` when a
            damaged spool tail is found.
        on_rejected: called ``(topic, body, exc)`` for a spooled message nsqd refused for
            good (it is also kept in ``spool_dir/rejected``; :meth:`redrive`).
        on_error: called ``(exc)`` when sending from the spool starts failing (the
            messages stay and are retried) and while it keeps failing, with the ERROR
            log: at most once per 30 s in all. The callbacks run in order on a thread of
            their own: one that blocks delays the callbacks after it, never the sending
            nor :meth:`close` past its ``timeout``.
        producer_factory: builds what the spool sends through, a
            :class:`~nsq_spark.spool.drain.Sender` (default: a direct transport with the
            other options given here; ``max_tries`` 1 unless given: the spool retries).
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
                 strategy: str = "round_robin", max_tries: int | None = None,
                 retry_wait: float = 0.1,
                 retry_max_wait: float = 2.0, retry_deadline: float = 30.0,
                 publish_timeout: float | None = 60.0, max_msg_size: int | None = None,
                 max_mpub_bytes: int = DEFAULT_MAX_MPUB_BYTES, blocking_connections: int = 4,
                 publish_ids: bool | None = None, replicas: int | None = None,
                 write_quorum: int | None = None,
                 spool_dir: str | os.PathLike[str] | None = None,
                 spool_fsync: str | int | None = FSYNC_ALWAYS,
                 spool_max_bytes: int = 1 << 30, spool_full: str = "block",
                 spool_block_timeout: float | None = None, message_id_digest: bool = False,
                 batch_size: int = 1000, batch_bytes: int = 1 << 20,
                 rescan_interval: float = 1.0,
                 on_corrupt: Callable[[CorruptSegment], None] | None = None,
                 on_rejected: Callable[[str, bytes, BaseException], None] | None = None,
                 on_error: Callable[[BaseException], None] | None = None,
                 producer_factory: Callable[[], Sender] | None = None,
                 telemetry: "Telemetry | None" = None,
                 **connection_options: Any) -> None:
        spool_options: dict[str, Any] = dict(
            spool_fsync=spool_fsync, spool_max_bytes=spool_max_bytes, spool_full=spool_full,
            spool_block_timeout=spool_block_timeout, on_corrupt=on_corrupt,
            message_id_digest=message_id_digest, batch_size=batch_size,
            batch_bytes=batch_bytes, rescan_interval=rescan_interval,
            on_rejected=on_rejected, on_error=on_error)
        check_producer_options(  # every number, by the one rule (nsq_spark.validate)
            strategy=strategy, max_tries=max_tries, retry_wait=retry_wait,
            retry_max_wait=retry_max_wait, retry_deadline=retry_deadline,
            publish_timeout=publish_timeout, max_msg_size=max_msg_size,
            max_mpub_bytes=max_mpub_bytes, blocking_connections=blocking_connections,
            replicas=replicas, write_quorum=write_quorum, spool_max_bytes=spool_max_bytes, spool_block_timeout=spool_block_timeout,
            batch_size=batch_size, batch_bytes=batch_bytes, rescan_interval=rescan_interval)
        spooled = spool_dir is not None
        if publish_ids not in (None, True, False):
            raise ConfigError(f"publish_ids={publish_ids!r}: give True, False, or None (on "
                              "exactly when replicas is given)")
        if write_quorum is not None and replicas is None:
            raise ConfigError(f"write_quorum={write_quorum} needs replicas=N (the number of "
                              "nsqd each message goes to): give both, or drop write_quorum")
        if write_quorum is not None and replicas is not None and write_quorum > replicas:
            raise ConfigError(f"write_quorum={write_quorum} is more than replicas={replicas}: "
                              "a publish cannot be acknowledged by more nsqd than it is sent "
                              f"to; give write_quorum 1 .. {replicas}")
        if replicas is not None and producer_factory is not None:
            raise ConfigError("replicas needs the Producer's own connections to every nsqd: "
                              "drop producer_factory (or replicas)")
        if not spooled:
            given = dict(spool_options, producer_factory=producer_factory)
            stray = sorted(k for k, v in given.items() if v != _SPOOL_DEFAULTS[k])
            if stray:
                raise ConfigError(
                    f"{', '.join(stray)} only appl{'ies' if len(stray) == 1 else 'y'} to a "
                    "spooling producer: also give spool_dir=<directory> "
                    "(Producer(..., spool_dir=path, ...)), or drop "
                    f"{'it' if len(stray) == 1 else 'them'}")
        # the spool retries without end itself: the sender it drives fails fast, so that
        # close() and outages stay responsive
        if spooled and max_tries is None:
            max_tries = 1
        # every public attribute is set here, for both modes alike
        self.max_tries: int | None = max_tries   # None: retry_deadline is the budget
        self.strategy = strategy
        self.retry_wait = retry_wait
        self.retry_max_wait = retry_max_wait
        self.retry_deadline = retry_deadline
        self.publish_timeout = publish_timeout
        self.max_msg_size = max_msg_size
        self.max_mpub_bytes = max_mpub_bytes
        self.blocking_connections = blocking_connections
        #: the copies of each message, and how many must acknowledge (None: no replication)
        self.replicas: int | None = replicas
        self.write_quorum: int | None = None if replicas is None else (
            default_quorum(replicas) if write_quorum is None else write_quorum)
        #: stamp each body with a publish id (on by default with replicas)
        self.publish_ids = bool(replicas is not None if publish_ids is None else publish_ids)
        self._ids: PublishIds | None = PublishIds() if self.publish_ids else None
        self.message_id_digest = bool(message_id_digest)
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.rescan_interval = rescan_interval
        self.config = ConnectionConfig.from_options(**connection_options)
        # the one choice of mode: a transport, and the addresses it was given
        self._direct: DirectTransport | None = None   # without spool_dir (for Writer)
        spool: SpooledTransport | None = None
        transport: Transport
        sender: Sender | DirectTransport | ReplicatedTransport
        # chosen once: the transport itself, or the transport measured
        self.telemetry = checked_telemetry(telemetry, "Producer")
        server: tuple[str, int] | None = None
        if spool_dir is None:
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
            transport = spool = SpooledTransport(
                spool_dir, drained, max_msg_size=max_msg_size,
                retry_max_wait=retry_max_wait, **spool_options)
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
        return DirectTransport(
            tcp, http, self.config, strategy=self.strategy,
            retry=RetryPolicy(self.max_tries, self.retry_deadline, self.retry_wait,
                              self.retry_max_wait),
            publish_timeout=self.publish_timeout, max_msg_size=self.max_msg_size,
            max_mpub_bytes=self.max_mpub_bytes,
            blocking_connections=self.blocking_connections, stats=PublishStats(log))

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
