"""Publishing: ``Producer`` (PUB, MPUB, DPUB over TCP, or nsqd's HTTP ``/pub``/``/mpub``).

Three faces:

* blocking: ``publish``, ``mpublish``, ``close`` and the context manager. A blocking call
  talks to nsqd from the calling thread over a plain socket (an nsqd round trip on a local
  network is ~10 us; a hop to an IO thread and back would cost ten times that). Threads
  share a few connections per nsqd (``blocking_connections``) and pipeline on them.
* futures: ``publish_async``/``mpublish_async`` return a ``concurrent.futures.Future`` at
  once; the IO runs on a background thread with its own event loop, so one thread can keep
  thousands of publishes in flight, *pipelined* on one connection (answers matched in
  order), with every command written during one loop turn going out in one socket write.
* asyncio: ``await apublish(...)``, ``await ampublish(...)``, ``publish_nowait(...)``. On
  first use from a running event loop (unless the futures API started the IO thread
  first) the producer binds to that loop and uses no thread at all; used from another
  loop, calls hop to the producer's loop.

Answers are matched to commands in order (nsqd answers each connection's commands in
order). With several nsqd, commands go round-robin to the connected ones
(``strategy="round_robin"``) or to the first healthy one in the given order
(``strategy="failover"``). A command that fails with a transient error (connection lost,
nsqd unreachable or exiting, timeout) is retried on a connection that works, with
tenacity: bounded attempts, exponential backoff with jitter. Errors that name a bad request
(bad topic, body too big, refused AUTH) are raised at once. A retried publish whose first
attempt reached nsqd before the connection broke may be stored twice: NSQ is
at-least-once, and so is publishing.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import logging
import os
import threading
import time
from typing import Any, Awaitable, Callable, Iterable, Sequence
from urllib.parse import quote

from tenacity import (AsyncRetrying, Retrying, retry_if_exception, stop_after_attempt,
                      stop_after_delay, wait_random_exponential)

from . import protocol
from .config import ConnectionConfig
from .conn import Connection, SyncConnection
from .errors import (AuthError, BadMessageError, BadTopicError, ConnectError,
                     ConnectionClosedError, DPubFailedError, InvalidBodyError, MPubFailedError,
                     NSQError, NSQServerError, NSQTimeoutError, PubFailedError, TLSError)

log = logging.getLogger(__name__)

__all__ = ["Producer", "Writer", "is_transient"]

#: nsqd's default --max-body-size: an mpublish larger than this is sent as several MPUBs.
DEFAULT_MAX_MPUB_BYTES = 5 * 1024 * 1024


def is_transient(exc: BaseException) -> bool:
    """True for failures that another attempt (maybe on another nsqd) can fix."""
    if isinstance(exc, (PubFailedError, MPubFailedError, DPubFailedError)):
        return True  # nsqd could not store it (exiting, disk trouble)
    if isinstance(exc, (AuthError, TLSError, NSQServerError, InvalidBodyError)):
        return False
    return isinstance(exc, (ConnectError, ConnectionClosedError, NSQTimeoutError,
                            ConnectionError, asyncio.TimeoutError))


def _parse_address(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"nsqd address {addr!r} must look like 'host:port'")
    return host.strip("[]"), int(port)


def _addresses(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [a for a in value.split(",") if a.strip()]
    return [a.strip() for a in value]


# SpoolingProducer options that mean nothing without spool_dir (see Producer.__new__)
_SPOOL_OPTIONS = frozenset({
    "spool_fsync", "spool_max_bytes", "spool_full", "spool_block_timeout",
    "message_id_digest", "batch_size", "batch_bytes", "rescan_interval", "on_corrupt",
    "on_rejected", "producer_factory"})


class _Request:
    """One command in flight on the blocking/threaded path. Sits in a Connection's queue
    of waiters; its failure hook sends transient failures to the retry path."""

    __slots__ = ("producer", "data", "future", "conn")

    def __init__(self, producer: "Producer", data: bytes, future: concurrent.futures.Future[bytes]) -> None:
        self.producer = producer
        self.data = data
        self.future = future
        self.conn: Connection | None = None

    # the waiter protocol Connection uses
    def done(self) -> bool:
        return False  # set_result copes with a cancelled future itself (one lock less)

    def set_result(self, result: bytes) -> None:
        self.producer._published += 1
        try:
            self.future.set_result(result)
        except concurrent.futures.InvalidStateError:  # cancelled by the caller
            pass

    def set_exception(self, exc: BaseException) -> None:
        self.producer._on_request_failed(self, exc)

    def exception(self) -> None:
        return None


class _AsyncRequest:
    """One command in flight on the asyncio path: settles an asyncio future; transient
    failures go to the retry path instead."""

    __slots__ = ("producer", "data", "future")

    def __init__(self, producer: "Producer", data: bytes, future: "asyncio.Future[bytes]") -> None:
        self.producer = producer
        self.data = data
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, result: bytes) -> None:
        self.producer._published += 1
        if not self.future.done():
            self.future.set_result(result)

    def set_exception(self, exc: BaseException) -> None:
        p = self.producer
        if self.future.done():
            return
        if not is_transient(exc) or p.max_tries <= 1 or p._closed:
            self.future.set_exception(exc)
            return
        task = asyncio.ensure_future(p._send_with_retries(self.data, p.max_tries - 1, True))
        task.add_done_callback(self._settle)

    def _settle(self, task: "asyncio.Future[bytes]") -> None:
        if self.future.done():
            return
        exc = task.exception()
        if exc is None:
            self.future.set_result(task.result())
        else:
            self.future.set_exception(exc)

    def exception(self) -> None:
        return None


class Producer:
    """Publish to one or more nsqd.

    Args:
        nsqd_tcp_addresses: ``"host:port"`` or a list of them (a comma-separated string
            works too).
        nsqd_http_addresses: publish through nsqd's HTTP API instead (``/pub``, ``/mpub``),
            for places where only HTTP is open: ``"host:port"`` or ``"https://host:port"``.
            Give either TCP or HTTP addresses.
        strategy: ``"round_robin"`` (default) spreads commands over the connected nsqd;
            ``"failover"`` uses the first healthy one in the given order.
        max_tries: attempts per publish for transient failures (1 = no retry).
        retry_wait: base of the exponential backoff between attempts, seconds (jittered).
        retry_max_wait: cap of one backoff wait, seconds.
        retry_deadline: give up retrying after this many seconds in total.
        publish_timeout: seconds a blocking call waits for its answer (None: for ever; the
            retries are bounded anyway).
        max_msg_size: if set, bodies over this many bytes raise InvalidBodyError before
            anything is sent (nsqd itself answers E_BAD_MESSAGE and closes the connection).
        max_mpub_bytes: an mpublish whose MPUB body would exceed this is split into several
            MPUBs (nsqd's ``--max-body-size``); each MPUB is atomic, the whole call is not.
        blocking_connections: connections per nsqd shared by the threads that use the
            blocking calls (a thread always uses the same one).
        spool_dir: publish through a durable local spool: ``Producer(..., spool_dir=path)``
            returns a :class:`nsq_spark.publish_spool.SpoolingProducer` (same ``publish``/
            ``mpublish``/``flush``/``close``) that keeps every message on disk until nsqd
            acknowledged it. Its options ``spool_fsync``, ``spool_max_bytes``,
            ``spool_full``, ``spool_block_timeout``, ``message_id_digest``, ``batch_size``,
            ``batch_bytes``, ``rescan_interval``, ``on_corrupt``, ``on_rejected`` apply only
            with ``spool_dir`` (a ValueError otherwise); the other options go to the inner
            Producer. Only ``Producer`` itself does this, not its subclasses (``Writer``).
        **connection_options: ConnectionConfig options (TLS, snappy/deflate, auth_secret,
            heartbeat_interval, ...), with pynsq's names and units (seconds, except
            ``output_buffer_timeout`` in milliseconds).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # the one place where spool_dir= turns a Producer into a SpoolingProducer; the
        # result is not a Producer instance, so Python does not call __init__ on it
        if cls is Producer and kwargs.get("spool_dir") is not None:
            from .publish_spool import SpoolingProducer  # lazy: file IO, threads, fcntl
            return SpoolingProducer(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, nsqd_tcp_addresses: str | Sequence[str] | None = None, *,
                 nsqd_http_addresses: str | Sequence[str] | None = None,
                 strategy: str = "round_robin", max_tries: int = 5, retry_wait: float = 0.1,
                 retry_max_wait: float = 2.0, retry_deadline: float = 30.0,
                 publish_timeout: float | None = 60.0, max_msg_size: int | None = None,
                 max_mpub_bytes: int = DEFAULT_MAX_MPUB_BYTES, blocking_connections: int = 4,
                 spool_dir: str | os.PathLike[str] | None = None,
                 **connection_options: Any) -> None:
        stray = sorted(k for k in connection_options if k in _SPOOL_OPTIONS)
        if spool_dir is not None:  # only reached by subclasses (see __new__)
            raise ValueError(f"spool_dir is an option of nsq_spark.Producer itself, not of "
                             f"{type(self).__name__}; use Producer(..., spool_dir=...) or "
                             "nsq_spark.publish_spool.SpoolingProducer")
        if stray:
            raise ValueError(f"{', '.join(stray)} only appl{'ies' if len(stray) == 1 else 'y'} "
                             "to a spooling producer: also give spool_dir=<directory> "
                             "(Producer(..., spool_dir=path, ...)), or drop "
                             f"{'it' if len(stray) == 1 else 'them'}")
        tcp = _addresses(nsqd_tcp_addresses)
        http = _addresses(nsqd_http_addresses)
        if bool(tcp) == bool(http):
            raise ValueError("give nsqd_tcp_addresses or nsqd_http_addresses (one of them)")
        if strategy not in ("round_robin", "failover"):
            raise ValueError(f"strategy must be 'round_robin' or 'failover', not {strategy!r}")
        if max_tries < 1:
            raise ValueError("max_tries must be >= 1")
        for a in tcp:
            _parse_address(a)
        self.config = ConnectionConfig.from_options(**connection_options)
        self.nsqd_tcp_addresses = tcp
        self.nsqd_http_addresses = http
        self.http_mode = bool(http)
        self.strategy = strategy
        self.max_tries = max_tries
        self.retry_wait = retry_wait
        self.retry_max_wait = retry_max_wait
        self.retry_deadline = retry_deadline
        self.publish_timeout = publish_timeout
        self.max_msg_size = max_msg_size
        self.max_mpub_bytes = max_mpub_bytes

        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._owns_loop = False
        self._lock = threading.Lock()
        self._closed = False
        self._conns: dict[str, Connection] = {}
        self._live: tuple[Connection, ...] = ()  # connected, in configured order
        self._all_up = False
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._down_until: dict[str, float] = {}
        self._down_count: dict[str, int] = {}
        self._last_error: dict[str, BaseException] = {}
        self._rr = itertools.count()
        self._inbox: collections.deque[_Request] = collections.deque()
        self._drain_scheduled = False
        self._retrying: set[asyncio.Task[Any]] = set()
        self._published = 0
        self._http_client: Any = None
        if blocking_connections < 1:
            raise ValueError("blocking_connections must be >= 1")
        self.blocking_connections = blocking_connections
        self._sync: dict[str, list[SyncConnection]] = {}
        self._sync_down_until: dict[str, float] = {}
        self._sync_rr = itertools.count()

    def __repr__(self) -> str:
        addrs = self.nsqd_http_addresses if self.http_mode else self.nsqd_tcp_addresses
        return f"<Producer {addrs} {'http' if self.http_mode else 'tcp'}>"

    # -- loop management --------------------------------------------------------------------

    def _ensure_thread_loop(self) -> asyncio.AbstractEventLoop:
        """The producer's loop for blocking callers (starting the IO thread if needed)."""
        loop = self._loop
        if loop is not None and self._thread is None and loop.is_closed():
            self._forget_loop()  # bound to an asyncio.run() that has ended
            loop = None
        if loop is not None:
            if self._thread is None:
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
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name="nsq-producer-io", daemon=True)
                self._thread.start()
                started.wait(10)
                self._owns_loop = True
                self._loop = loop
        return self._loop  # type: ignore[return-value]

    def _bind_running_loop(self) -> asyncio.AbstractEventLoop:
        running = asyncio.get_running_loop()
        if self._loop is not None and self._thread is None and self._loop.is_closed():
            self._forget_loop()  # bound to an asyncio.run() that has ended: start over
        if self._loop is None:
            with self._lock:
                if self._loop is None:
                    if self._closed:
                        raise NSQError("the producer is closed")
                    self._loop = running
        return self._loop  # type: ignore[return-value]

    def _forget_loop(self) -> None:
        with self._lock:
            for conn in self._conns.values():
                stream = conn._stream
                if stream is not None and stream.socket is not None:
                    try:
                        stream.socket.close()  # its loop is gone: just release the socket
                    except OSError:
                        pass
            self._conns.clear()
            self._update_live()
            self._connecting.clear()
            self._down_until.clear()
            self._retrying.clear()
            self._inbox.clear()
            self._drain_scheduled = False
            self._http_client = None
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

    # -- blocking API ------------------------------------------------------------------------

    def publish(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:
        """Publish one message (DPUB when ``defer_ms`` is given); returns when nsqd
        acknowledged it. Raises InvalidNameError/InvalidBodyError for bad input, a typed
        NSQServerError for a refusal, ConnectError when no nsqd can be reached."""
        if self.http_mode:
            self._wait(self.publish_async(topic, body, defer_ms))
            return
        self._sync_command(self._encode_pub(topic, body, defer_ms))

    def mpublish(self, topic: str, bodies: Iterable[bytes]) -> None:
        """Publish several messages with MPUB; returns when nsqd acknowledged all."""
        if self.http_mode:
            self._wait(self.mpublish_async(topic, bodies))
            return
        for data in self._encode_mpub(topic, bodies):
            self._sync_command(data)

    # -- blocking path: plain sockets from the calling thread -------------------------------

    def _check_blocking_allowed(self) -> None:
        if self._closed:
            raise NSQError("the producer is closed")
        loop = self._loop
        if loop is not None and self._thread is None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                return
            if running is loop:
                raise NSQError("blocking publish() called on the event loop the producer "
                               "runs on; use `await producer.apublish(...)` there")

    def _sync_command(self, data: bytes) -> bytes:
        self._check_blocking_allowed()
        order = self._sync_order()
        conn = self._sync_slot_ready(order)
        if conn is not None:
            try:
                result = conn.command(data)
                self._published += 1
                return result
            except Exception as exc:
                if not is_transient(exc) or self.max_tries <= 1 or self._closed:
                    raise
                tries = self.max_tries - 1
        else:
            tries = self.max_tries
        for attempt in Retrying(
                stop=stop_after_attempt(tries) | stop_after_delay(self.retry_deadline),
                wait=wait_random_exponential(multiplier=self.retry_wait, max=self.retry_max_wait),
                retry=retry_if_exception(lambda e: is_transient(e) and not self._closed),
                reraise=True):
            with attempt:
                first, order = order, None  # later attempts start over in strategy order
                result = self._sync_get(first).command(data)
        self._published += 1
        return result

    def _sync_order(self) -> list[str]:
        addrs = self.nsqd_tcp_addresses
        if self.strategy == "failover" or len(addrs) == 1:
            return addrs
        k = next(self._sync_rr) % len(addrs)
        return addrs[k:] + addrs[:k]

    def _sync_slot(self, addr: str) -> SyncConnection:
        slots = self._sync.get(addr)
        if slots is None:
            with self._lock:
                slots = self._sync.get(addr)
                if slots is None:
                    host, port = _parse_address(addr)
                    slots = [SyncConnection(host, port, self.config)
                             for _ in range(self.blocking_connections)]
                    self._sync[addr] = slots
        return slots[threading.get_ident() % len(slots)]

    def _sync_slot_ready(self, order: list[str]) -> SyncConnection | None:
        """The fast path: this thread's open connection to the first nsqd in order."""
        now = time.monotonic()
        for addr in order:
            if self._sync_down_until.get(addr, 0) > now:
                continue
            conn = self._sync_slot(addr)
            if not conn.closed and not conn.stale:
                return conn
            return None  # needs (re)connecting: the slow path does that
        return None

    def _sync_get(self, order: list[str] | None = None) -> SyncConnection:
        """An open connection, connecting as needed, in strategy order; ConnectError with
        every cause when none can be opened."""
        now = time.monotonic()
        if order is None:
            order = self._sync_order()
        up = [a for a in order if self._sync_down_until.get(a, 0) <= now] or order
        errors: list[BaseException] = []
        for addr in up:
            conn = self._sync_slot(addr)
            try:
                conn.ensure_open()
            except Exception as exc:  # noqa: BLE001 - collected, reported together
                if not is_transient(exc):
                    raise
                errors.append(exc)
                self._sync_down_until[addr] = time.monotonic() + self.retry_wait
                continue
            self._sync_down_until.pop(addr, None)
            return conn
        detail = "; ".join(str(e) for e in errors)
        raise ConnectError(f"no nsqd reachable among {self.nsqd_tcp_addresses}: {detail}")

    def publish_async(self, topic: str, body: bytes, defer_ms: int | None = None
                      ) -> concurrent.futures.Future[bytes]:
        """Like publish, but returns a concurrent.futures.Future at once (pipelining)."""
        if self.http_mode:
            self._check_http_pub(topic, body)
            return self._threaded(self._http_pub(topic, body, defer_ms))
        return self._submit(self._encode_pub(topic, body, defer_ms))

    def mpublish_async(self, topic: str, bodies: Iterable[bytes]
                       ) -> concurrent.futures.Future[Any]:
        """Like mpublish, but returns a concurrent.futures.Future at once."""
        datas = self._encode_mpub(topic, bodies)
        if self.http_mode:
            return self._threaded(self._http_mpub(topic, datas))
        if len(datas) == 1:
            return self._submit(datas[0])
        return _all_of([self._submit(d) for d in datas])

    def _wait(self, fut: concurrent.futures.Future[Any]) -> Any:
        try:
            return fut.result(self.publish_timeout)
        except concurrent.futures.TimeoutError:
            raise NSQTimeoutError(f"no answer from nsqd within publish_timeout="
                                  f"{self.publish_timeout}s") from None

    def _threaded(self, coro: Awaitable[Any]) -> concurrent.futures.Future[Any]:
        loop = self._ensure_thread_loop()
        return asyncio.run_coroutine_threadsafe(coro, loop)  # type: ignore[arg-type]

    def _submit(self, data: bytes) -> concurrent.futures.Future[bytes]:
        if self._closed:
            raise NSQError("the producer is closed")
        loop = self._ensure_thread_loop()
        fut: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        self._inbox.append(_Request(self, data, fut))
        # wake the loop only when no drain is already scheduled: many callers, one wakeup
        if not self._drain_scheduled:
            self._drain_scheduled = True
            loop.call_soon_threadsafe(self._drain)
        return fut

    def _drain(self) -> None:
        """On the loop: send everything the threads queued since the last drain."""
        self._drain_scheduled = False
        inbox = self._inbox
        while inbox:
            req = inbox.popleft()
            conn = self._pick()
            if conn is not None:
                req.conn = conn
                conn.command_into(req.data, req)
            else:
                self._retry_later(req, None)

    def _on_request_failed(self, req: _Request, exc: BaseException) -> None:
        if req.future.done():
            return
        if not is_transient(exc) or self.max_tries <= 1 or self._closed:
            req.future.set_exception(exc)
            return
        self._retry_later(req, exc)

    def _retry_later(self, req: _Request, exc: BaseException | None) -> None:
        task = asyncio.ensure_future(self._retry(req, exc))
        self._retrying.add(task)
        task.add_done_callback(self._retrying.discard)

    async def _retry(self, req: _Request, first_exc: BaseException | None) -> None:
        tries = self.max_tries - (1 if first_exc is not None else 0)
        try:
            result = await self._send_with_retries(req.data, tries, first_exc is not None)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's future
            if not req.future.done():
                req.future.set_exception(exc)
            return
        if not req.future.done():
            req.future.set_result(result)

    # -- asyncio API -----------------------------------------------------------------------

    async def apublish(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:
        """Publish one message; returns when nsqd acknowledged it."""
        loop = self._bind_running_loop()
        if loop is not asyncio.get_running_loop():
            await asyncio.wrap_future(self.publish_async(topic, body, defer_ms))
            return
        if self.http_mode:
            self._check_http_pub(topic, body)
            await self._http_pub(topic, body, defer_ms)
            return
        await self._command(self._encode_pub(topic, body, defer_ms))

    async def ampublish(self, topic: str, bodies: Iterable[bytes]) -> None:
        """Publish several messages with MPUB; returns when nsqd acknowledged all."""
        loop = self._bind_running_loop()
        if loop is not asyncio.get_running_loop():
            await asyncio.wrap_future(self.mpublish_async(topic, bodies))
            return
        datas = self._encode_mpub(topic, bodies)
        if self.http_mode:
            await self._http_mpub(topic, datas)
            return
        if len(datas) == 1:
            await self._command(datas[0])
        else:
            await asyncio.gather(*(self._command(d) for d in datas))

    def publish_nowait(self, topic: str, body: bytes, defer_ms: int | None = None
                       ) -> "asyncio.Future[bytes]":
        """On the producer's loop: queue a publish and return an asyncio future of the
        answer without a coroutine per call (the cheapest way to pipeline from asyncio).
        Transient failures are retried like apublish."""
        if self._loop is None:
            self._bind_running_loop()
        return self._command_future(self._encode_pub(topic, body, defer_ms))

    def _command_future(self, data: bytes) -> "asyncio.Future[bytes]":
        conn = self._pick()
        if conn is None:
            return asyncio.ensure_future(self._send_with_retries(data, self.max_tries, False))
        fut: asyncio.Future[bytes] = self._loop.create_future()  # type: ignore[union-attr]
        conn.command_into(data, _AsyncRequest(self, data, fut))
        return fut

    async def _command(self, data: bytes) -> bytes:
        return await self._command_future(data)

    # -- the retry path (tenacity) -----------------------------------------------------------

    async def _send_with_retries(self, data: bytes, tries: int, wait_first: bool) -> bytes:
        if tries < 1:
            raise ConnectError("no attempts left")
        if wait_first:
            await asyncio.sleep(self.retry_wait)
        result = b""
        async for attempt in AsyncRetrying(
                stop=stop_after_attempt(tries) | stop_after_delay(self.retry_deadline),
                wait=wait_random_exponential(multiplier=self.retry_wait, max=self.retry_max_wait),
                retry=retry_if_exception(lambda e: is_transient(e) and not self._closed),
                reraise=True):
            with attempt:
                conn = await self._get_connection()
                result = await conn.command(data)
        self._published += 1
        return result

    # -- connections -------------------------------------------------------------------------

    def _pick(self) -> Connection | None:
        """A connected connection per the strategy, or None (then the slow path connects)."""
        live = self._live
        if len(live) == 1 and self._all_up:
            return live[0]
        if not live:
            return None
        if not self._all_up:
            self._maybe_reconnect_preferred()
        if self.strategy == "failover":
            return live[0]  # _live keeps the configured order
        return live[next(self._rr) % len(live)]

    def _update_live(self) -> None:
        self._live = tuple(self._conns[a] for a in self.nsqd_tcp_addresses if a in self._conns)
        self._all_up = len(self._live) == len(self.nsqd_tcp_addresses)

    def _maybe_reconnect_preferred(self) -> None:
        """Bring back nsqd that were down, once their backoff has passed (no waiting)."""
        loop = self._loop
        assert loop is not None
        now = loop.time()
        for addr in self.nsqd_tcp_addresses:
            if addr not in self._conns and addr not in self._connecting \
                    and self._down_until.get(addr, 0) <= now:
                asyncio.ensure_future(self._connect(addr)).add_done_callback(_retrieve)

    async def _get_connection(self) -> Connection:
        conn = self._pick()
        if conn is not None:
            return conn
        loop = self._loop
        assert loop is not None
        now = loop.time()
        candidates = [a for a in self.nsqd_tcp_addresses if self._down_until.get(a, 0) <= now] \
            or list(self.nsqd_tcp_addresses)
        tasks = [asyncio.ensure_future(self._connect(a)) for a in candidates]
        for t in tasks:
            t.add_done_callback(_retrieve)  # late failures are recorded, not warned about
        errors: list[BaseException] = []
        # connect to all at once; failover takes them in the configured order, round-robin
        # whichever answers first
        order = tasks if self.strategy == "failover" else asyncio.as_completed(tasks)
        for fut in order:
            try:
                return await fut
            except Exception as exc:  # noqa: BLE001 - collected, reported together
                errors.append(exc)
        fatal = [e for e in errors if not is_transient(e)]
        if fatal:
            raise fatal[0]
        detail = "; ".join(str(e) for e in errors)
        raise ConnectError(f"no nsqd reachable among {self.nsqd_tcp_addresses}: {detail}")

    async def _connect(self, addr: str) -> Connection:
        existing = self._connecting.get(addr)
        if existing is not None:
            return await asyncio.shield(existing)
        conn = self._conns.get(addr)
        if conn is not None:
            return conn
        loop = self._loop
        assert loop is not None
        fut: asyncio.Future[Connection] = loop.create_future()
        self._connecting[addr] = fut
        try:
            host, port = _parse_address(addr)
            conn = Connection(host, port, self.config, on_close=self._on_conn_close)
            await conn.connect()
        except BaseException as exc:
            n = self._down_count.get(addr, 0) + 1
            self._down_count[addr] = n
            self._down_until[addr] = loop.time() + min(self.retry_max_wait, self.retry_wait * 2 ** n)
            self._last_error[addr] = exc
            fut.set_exception(exc)
            fut.exception()
            raise
        finally:
            self._connecting.pop(addr, None)
        self._down_count.pop(addr, None)
        self._down_until.pop(addr, None)
        if self._closed:
            conn.close()
            exc2 = NSQError("the producer is closed")
            fut.set_exception(exc2)
            fut.exception()
            raise exc2
        self._conns[addr] = conn
        self._update_live()
        fut.set_result(conn)
        log.debug("producer connected to %s", addr)
        return conn

    def _on_conn_close(self, conn: Connection, exc: BaseException | None) -> None:
        if self._conns.get(conn.address) is conn:
            del self._conns[conn.address]
            self._update_live()
        if exc is not None and not self._closed:
            log.warning("producer lost nsqd %s: %s", conn.address, exc)
            loop = self._loop
            if loop is not None:
                self._down_until[conn.address] = loop.time() + self.retry_wait

    # -- HTTP mode -------------------------------------------------------------------------

    def _http(self) -> Any:
        if self._http_client is None:
            from tornado.simple_httpclient import SimpleAsyncHTTPClient
            # a private (non-shared) client: its lifetime is the producer's
            self._http_client = SimpleAsyncHTTPClient(force_instance=True, max_clients=64)
        return self._http_client

    async def _http_post(self, path_qs: str, body: bytes) -> bytes:
        from tornado.httpclient import HTTPClientError, HTTPRequest

        async def once(addr: str) -> bytes:
            base = addr if "://" in addr else f"http://{addr}"
            ssl_options = self.config.ssl_context() if base.startswith("https://") else None
            req = HTTPRequest(base.rstrip("/") + path_qs, method="POST", body=body,
                              connect_timeout=self.config.connect_timeout,
                              request_timeout=self.config.response_timeout,
                              ssl_options=ssl_options)
            try:
                resp = await self._http().fetch(req)
            except HTTPClientError as exc:
                raise _http_error(addr, exc.code, exc.response.body if exc.response else b"") from None
            except OSError as exc:
                raise ConnectError(f"cannot reach nsqd HTTP at {addr}: {exc}") from exc
            return resp.body

        result = b""
        async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.max_tries) | stop_after_delay(self.retry_deadline),
                wait=wait_random_exponential(multiplier=self.retry_wait, max=self.retry_max_wait),
                retry=retry_if_exception(lambda e: is_transient(e) and not self._closed),
                reraise=True):
            with attempt:
                addrs = self.nsqd_http_addresses
                result = await once(addrs[next(self._rr) % len(addrs)])
        self._published += 1
        return result

    def _check_http_pub(self, topic: str, body: bytes) -> None:
        protocol._check_body(body, self.max_msg_size)
        protocol.check_topic(topic)

    async def _http_pub(self, topic: str, body: bytes, defer_ms: int | None) -> bytes:
        qs = f"/pub?topic={quote(protocol.check_topic(topic))}"
        if defer_ms:
            qs += f"&defer={int(defer_ms)}"
        return await self._http_post(qs, bytes(body))

    async def _http_mpub(self, topic: str, datas: list[bytes]) -> bytes:
        qs = f"/mpub?topic={quote(protocol.check_topic(topic))}&binary=true"
        result = b""
        for data in datas:
            # an MPUB command's body (count, then sized messages) is /mpub?binary=true's body
            result = await self._http_post(qs, data[data.index(b"\n") + 5:])
        return result

    # -- closing ---------------------------------------------------------------------------

    @property
    def published(self) -> int:
        """Commands acknowledged so far (a PUB, an MPUB, an HTTP request each count 1)."""
        return self._published

    def stats(self) -> dict[str, Any]:
        sync_open = {a for a, slots in self._sync.items() if any(not c.closed for c in slots)}
        return {"published": self._published,
                "connected": sorted(set(self._conns) | sync_open),
                "down": {a: str(e) for a, e in self._last_error.items() if a not in self._conns}}

    async def aclose(self) -> None:
        """Close from the producer's loop (async users)."""
        self._closed = True
        await self._close_on_loop()

    async def _close_on_loop(self) -> None:
        self._closed = True
        if self._inbox:
            self._drain()
        if self._retrying:
            await asyncio.wait(list(self._retrying), timeout=self.config.close_timeout)
        conns = list(self._conns.values())
        if conns:
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        for fut in list(self._connecting.values()):
            fut.cancel()
        if self._http_client is not None:
            self._http_client.close()
            self._http_client = None

    def close(self, timeout: float | None = None) -> None:
        """Wait (bounded) for outstanding answers, close the connections, stop the IO
        thread. Safe to call twice."""
        with self._lock:
            self._closed = True
            sync, self._sync = self._sync, {}
        for slots in sync.values():
            for c in slots:
                c.close()
        loop = self._loop
        if loop is None:
            return
        if self._thread is None:
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
            asyncio.run_coroutine_threadsafe(self._close_on_loop(), loop).result(
                timeout if timeout is not None else self.config.close_timeout + 5)
        except Exception as exc:  # noqa: BLE001 - closing goes on
            log.warning("producer close: %s", exc)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            loop.close()
        self._thread = None
        self._loop = None

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "Producer":
        self._bind_running_loop()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._thread is None:
            await self.aclose()
        else:
            await asyncio.get_running_loop().run_in_executor(None, self.close)


