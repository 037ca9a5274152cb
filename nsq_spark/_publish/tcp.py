"""The pipelined TCP path: commands from any thread or coroutine, many in flight per
connection, answers matched in order, on one event loop.

The pool keeps one tornado :class:`~nsq_spark._conn.Connection` per nsqd and picks one per
command by the strategy (``"round_robin"`` over the connected ones, or ``"failover"``:
the first healthy one in the configured order); the order and each nsqd's backoff are
:class:`~.health.NsqdHealth`'s, shared with the blocking path. A command goes out with
``Connection.command_into`` and a small waiter object, so nothing per command is a
coroutine on the fast path; every command written during one loop turn goes out in one
socket write. Threads hand commands over through an inbox drained once per loop wakeup.

A transient failure (:func:`nsq_spark.errors.is_transient`) sends the command to the retry
path: the one retry policy, on whichever connection works (connecting to every candidate
at once). An nsqd that refused a connection is not tried again before its backoff has
passed; the pool reconnects preferred nsqd in the background as it picks.

``timeout`` (the Producer's ``publish_timeout``) bounds every command as a whole, retries
included: past it the command's future fails with NSQTimeoutError naming the option, and
its retrying stops. All commands share one timeout, so their deadlines come in the order
they were sent: one FIFO and one timer cover them all (no timer per command; settled
commands leave the FIFO from its front as new ones arrive). A late answer from nsqd after
the timeout is not reported (the message may have been stored: at-least-once). Each
connection bounds each answer by ``response_timeout`` itself (:class:`Connection`).

The pool runs on the loop its owner gives it (``loop()``); it does not start threads.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time
from typing import Any, Callable, Sequence

from nsq_spark._addresses import Address
from nsq_spark.config import ConnectionConfig
from nsq_spark._conn import Connection
from nsq_spark.errors import ConnectError, NSQError, NSQTimeoutError, is_transient

from .._log import get_logger
from .health import NsqdHealth
from .._retry import RetryPolicy
from .stats import PublishStats

log = get_logger("nsq_spark.producer")

__all__ = ["PipelinedPool"]


def _fewer(tries: int | None) -> int | None:
    """The attempts left after one (None: no count)."""
    return None if tries is None else tries - 1


class _Request:
    """A command from a thread: settles a concurrent future; transient failures go to
    the retry path."""

    __slots__ = ("pool", "data", "future", "key", "deadline", "settled")

    def __init__(self, pool: "PipelinedPool", data: bytes,
                 future: concurrent.futures.Future[bytes]) -> None:
        self.pool = pool
        self.data = data
        self.future = future
        self.key: str | None = None
        self.deadline = 0.0    # loop time when publish_timeout ends (set on the loop)
        self.settled = False   # the future got its outcome (or the timeout)

    # the waiter protocol Connection uses
    def done(self) -> bool:
        return False  # set_result copes with a cancelled future itself (one lock less)

    def set_result(self, result: bytes) -> None:
        if self.settled:
            return  # answered after publish_timeout: the caller was told already
        self.settled = True
        self.pool.stats.acked_on_loop(self.data, self.key)
        self.data = b""  # the deadline FIFO may hold this object a while: not the body
        try:
            self.future.set_result(result)
        except concurrent.futures.InvalidStateError:  # cancelled by the caller
            pass

    def set_exception(self, exc: BaseException) -> None:
        if not self.settled:
            self.pool._on_request_failed(self, exc)

    def fail(self, exc: BaseException) -> None:
        """Settle with ``exc`` (final: counted in ``errors``)."""
        if self.settled:
            return
        self.settled = True
        self.pool.stats.failed(self.data)
        self.data = b""
        try:
            self.future.set_exception(exc)
        except concurrent.futures.InvalidStateError:
            pass

    def finish(self, result: bytes) -> None:
        """Settle with a result the retry path already counted."""
        if self.settled:
            return
        self.settled = True
        try:
            self.future.set_result(result)
        except concurrent.futures.InvalidStateError:
            pass

    def exception(self) -> None:
        return None


class _AsyncRequest:
    """A command from the loop: settles an asyncio future; transient failures go to the
    retry path."""

    __slots__ = ("pool", "data", "future", "key", "deadline", "on_route")

    def __init__(self, pool: "PipelinedPool", data: bytes, future: "asyncio.Future[bytes]",
                 key: str | None, deadline: float,
                 on_route: Callable[[str], None] | None = None) -> None:
        self.pool = pool
        self.data = data
        self.future = future
        self.key = key
        self.deadline = deadline
        self.on_route = on_route  # told each nsqd the command is sent to (pynsq's Writer)

    @property
    def settled(self) -> bool:
        return self.future.done()

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, result: bytes) -> None:
        if self.future.done():
            return  # answered after publish_timeout (or cancelled)
        self.pool.stats.acked_on_loop(self.data, self.key)
        self.data = b""  # the deadline FIFO may hold this object a while: not the body
        self.future.set_result(result)

    def set_exception(self, exc: BaseException) -> None:
        pool = self.pool
        if self.future.done():
            return
        if pool.gives_up(exc, self.deadline):
            self.fail(exc)
            return
        task = asyncio.ensure_future(pool.send_with_retries(
            self.data, _fewer(pool.max_tries), True, self.deadline, self.done,
            self.on_route))
        task.add_done_callback(self._settle)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.pool.stats.failed(self.data)
            self.data = b""
            self.future.set_exception(exc)

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


async def _all_answered(futs: "list[asyncio.Future[bytes]]") -> None:
    """Wait for every answer; raise the first failure (every one is retrieved)."""
    results = await asyncio.gather(*futs, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r


def _retrieve(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled():
        fut.exception()


class PipelinedPool:
    """Connections to each nsqd on one event loop, commands pipelined on them.

    Args:
        addresses: ``{"host:port": Address}`` in the configured order.
        config: connection options.
        health: the strategy order and each nsqd's backoff (shared with the other pool).
        retry: the retry policy (its ``max_tries`` bounds the attempts).
        stats: counters.
        loop: returns the loop to run on (the owner's, started or bound on first use).
        stopped: True once the owner closes (ends retrying, refuses new work).
        timeout: seconds a command may take in all, retries included (None: no bound
            beyond the retry policy's and ``response_timeout`` per answer).
    """

    def __init__(self, addresses: dict[str, Address], config: ConnectionConfig, *,
                 health: NsqdHealth, retry: RetryPolicy, stats: PublishStats,
                 loop: Callable[[], asyncio.AbstractEventLoop],
                 stopped: Callable[[], bool], timeout: float | None = None) -> None:
        self.addresses = addresses
        self.order = list(addresses)
        self.config = config
        self.health = health
        self.retry = retry
        self.max_tries = retry.max_tries
        self.timeout = timeout
        self.retry_wait = retry.wait
        self.stats = stats
        self.loop = loop
        self.stopped = stopped
        self._conns: dict[str, Connection] = {}
        self._key_of: dict[Connection, str] = {}
        self._live: tuple[Connection, ...] = ()  # connected, in configured order
        self._all_up = False
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._inbox: collections.deque[_Request] = collections.deque()
        self._drain_scheduled = False
        self._retrying: set[asyncio.Task[Any]] = set()
        # requests by deadline (= by sending order: one timeout for all), and the timer
        self._by_deadline: collections.deque[_Request | _AsyncRequest] = collections.deque()
        self._sweeper: asyncio.TimerHandle | None = None
        #: ``f(conn)`` after each heartbeat of a connection (pynsq's Writer.heartbeat hook)
        self.on_heartbeat: Callable[[Connection], Any] | None = None

    # -- from threads ----------------------------------------------------------------------

    def submit(self, data: bytes) -> concurrent.futures.Future[bytes]:
        """From any thread: queue ``data`` for the loop; a future of nsqd's answer."""
        if self.stopped():
            raise NSQError("the producer is closed")
        loop = self.loop()
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
        timeout = self.timeout
        deadline = self.loop().time() + timeout if timeout is not None else 0.0
        while inbox:
            req = inbox.popleft()
            if timeout is not None:
                req.deadline = deadline
                self._watch(req)
            conn = self._pick()
            if conn is not None:
                req.key = self._key_of.get(conn)
                conn.command_into(req.data, req)
            else:
                self._retry_later(req, None)

    def _on_request_failed(self, req: _Request, exc: BaseException) -> None:
        if req.future.done():
            return
        if self.gives_up(exc, req.deadline):
            req.fail(exc)
            return
        self._retry_later(req, exc)

    # -- publish_timeout: one FIFO of deadlines, one timer -----------------------------------

    def gives_up(self, exc: BaseException, deadline: float) -> bool:
        """True when a request that failed with ``exc`` is not tried again: a permanent
        error, no retries configured, the producer closing, or its publish_timeout past."""
        return (not is_transient(exc) or self.max_tries == 1 or self.stopped()
                or self.expired(deadline))

    def expired(self, deadline: float) -> bool:
        """True once ``deadline`` (loop time; 0: none) has passed."""
        return self.timeout is not None and self.loop().time() >= deadline

    def _watch(self, req: _Request | _AsyncRequest) -> None:
        queue = self._by_deadline
        while queue and queue[0].settled:  # answered ones leave from the front
            queue.popleft()
        queue.append(req)
        if self._sweeper is None:
            self._sweeper = self.loop().call_at(queue[0].deadline, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        queue = self._by_deadline
        now = self.loop().time()
        while queue and (queue[0].settled or queue[0].deadline <= now):
            req = queue.popleft()
            if not req.settled:
                req.fail(NSQTimeoutError(
                    f"publish did not complete within publish_timeout={self.timeout}s "
                    "(retries included; raise publish_timeout to wait longer)"))
        if queue:
            self._sweeper = self.loop().call_at(queue[0].deadline, self._sweep)

    def _retry_later(self, req: _Request, exc: BaseException | None) -> None:
        task = asyncio.ensure_future(self._retry_request(req, exc))
        self._retrying.add(task)
        task.add_done_callback(self._retrying.discard)

    async def _retry_request(self, req: _Request, first_exc: BaseException | None) -> None:
        tries = _fewer(self.max_tries) if first_exc is not None else self.max_tries
        try:
            result = await self.send_with_retries(
                req.data, tries, first_exc is not None,
                req.deadline if self.timeout is not None else None, lambda: req.settled)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's future
            if not req.settled:  # (send_with_retries counted it in errors)
                req.settled = True
                try:
                    req.future.set_exception(exc)
                except concurrent.futures.InvalidStateError:
                    pass
            return
        req.finish(result)

    # -- on the loop -----------------------------------------------------------------------

    def command_future(self, data: bytes, on_route: Callable[[str], None] | None = None
                       ) -> "asyncio.Future[bytes]":
        """On the loop: send ``data``; an asyncio future of nsqd's answer. ``on_route``,
        if given, is called with the ``host:port`` of each nsqd the command is sent to
        (a retry may send it to another), before the future settles."""
        loop = self.loop()
        fut: asyncio.Future[bytes] = loop.create_future()
        timeout = self.timeout
        req = _AsyncRequest(self, data, fut, None,
                            loop.time() + timeout if timeout is not None else 0.0, on_route)
        if timeout is not None:
            self._watch(req)
        conn = self._pick()
        if conn is None:
            task = asyncio.ensure_future(self.send_with_retries(
                data, self.max_tries, False, req.deadline if timeout is not None else None,
                req.done, on_route))
            task.add_done_callback(req._settle)
            return fut
        req.key = key = self._key_of.get(conn)
        if on_route is not None and key:
            on_route(key)
        conn.command_into(data, req)
        return fut

    async def send_with_retries(self, data: bytes, tries: int | None, after_failure: bool,
                                deadline: float | None = None,
                                given_up: Callable[[], bool] | None = None,
                                on_route: Callable[[str], None] | None = None) -> bytes:
        """Send ``data`` on a working connection, retrying transient failures until
        ``deadline`` (loop time) at the latest; a failure raised from here is final
        (counted in ``errors``). ``given_up()`` true (the caller's future timed out or was
        cancelled) ends the retrying."""
        stopped = self.stopped
        if given_up is not None:
            stopped = lambda: self.stopped() or given_up()  # noqa: E731
        until = None
        if deadline is not None:  # loop time -> time.monotonic(), the policy's clock
            until = time.monotonic() + (deadline - self.loop().time())
        try:
            if tries is not None and tries < 1:
                raise ConnectError("no attempts left")
            if after_failure:
                self.stats.retried()
                await asyncio.sleep(self.retry_wait)
            result = b""
            key = ""
            async for attempt in self.retry.async_retrying(
                    tries=tries, stopped=stopped, on_retry=self._on_retry, deadline=until):
                with attempt:
                    key, conn = await self._get_connection()
                    if on_route is not None and key:
                        on_route(key)
                    result = await conn.command(data)
        except BaseException:
            if given_up is None or not given_up():  # else counted when the caller gave up
                self.stats.failed(data)
            raise
        if given_up is None or not given_up():
            self.stats.acked_on_loop(data, key)
        return result

    def _on_retry(self, _: Any) -> None:
        self.stats.retried()

    async def send_to(self, key: str, datas: Sequence[bytes]) -> None:
        """On the loop: send ``datas`` (encoded commands, in order, pipelined) to the one
        nsqd ``key``, for a replicated publish: connecting if needed, reconnecting once
        when a connection that was already open turned out closed (nsqd restarted). No
        other nsqd, no backoff waits (the replica planner substitutes instead); raises
        the failure. The caller bounds the time (publish_timeout); each answer is bounded
        by ``response_timeout`` (the connection's own)."""
        conn = self._conns.get(key)
        fresh = conn is None
        if conn is None:
            conn = await self._connect(key)
        try:
            await _all_answered([conn.command(d) for d in datas])
        except Exception as exc:
            if fresh or not conn.closed or not is_transient(exc) or self.stopped():
                raise
            self.stats.retried()
            conn = await self._connect(key)
            await _all_answered([conn.command(d) for d in datas])
        for d in datas:
            self.stats.acked_on_loop(d, key)

    # -- connections -----------------------------------------------------------------------

    def _pick(self) -> Connection | None:
        """A connected connection per the strategy, or None (then the slow path connects)."""
        live = self._live
        if len(live) == 1 and self._all_up:
            return live[0]
        if not live:
            return None
        if not self._all_up:
            self._maybe_reconnect_preferred()
        return self.health.choose(live)  # _live keeps the configured order

    def _update_live(self) -> None:
        self._live = tuple(self._conns[a] for a in self.order if a in self._conns)
        self._all_up = len(self._live) == len(self.order)

    def _maybe_reconnect_preferred(self) -> None:
        """Bring back nsqd that were down, once their backoff has passed (no waiting)."""
        health = self.health
        for key in self.order:
            if key not in self._conns and key not in self._connecting \
                    and not health.backing_off(key):
                asyncio.ensure_future(self._connect(key)).add_done_callback(_retrieve)

    async def _get_connection(self) -> tuple[str, Connection]:
        conn = self._pick()
        if conn is not None:
            return self._key_of.get(conn, ""), conn
        tasks = [asyncio.ensure_future(self._connect(a)) for a in self.health.candidates()]
        for t in tasks:
            t.add_done_callback(_retrieve)  # late failures are recorded, not warned about
        errors: list[BaseException] = []
        # connect to all at once; failover takes them in the configured order, round-robin
        # whichever answers first
        order = tasks if self.health.strategy == "failover" else asyncio.as_completed(tasks)
        for fut in order:
            try:
                conn = await fut
                return self._key_of.get(conn, ""), conn
            except Exception as exc:  # noqa: BLE001 - collected, reported together
                errors.append(exc)
        fatal = [e for e in errors if not is_transient(e)]
        if fatal:
            raise fatal[0]
        detail = "; ".join(str(e) for e in errors)
        raise ConnectError(f"no nsqd reachable among {self.order}: {detail}")

    async def _connect(self, key: str) -> Connection:
        existing = self._connecting.get(key)
        if existing is not None:
            return await asyncio.shield(existing)
        conn = self._conns.get(key)
        if conn is not None:
            return conn
        loop = self.loop()
        fut: asyncio.Future[Connection] = loop.create_future()
        self._connecting[key] = fut
        try:
            host, port = self.addresses[key]
            conn = Connection(host, port, self.config, on_heartbeat=self.on_heartbeat,
                              on_close=lambda c, e: self._on_conn_close(key, c, e))
            await conn.connect()
        except BaseException as exc:
            self.health.connect_failed(key, exc, report=not self.stopped())
            fut.set_exception(exc)
            fut.exception()
            raise
        finally:
            self._connecting.pop(key, None)
        if self.stopped():
            conn.close()
            exc2 = NSQError("the producer is closed")
            fut.set_exception(exc2)
            fut.exception()
            raise exc2
        self._conns[key] = conn
        self._key_of[conn] = key
        self._update_live()
        self.health.connected(key)
        fut.set_result(conn)
        log.for_nsqd(key).debug("producer connected to %s", key)
        return conn

    def _on_conn_close(self, key: str, conn: Connection, exc: BaseException | None) -> None:
        if self._conns.get(key) is conn:
            del self._conns[key]
            self._update_live()
        self._key_of.pop(conn, None)
        if exc is not None and not self.stopped():
            self.health.connection_lost(key, exc)

    def connected(self) -> set[str]:
        return set(self._conns)

    def open_connection(self, key: str) -> Connection | None:
        """The open connection to ``key``, if there is one (a replicated publish sends on
        it directly; :meth:`send_to` connects when there is none)."""
        conn = self._conns.get(key)
        return None if conn is None or conn.closed else conn

    # -- closing ---------------------------------------------------------------------------

    async def close(self) -> None:
        """On the loop, once ``stopped()``: send what the threads queued, wait (bounded)
        for retries in progress, close the connections."""
        if self._inbox:
            self._drain()
        if self._retrying:
            await asyncio.wait(list(self._retrying), timeout=self.config.close_timeout)
        conns = list(self._conns.values())
        if conns:
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        for fut in list(self._connecting.values()):
            fut.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def forget(self) -> None:
        """The loop is gone (an ``asyncio.run()`` ended): release the sockets without it
        and start over on the next use."""
        for conn in self._conns.values():
            stream = conn._stream
            if stream is not None and stream.socket is not None:
                try:
                    stream.socket.close()
                except OSError:
                    pass
        self._conns.clear()
        self._key_of.clear()
        self._update_live()
        self._connecting.clear()
        self.health.forget()
        self._retrying.clear()
        self._inbox.clear()
        self._by_deadline.clear()
        self._sweeper = None
        self._drain_scheduled = False
