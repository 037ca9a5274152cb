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
appends to the spool (:mod:`nsq_spark.publish_spool`) and returns -- or settles its
future -- once the message is durable there; a drain thread sends the spool through an
inner, direct Producer. The spool is a part the Producer is composed with, not another
class: ``Producer(addr, spool_dir=d)`` is a ``Producer``. Its promise: what ``publish()``
accepted is delivered to nsqd or stays on disk and is retried, unless nsqd itself refused
that message for a reason a retry cannot fix (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``,
``E_BAD_BODY``, ``E_INVALID`` to PUB/MPUB/DPUB: it goes to ``spool_dir/rejected``, and
:meth:`redrive` puts it back). A failing connection -- nsqd down, the wrong port, AUTH
refused or its server down, TLS -- is retried for as long as the producer lives, and is
shown by ``stats()["health"]``, ``on_error`` and an ERROR log; :meth:`flush` returns
False meanwhile. Unlike the direct mode, where such failures raise at once (a caller is
waiting), see :func:`nsq_spark.spool.drain.refused`.

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
import importlib
import logging
import os
import threading
import time
from typing import Any, Awaitable, Callable, Iterable, Sequence

from . import protocol, validate
from ._loop import LoopThread
from .addresses import Address, parse_address_list, parse_http_address, split_list
from .config import ConnectionConfig, check_producer_options
from .errors import ConfigError, InvalidBodyError, NSQError, NSQTimeoutError
from .errors import is_transient as is_transient  # re-export: the one classification
from .publish.http import HttpPublisher
from .publish.retry import RetryPolicy
from .publish.stats import PublishStats
from .publish.sync import BlockingPool
from .publish.tcp import PipelinedPool
from .spool.drain import SpoolDrain
from .spool.format import SpoolError
from .spool.store import FSYNC_ALWAYS, CorruptSegment, SegmentStore, SpoolStats

log = logging.getLogger(__name__)

__all__ = ["Producer", "Writer", "is_transient"]

#: nsqd's default --max-body-size: an mpublish larger than this is sent as several MPUBs.
DEFAULT_MAX_MPUB_BYTES = 5 * 1024 * 1024

#: spool options and their defaults: changing one without spool_dir is an error
_SPOOL_DEFAULTS: dict[str, Any] = {
    "spool_fsync": FSYNC_ALWAYS, "spool_max_bytes": 1 << 30, "spool_full": "block",
    "spool_block_timeout": None, "message_id_digest": False, "batch_size": 1000,
    "batch_bytes": 1 << 20, "rescan_interval": 1.0, "on_corrupt": None, "on_rejected": None,
    "on_error": None, "producer_factory": None,
}


def __getattr__(name: str) -> Any:
    # `from nsq_spark.producer import Writer` keeps working; Writer lives in writer.py,
    # which imports this module (so this one must not import it back)
    if name == "Writer":
        return importlib.import_module("nsq_spark.writer").Writer
    raise AttributeError(f"module 'nsq_spark.producer' has no attribute {name!r}")


def _body(body: Any, max_size: int | None, what: str) -> bytes:
    """The one body rule, for the spool path (the direct path applies the same
    ``protocol._check_body`` while encoding)."""
    protocol._check_body(body, max_size, what)
    return body if isinstance(body, bytes) else bytes(body)