def _retrieve(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled():
        fut.exception()


def _http_error(addr: str, code: int, body: bytes) -> NSQError:
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


class Writer(Producer):
    """pynsq's ``Writer`` surface on the Producer, for ``import nsq_spark as nsq`` users.

    ``pub``, ``mpub`` and ``dpub`` return at once and call ``callback(writer, data)`` on the
    event loop when nsqd answered: ``data`` is ``b"OK"`` or the exception (an NSQError).
    Call them from the running loop (a tornado/asyncio callback, as with pynsq's
    ``nsq.run()``); the writer connects on first use. ``reconnect_interval`` is accepted for
    compatibility: reconnects follow the Producer's retry policy instead.
    """

    def __init__(self, nsqd_tcp_addresses: str | Sequence[str], reconnect_interval: float = 15.0,
                 name: str | None = None, **kwargs: Any) -> None:
        super().__init__(nsqd_tcp_addresses, **kwargs)
        self.name = name or "nsq_spark.Writer"
        self.reconnect_interval = reconnect_interval

    def _on_loop_future(self, data: bytes) -> "asyncio.Future[bytes]":
        try:
            self._bind_running_loop()
        except RuntimeError:
            raise NSQError("Writer.pub/mpub/dpub must be called from the running event loop "
                           "(e.g. in a tornado callback after nsq.run()); outside a loop use "
                           "Producer.publish") from None
        return self._command_future(data)

    def _callback(self, fut: "asyncio.Future[bytes]", callback: Callable[..., Any] | None,
                  what: str) -> None:
        if callback is None:
            def log_failure(f: "asyncio.Future[bytes]") -> None:
                # no callback to tell: log it (as pynsq does) rather than lose it silently
                exc = None if f.cancelled() else f.exception()
                if exc is not None:
                    log.error("[%s] %s failed (no callback given): %s", self.name, what, exc)
            fut.add_done_callback(log_failure)
            return

        def done(f: "asyncio.Future[bytes]") -> None:
            exc = None if f.cancelled() else f.exception()
            callback(self, exc if exc is not None else f.result())

        fut.add_done_callback(done)

    def pub(self, topic: str, msg: bytes, callback: Callable[..., Any] | None = None) -> None:
        self._callback(self._on_loop_future(protocol.pub(topic, msg, self.max_msg_size)), callback,
                       f"PUB {topic}")

    def mpub(self, topic: str, msg: bytes | Sequence[bytes],
             callback: Callable[..., Any] | None = None) -> None:
        bodies = [msg] if isinstance(msg, (bytes, bytearray, memoryview)) else list(msg)
        datas = self._encode_mpub(topic, bodies)
        futs = [self._on_loop_future(d) for d in datas]
        if len(futs) == 1:
            self._callback(futs[0], callback, f"MPUB {topic}")
            return
        whole: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        def settle(g: "asyncio.Future[Any]") -> None:
            exc = g.exception()
            if exc is not None:
                whole.set_exception(exc)
            else:
                whole.set_result(b"OK")  # every MPUB of the split batch was acknowledged

        asyncio.gather(*futs).add_done_callback(settle)
        self._callback(whole, callback, f"MPUB {topic}")

    def dpub(self, topic: str, delay_ms: int, msg: bytes,
             callback: Callable[..., Any] | None = None) -> None:
        self._callback(self._on_loop_future(protocol.dpub(topic, int(delay_ms), msg,
                                                          self.max_msg_size)), callback,
                       f"DPUB {topic}")