def _done_future(fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's future
        fut.set_exception(exc)
    else:
        fut.set_result(b"OK")
    return fut


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
        spool_dir: publish through a durable local spool in this directory (see
            :mod:`nsq_spark.publish_spool`): every call returns once the message is in
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
            log: at most once per 30 s in all. The callbacks run on the drain thread:
            keep them short.
        producer_factory: builds the producer the spool sends through (default: a direct
            ``Producer`` with the other options given here).
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
                 spool_dir: str | os.PathLike[str] | None = None,
                 spool_fsync: str | int | None = FSYNC_ALWAYS,
                 spool_max_bytes: int = 1 << 30, spool_full: str = "block",
                 spool_block_timeout: float | None = None, message_id_digest: bool = False,
                 batch_size: int = 1000, batch_bytes: int = 1 << 20,
                 rescan_interval: float = 1.0,
                 on_corrupt: Callable[[CorruptSegment], None] | None = None,
                 on_rejected: Callable[[str, bytes, BaseException], None] | None = None,
                 on_error: Callable[[BaseException], None] | None = None,
                 producer_factory: Callable[[], Any] | None = None,
                 **connection_options: Any) -> None:
        spool_options = dict(
            spool_fsync=spool_fsync, spool_max_bytes=spool_max_bytes, spool_full=spool_full,
            spool_block_timeout=spool_block_timeout, message_id_digest=message_id_digest,
            batch_size=batch_size, batch_bytes=batch_bytes, rescan_interval=rescan_interval,
            on_corrupt=on_corrupt, on_rejected=on_rejected, on_error=on_error,
            producer_factory=producer_factory)
        check_producer_options(  # every number, by the one rule (nsq_spark.validate)
            strategy=strategy, max_tries=max_tries, retry_wait=retry_wait,
            retry_max_wait=retry_max_wait, retry_deadline=retry_deadline,
            publish_timeout=publish_timeout, max_msg_size=max_msg_size,
            max_mpub_bytes=max_mpub_bytes, blocking_connections=blocking_connections,
            spool_max_bytes=spool_max_bytes, spool_block_timeout=spool_block_timeout,
            batch_size=batch_size, batch_bytes=batch_bytes, rescan_interval=rescan_interval)
        self._closed = False
        self._lock = threading.Lock()
        self._stats = PublishStats(log)
        self._spool: SpoolDrain | None = None
        self._store: SegmentStore | None = None
        self.max_msg_size = max_msg_size
        if spool_dir is not None:
            self._init_spool(spool_dir, nsqd_tcp_addresses, spool_options, dict(
                nsqd_http_addresses=nsqd_http_addresses, strategy=strategy,
                max_tries=max_tries, retry_wait=retry_wait, retry_max_wait=retry_max_wait,
                retry_deadline=retry_deadline, publish_timeout=publish_timeout,
                max_msg_size=max_msg_size, max_mpub_bytes=max_mpub_bytes,
                blocking_connections=blocking_connections, **connection_options),
                retry_max_wait)
            return
        stray = sorted(k for k, v in spool_options.items() if v != _SPOOL_DEFAULTS[k])
        if stray:
            raise ConfigError(
                f"{', '.join(stray)} only appl{'ies' if len(stray) == 1 else 'y'} to a "
                "spooling producer: also give spool_dir=<directory> "
                "(Producer(..., spool_dir=path, ...)), or drop "
                f"{'it' if len(stray) == 1 else 'them'}")
        tcp = parse_address_list(nsqd_tcp_addresses, "nsqd_tcp_addresses")
        http = [parse_http_address(a, "nsqd_http_addresses", "127.0.0.1:4151")
                for a in split_list(nsqd_http_addresses, "nsqd_http_addresses")]
        if bool(tcp) == bool(http):
            raise ConfigError("give nsqd_tcp_addresses or nsqd_http_addresses (one of them, "
                              "e.g. Producer('127.0.0.1:4150'))")
        self.max_tries: int | None = max_tries  # None: retry_deadline is the budget
        self.config = ConnectionConfig.from_options(**connection_options)
        self._addr: dict[str, Address] = {str(a): a for a in tcp}
        self.nsqd_tcp_addresses = list(self._addr)
        self.nsqd_http_addresses = [f"{s}://{a}{p}" for s, a, p in http]
        self.http_mode = bool(http)
        self.strategy = strategy
        self.retry_wait = retry_wait
        self.retry_max_wait = retry_max_wait
        self.retry_deadline = retry_deadline
        self.publish_timeout = publish_timeout
        self.max_mpub_bytes = max_mpub_bytes
        self.blocking_connections = blocking_connections
        self._retry = RetryPolicy(max_tries, retry_deadline, retry_wait, retry_max_wait)
        self._http = HttpPublisher(http, self.config, self._retry, self._stats,
                                   lambda: self._closed) if http else None

        self._loop: asyncio.AbstractEventLoop | None = None
        self._io: LoopThread | None = None      # the IO thread, when the futures API runs
        self._tcp = PipelinedPool(
            self._addr, self.config, strategy=strategy, retry=self._retry, stats=self._stats,
            loop=self._current_loop, stopped=lambda: self._closed, timeout=publish_timeout)
        self._blocking = BlockingPool(
            self._addr, self.config, strategy=strategy,
            connections_per_nsqd=blocking_connections, retry=self._retry,
            retry_wait=retry_wait, stats=self._stats, stopped=lambda: self._closed,
            timeout=publish_timeout)

    def _init_spool(self, spool_dir: str | os.PathLike[str], tcp: Any,
                    spool: dict[str, Any], inner: dict[str, Any], retry_max_wait: float) -> None:
        factory = spool["producer_factory"]
        if factory is None:
            if tcp is None and not inner.get("nsqd_http_addresses"):
                raise ConfigError("a spooling Producer needs nsqd_tcp_addresses (or "
                                  "nsqd_http_addresses, or a producer_factory)")
            # the spool retries without end (and without losing anything); the inner
            # producer fails fast so that close() and outages stay responsive
            if inner["max_tries"] is None:
                inner["max_tries"] = 1
            # built now, so that a bad option fails here and not in the drain thread
            sender = Producer(tcp, **inner)
            self.nsqd_tcp_addresses = sender.nsqd_tcp_addresses
            self.nsqd_http_addresses = sender.nsqd_http_addresses
        else:
            sender = factory()
            self.nsqd_tcp_addresses = [] if tcp is None else [str(a) for a in split_list(
                tcp, "nsqd_tcp_addresses")]
            self.nsqd_http_addresses = []
        self.http_mode = bool(self.nsqd_http_addresses)
        self.max_tries = inner["max_tries"] or 1   # of the inner producer
        try:
            self._store = SegmentStore(
                spool_dir, fsync=spool["spool_fsync"], max_bytes=spool["spool_max_bytes"],
                full=spool["spool_full"], block_timeout=spool["spool_block_timeout"],
                on_corrupt=spool["on_corrupt"])
        except BaseException:
            sender.close()
            raise
        self.spool_dir = self._store.directory
        self.message_id_digest = bool(spool["message_id_digest"])
        self.batch_size: int = spool["batch_size"]
        self.batch_bytes: int = spool["batch_bytes"]
        self.rescan_interval: float = spool["rescan_interval"]
        self._spool = SpoolDrain(
            self._store, sender,
            retry=RetryPolicy(max_tries=None, deadline=None, wait=0.05, max_wait=retry_max_wait),
            message_id_digest=self.message_id_digest, batch_size=spool["batch_size"],
            batch_bytes=spool["batch_bytes"], rescan_interval=spool["rescan_interval"],
            on_rejected=spool["on_rejected"], on_error=spool["on_error"])
        self._rejected_seen = 0   # rejections already reported by flush()
        # take over leftovers now, so that flush() right after start covers them
        self._store.claim_orphans()
        self._spool.start()

    def __repr__(self) -> str:
        if self._spool is not None:
            return f"<Producer {self.nsqd_tcp_addresses or self.nsqd_http_addresses} " \
                   f"spool={self.spool_dir}>"
        addrs = self.nsqd_http_addresses if self.http_mode else self.nsqd_tcp_addresses
        return f"<Producer {addrs} {'http' if self.http_mode else 'tcp'}>"

    # -- loop management --------------------------------------------------------------------

    def _ensure_thread_loop(self) -> asyncio.AbstractEventLoop:
        """The producer's loop for blocking callers (starting the IO thread if needed)."""
        loop = self._loop
        if loop is not None and self._io is None and loop.is_closed():
            self._forget_loop()  # bound to an asyncio.run() that has ended
            loop = None
        if loop is not None:
            if self._io is None:
                try:
                    running = asyncio.get_running_loop()
                except RuntimeError:
                    running = None
                if running is loop:
                    raise NSQError("blocking publish() called on the event loop the producer "
                                   "runs on; use `await producer.apublish(...)` there")
                if loop.is_closed() or not loop.is_running():
                    raise NSQError("the event loop this producer was bound to is not running; "
                                   "use the async API inside it, or a new Producer")
            return loop
        with self._lock:
            if self._loop is None:
                if self._closed:
                    raise NSQError("the producer is closed")
                self._io = LoopThread("nsq-producer-io")
                self._loop = self._io.loop
        return self._loop  # type: ignore[return-value]

    def _bind_running_loop(self) -> asyncio.AbstractEventLoop:
        running = asyncio.get_running_loop()
        if self._loop is not None and self._io is None and self._loop.is_closed():
            self._forget_loop()  # bound to an asyncio.run() that has ended: start over
        if self._loop is None:
            with self._lock:
                if self._loop is None:
                    if self._closed:
                        raise NSQError("the producer is closed")
                    self._loop = running
        return self._loop  # type: ignore[return-value]

    def _current_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        assert loop is not None, "the pipelined path runs on the producer's loop"
        return loop

    def _forget_loop(self) -> None:
        with self._lock:
            self._tcp.forget()
            if self._http is not None:
                self._http.forget()
            self._loop = None

    # -- encoding (in the caller's thread: bad input fails at once) ----------------------

    def _encode_pub(self, topic: str, body: bytes, defer_ms: int | None) -> bytes:
        if defer_ms:
            return protocol.dpub(topic, int(defer_ms), body, self.max_msg_size)
        return protocol.pub(topic, body, self.max_msg_size)

    def _encode_mpub(self, topic: str, bodies: Iterable[bytes]) -> list[bytes]:
        if not isinstance(bodies, (list, tuple)):
            bodies = list(bodies)
        try:
            total = sum(map(len, bodies)) + 4 * len(bodies) + 4 if bodies else 0
        except TypeError:
            total = 0  # protocol.mpub names the offending body
        if total <= self.max_mpub_bytes:
            return [protocol.mpub(topic, bodies, self.max_msg_size)]
        return [protocol.mpub(topic, batch, self.max_msg_size)
                for batch in protocol.split_bodies(bodies, self.max_mpub_bytes)]

    # -- the spool path ------------------------------------------------------------------

    def _spool_records(self, topic: str, bodies: Iterable[Any], defer_ms: int | None,
                       many: bool) -> list[tuple[str, bytes, int | None]]:
        """The direct path's checks (``protocol.check_topic``/``_check_body``), in its
        order (PUB: body first, MPUB: topic first), so both modes accept, and refuse with
        the same error, the same calls; a bytes topic is spooled as its str."""
        if many:   # named as protocol.mpub names them
            topic = protocol.check_topic(topic)
            records = [(topic, _body(b, self.max_msg_size, f"message body #{i}"), defer_ms)
                       for i, b in enumerate(bodies)]
            if not records:
                raise InvalidBodyError("mpublish needs at least one message body")
            return records
        (body,) = bodies
        body = _body(body, self.max_msg_size, "message body")
        return [(protocol.check_topic(topic), body, defer_ms)]

    def _spool_append(self, records: list[tuple[str, bytes, int | None]]) -> None:
        assert self._store is not None and self._spool is not None
        if self._closed:
            raise SpoolError("this Producer is closed; create a new one")
        self._store.append(records)
        self._spool.wake()

    # -- blocking API ------------------------------------------------------------------------

    def publish(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:
        """Publish one message (DPUB when ``defer_ms`` is given); returns when nsqd
        acknowledged it -- with ``spool_dir``, when it is in the spool. Raises
        InvalidNameError/InvalidBodyError for bad input, a typed NSQServerError for a
        refusal, ConnectError when no nsqd can be reached."""
        defer_ms = validate.defer_ms(defer_ms)
        if self._spool is not None:
            self._spool_append(self._spool_records(topic, (body,), defer_ms, False))
            return
        if self.http_mode:
            self._wait(self.publish_async(topic, body, defer_ms))
            return
        self._sync_command(self._encode_pub(topic, body, defer_ms))

    def mpublish(self, topic: str, bodies: Iterable[bytes]) -> None:
        """Publish several messages with MPUB; returns when nsqd acknowledged all (with
        ``spool_dir``: when all are in the spool, with one write and one sync)."""
        bodies = validate.bodies(bodies)
        if self._spool is not None:
            self._spool_append(self._spool_records(topic, bodies, None, True))
            return
        if self.http_mode:
            self._wait(self.mpublish_async(topic, bodies))
            return
        for data in self._encode_mpub(topic, bodies):
            self._sync_command(data)

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
        if self._spool is None or self._store is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._spool.flush(left):
                return False
            # A store holds at most max_claimed leftover segments at a time (crashed
            # producers' files, or what redrive() put back): the queue is empty only
            # when no unlocked segment is left to claim. Segments another live producer
            # holds are that producer's to flush.
            if self._store.claim_orphans() == 0:
                break
            self._spool.wake()
        rejected = self._store.stats.rejected
        fresh, self._rejected_seen = rejected - self._rejected_seen, rejected
        return fresh == 0

    def redrive(self) -> int:
        """With ``spool_dir``: move the messages of ``spool_dir/rejected`` back into the
        queue (once the cause of the refusal is fixed); returns how many. The command
        line does the same: ``nsq-spark spool redrive DIR``."""
        if self._store is None or self._spool is None:
            raise AttributeError("redrive: this Producer has no spool_dir")
        moved = self._store.redrive().messages
        self._store.claim_orphans()
        self._spool.wake()
        return moved

    # -- blocking path: plain sockets from the calling thread -------------------------------

    def _check_blocking_allowed(self) -> None:
        if self._closed:
            raise NSQError("the producer is closed")
        loop = self._loop
        if loop is not None and self._io is None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                return
            if running is loop:
                raise NSQError("blocking publish() called on the event loop the producer "
                               "runs on; use `await producer.apublish(...)` there")

    def _sync_command(self, data: bytes) -> bytes:
        self._check_blocking_allowed()
        return self._blocking.command(data)

    def _sync_slot(self, address: str) -> Any:
        """This thread's blocking connection to ``address`` (tests of the connection
        layer look at its negotiated features)."""
        return self._blocking._slot(address)

    # -- futures API ---------------------------------------------------------------------

    def publish_async(self, topic: str, body: bytes, defer_ms: int | None = None
                      ) -> concurrent.futures.Future[bytes]:
        """Like publish, but returns a concurrent.futures.Future at once (pipelining).
        Bad input raises here. With ``spool_dir`` the future is settled once the message
        is in the spool (the append happens in this call)."""
        defer_ms = validate.defer_ms(defer_ms)
        if self._spool is not None:
            records = self._spool_records(topic, (body,), defer_ms, False)
            return _done_future(lambda: self._spool_append(records))
        if self._http is not None:
            protocol._check_body(body, self.max_msg_size)
            protocol.check_topic(topic)
            return self._threaded(self._http.pub(topic, body, defer_ms))
        return self._submit(self._encode_pub(topic, body, defer_ms))

    def mpublish_async(self, topic: str, bodies: Iterable[bytes]
                       ) -> concurrent.futures.Future[Any]:
        """Like mpublish, but returns a concurrent.futures.Future at once."""
        bodies = validate.bodies(bodies)
        if self._spool is not None:
            records = self._spool_records(topic, bodies, None, True)
            return _done_future(lambda: self._spool_append(records))
        datas = self._encode_mpub(topic, bodies)
        if self._http is not None:
            return self._threaded(self._http.mpub(topic, datas))
        if len(datas) == 1:
            return self._submit(datas[0])
        return _all_of([self._submit(d) for d in datas])

    def _wait(self, fut: concurrent.futures.Future[Any]) -> Any:
        # the future itself ends at publish_timeout (_bounded); the margin lets its own
        # error, which names the last failure, arrive first
        timeout = None if self.publish_timeout is None else self.publish_timeout + 1.0
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise _publish_timed_out(self.publish_timeout) from None

    def _threaded(self, coro: Awaitable[Any]) -> concurrent.futures.Future[Any]:
        loop = self._ensure_thread_loop()
        return asyncio.run_coroutine_threadsafe(_within(coro, self.publish_timeout), loop)

    def _submit(self, data: bytes) -> concurrent.futures.Future[bytes]:
        if self._closed:
            raise NSQError("the producer is closed")
        self._ensure_thread_loop()
        return self._tcp.submit(data)

    # -- asyncio API -----------------------------------------------------------------------

    async def apublish(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:
        """Publish one message; returns when nsqd acknowledged it (with ``spool_dir``:
        when it is in the spool; the append runs in a worker thread)."""
        defer_ms = validate.defer_ms(defer_ms)
        if self._spool is not None:
            records = self._spool_records(topic, (body,), defer_ms, False)
            await asyncio.to_thread(self._spool_append, records)
            return
        loop = self._bind_running_loop()
        if loop is not asyncio.get_running_loop():
            await asyncio.wrap_future(self.publish_async(topic, body, defer_ms))
            return
        if self._http is not None:
            protocol._check_body(body, self.max_msg_size)
            protocol.check_topic(topic)
            await _within(self._http.pub(topic, body, defer_ms), self.publish_timeout)
            return
        await self._command(self._encode_pub(topic, body, defer_ms))

    async def ampublish(self, topic: str, bodies: Iterable[bytes]) -> None:
        """Publish several messages with MPUB; returns when nsqd acknowledged all."""
        bodies = validate.bodies(bodies)
        if self._spool is not None:
            records = self._spool_records(topic, bodies, None, True)
            await asyncio.to_thread(self._spool_append, records)
            return
        loop = self._bind_running_loop()
        if loop is not asyncio.get_running_loop():
            await asyncio.wrap_future(self.mpublish_async(topic, bodies))
            return
        datas = self._encode_mpub(topic, bodies)
        if self._http is not None:
            await _within(self._http.mpub(topic, datas), self.publish_timeout)
            return
        if len(datas) == 1:
            await self._command(datas[0])
        else:
            await asyncio.gather(*(self._command(d) for d in datas))

    def publish_nowait(self, topic: str, body: bytes, defer_ms: int | None = None
                       ) -> "asyncio.Future[bytes]":
        """On the producer's loop: queue a publish and return an asyncio future of the
        answer without a coroutine per call (the cheapest way to pipeline from asyncio).
        Transient failures are retried like apublish. With ``spool_dir`` the message is
        appended in this call and the future is already settled."""
        defer_ms = validate.defer_ms(defer_ms)
        if self._spool is not None:
            return asyncio.wrap_future(self.publish_async(topic, body, defer_ms))
        if self._loop is None:
            self._bind_running_loop()
        return self._command_future(self._encode_pub(topic, body, defer_ms))

    def _command_future(self, data: bytes) -> "asyncio.Future[bytes]":
        return self._tcp.command_future(data)

    async def _command(self, data: bytes) -> bytes:
        return await self._tcp.command_future(data)

    # -- state -----------------------------------------------------------------------------

    @property
    def published(self) -> int:
        """Commands acknowledged so far (a PUB, an MPUB, an HTTP request each count 1);
        ``stats()["messages"]`` counts messages."""
        return self._stats.commands

    @property
    def spool_stats(self) -> SpoolStats:
        """The spool's counters (live object); only with ``spool_dir``."""
        if self._store is None:
            raise AttributeError("spool_stats: this Producer has no spool_dir")
        return self._store.stats

    @property
    def last_error(self) -> BaseException | None:
        """With ``spool_dir``: the last failure of the drain (None once a send worked)."""
        return None if self._spool is None else self._spool.last_error

    def pending_bytes(self) -> int:
        """Spooled bytes this producer holds that nsqd has not acknowledged (0 without a
        spool)."""
        return 0 if self._store is None else self._store.pending()

    def stats(self) -> dict[str, Any]:
        """Counters: ``messages``, ``bytes``, ``retries``, ``errors`` (ints, in messages
        and body bytes), ``commands``, and per nsqd ``"nsqd": {address: {"up",
        "messages", "bytes", "last_error"}}``; with ``spool_dir`` also ``spool_pending``
        (messages), ``spool_pending_bytes``, the spool's own counters (``acked``: taken
        by nsqd; ``rejected``: refused for good, never in ``acked``; ``redriven``) and
        its health: ``health`` (``"ok"`` or ``"failing"``), ``last_error`` (the cause),
        ``failing_since`` (epoch seconds), ``consecutive_failures``."""
        if self._spool is not None:
            return self._spool_stats_dict()
        out = self._stats.snapshot()
        sync_open = self._blocking.connected()
        out["published"] = out["commands"]
        out["connected"] = sorted(self._tcp.connected() | sync_open)
        out["down"] = {a: d["last_error"] for a, d in out["nsqd"].items() if d["up"] is False}
        return out

    def _spool_stats_dict(self) -> dict[str, Any]:
        assert self._spool is not None and self._store is not None
        drain, store, st = self._spool, self._store, self._store.stats
        sender = drain.sender
        inner = sender.stats() if callable(getattr(sender, "stats", None)) else None
        return {
            "messages": drain.sent_messages, "bytes": drain.sent_bytes,
            "retries": drain.retries, "errors": st.rejected,
            "nsqd": inner.get("nsqd", {}) if isinstance(inner, dict) else {},
            "spool_pending": store.pending_messages(), "spool_pending_bytes": store.pending(),
            "spool_dir": str(self.spool_dir), "appended": st.appended, "acked": st.acked,
            "rejected": st.rejected, "pending_bytes": store.pending(),
            "bytes_on_disk": store.bytes_on_disk, "orphans_claimed": st.orphans_claimed,
            "segments_deleted": st.segments_deleted, "fsyncs": st.fsyncs,
            "corrupt_segments": [str(c) for c in st.corrupt_segments],
            "redriven": st.redriven, **drain.health_dict(),
            "producer": inner,
        }

    # -- closing ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close from the producer's loop (async users)."""
        if self._spool is not None:
            await asyncio.to_thread(self.close)
            return
        self._closed = True
        await self._close_on_loop()

    async def _close_on_loop(self) -> None:
        self._closed = True
        await self._tcp.close()
        if self._http is not None:
            self._http.close()

    def _close_spool(self, timeout: float | None) -> None:
        assert self._spool is not None and self._store is not None
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._store.forked:
            return   # a forked copy: the parent owns the spool, the IO threads are not here
        try:
            wait = 5.0 if timeout is None else timeout
            if wait > 0:
                self._spool.flush(wait)
        finally:
            self._spool.stop()
            self._store.close()

    def close(self, timeout: float | None = None) -> None:
        """Wait (bounded) for outstanding answers, close the connections, stop the IO
        thread. With ``spool_dir``: try for ``timeout`` seconds (default 5) to send what
        the spool holds, and leave the rest on disk for the next start (or another
        process on the same directory). Safe to call twice."""
        if self._spool is not None:
            self._close_spool(timeout)
            return
        with self._lock:
            self._closed = True
        self._blocking.close()
        loop = self._loop
        if loop is None:
            return
        io = self._io
        if io is None:
            # bound to a caller's loop
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                asyncio.ensure_future(self._close_on_loop())
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(self._close_on_loop(), loop).result(
                    timeout or self.config.close_timeout + 5)
            return
        try:
            io.run_coroutine(self._close_on_loop()).result(
                timeout if timeout is not None else self.config.close_timeout + 5)
        except Exception as exc:  # noqa: BLE001 - closing goes on
            log.warning("producer close: %s", exc)
        io.stop(10)
        self._io = None
        self._loop = None

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "Producer":
        if self._spool is None:
            self._bind_running_loop()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._spool is None and self._io is None:
            await self.aclose()
        else:
            await asyncio.to_thread(self.close)


async def _within(coro: Awaitable[Any], timeout: float | None) -> Any:
    """``coro`` within publish_timeout (the HTTP path; the TCP pools bound themselves)."""
    if timeout is None:
        return await coro
    try:
        return await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        raise _publish_timed_out(timeout) from None


def _publish_timed_out(timeout: float | None) -> NSQTimeoutError:
    return NSQTimeoutError(f"publish did not complete within publish_timeout={timeout}s "
                           "(retries included; raise publish_timeout to wait longer)")


def _all_of(futs: list[concurrent.futures.Future[Any]]) -> concurrent.futures.Future[Any]:
    out: concurrent.futures.Future[Any] = concurrent.futures.Future()
    remaining = [len(futs)]
    lock = threading.Lock()

    def done(f: concurrent.futures.Future[Any]) -> None:
        exc = f.exception()
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if exc is not None:
            if not out.done():
                out.set_exception(exc)
        elif last and not out.done():
            out.set_result(f.result())

    for f in futs:
        f.add_done_callback(done)
    return out
