"""The blocking fast path: publishing from the calling thread over plain sockets.

An nsqd round trip on a local network is ~10 us; a hop to an IO thread and back would
cost ten times that, so a blocking ``publish`` talks to nsqd itself. Threads share
``connections_per_nsqd`` :class:`~nsq_spark._conn.SyncConnection` per nsqd (a thread
always uses the same one, chosen by its id) and pipeline on them. The first attempt uses
the thread's open connection if it has one; anything else (connecting, reconnecting,
another nsqd, waiting between attempts) goes through the retry policy. Which nsqd, in which order, and which are
backing off after a failure is :class:`~.health.NsqdHealth`'s decision, shared with the
pipelined path.

``timeout`` (the Producer's ``publish_timeout``) bounds one call as a whole: connecting,
every attempt, every wait between attempts. Each socket wait gets only the time left, and
the retry policy stops at the earlier of its own deadline and this one; a call that ran
out raises NSQTimeoutError naming ``publish_timeout`` (its cause: the last failure).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, NoReturn, Sequence

from nsq_spark._addresses import Address
from nsq_spark.config import ConnectionConfig
from nsq_spark._sync_conn import SyncConnection
from nsq_spark.errors import ConnectError, NSQTimeoutError, is_transient

from .health import NsqdHealth
from .._retry import RetryPolicy
from .stats import PublishStats

__all__ = ["BlockingPool"]


class BlockingPool:
    """Blocking connections to each nsqd, shared by the callers' threads.

    Args:
        addresses: ``{"host:port": Address}`` in the configured order.
        config: connection options.
        health: the strategy order and each nsqd's backoff (shared with the other pool).
        connections_per_nsqd: sockets per nsqd the threads share.
        retry: the retry policy (its ``max_tries`` bounds the attempts).
        stats: counters.
        stopped: True once the owner closes (ends retrying).
        timeout: seconds one ``command`` may take in all, retries included (None: bounded
            by the retry policy and ``response_timeout`` per attempt only).
    """

    def __init__(self, addresses: dict[str, Address], config: ConnectionConfig, *,
                 health: NsqdHealth, connections_per_nsqd: int, retry: RetryPolicy,
                 stats: PublishStats, stopped: Callable[[], bool],
                 timeout: float | None = None) -> None:
        self.addresses = addresses
        self.order = list(addresses)
        self.config = config
        self.health = health
        self.connections_per_nsqd = connections_per_nsqd
        self.retry = retry
        self.stats = stats
        self.stopped = stopped
        self.timeout = timeout
        self._lock = threading.Lock()
        self._slots: dict[str, list[SyncConnection]] = {}

    def command(self, data: bytes) -> bytes:
        """Send one encoded command and return nsqd's answer, retrying transient
        failures; the exception of the last attempt otherwise (counted in ``errors``), or
        NSQTimeoutError once ``timeout`` has passed."""
        order: list[str] | None = self.health.order()
        assert order is not None
        ready = self._ready(order)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        max_tries = self.retry.max_tries
        tries = max_tries
        if ready is not None:
            key, conn = ready
            try:
                result = conn.command(data, deadline)
                self.stats.acked(data, key)
                return result
            except Exception as exc:
                if not is_transient(exc) or max_tries == 1 or self.stopped() \
                        or self._expired(deadline):
                    self.stats.failed(data)
                    self._raise_final(exc, deadline)
                tries = None if max_tries is None else max_tries - 1
                self.stats.retried()
        try:
            for attempt in self.retry.retrying(tries=tries, stopped=self.stopped,
                                               on_retry=self._on_retry, deadline=deadline):
                with attempt:
                    first, order = order, None  # later attempts start over in strategy order
                    key, conn = self._get(first, deadline)
                    result = conn.command(data, deadline)
        except Exception as exc:
            self.stats.failed(data)
            self._raise_final(exc, deadline)
        except BaseException:
            self.stats.failed(data)
            raise
        self.stats.acked(data, key)
        return result

    def send_to(self, key: str, datas: Sequence[bytes], deadline: float | None) -> None:
        """Send ``datas`` (encoded commands, in order) to the one nsqd ``key``, for a
        replicated publish: connecting if needed, and reconnecting once when a connection
        that was already open turns out broken (nsqd restarted meanwhile). No other nsqd,
        no backoff waits: the replica planner substitutes another nsqd instead. Raises
        the failure (the nsqd's health is updated); ``deadline`` (``time.monotonic()``)
        bounds it all."""
        if self._expired(deadline):   # our time is up: says nothing about that nsqd
            raise NSQTimeoutError(f"publish did not complete within publish_timeout="
                                  f"{self.timeout}s: no time left to send to {key}")
        conn = self._slot(key)
        # an open, fresh connection needs no locks to check (ensure_open takes both)
        fresh = self._open(key, conn, deadline) if conn.closed or conn.stale else False
        for data in datas:
            try:
                conn.command(data, deadline)
            except Exception as exc:
                if fresh or not is_transient(exc) or self.stopped() \
                        or self._expired(deadline):
                    if is_transient(exc):
                        self.health.connection_lost(key, exc)
                    raise
                fresh = self._open(key, conn, deadline)   # once: now it is fresh
                self.stats.retried()
                conn.command(data, deadline)
            self.stats.acked(data, key)

    def _open(self, key: str, conn: SyncConnection, deadline: float | None) -> bool:
        """Open ``conn`` if needed; True if this call connected it."""
        connecting = conn.closed or conn.stale
        try:
            conn.ensure_open(deadline)
        except Exception as exc:
            self.health.connect_failed(key, exc)
            raise
        if connecting:
            self.health.connected(key)
        return connecting

    @staticmethod
    def _expired(deadline: float | None) -> bool:
        return deadline is not None and time.monotonic() >= deadline

    def _raise_final(self, exc: Exception, deadline: float | None) -> NoReturn:
        """Raise ``exc``, or the NSQTimeoutError naming publish_timeout when the call's time
        ran out while the failure was still transient."""
        if is_transient(exc) and self._expired(deadline):
            raise NSQTimeoutError(f"publish did not complete within publish_timeout="
                                  f"{self.timeout}s (raise publish_timeout to wait longer); "
                                  f"last failure: {exc}") from exc
        raise exc

    def _on_retry(self, _: Any) -> None:
        self.stats.retried()

    def _slot(self, key: str) -> SyncConnection:
        slots = self._slots.get(key)
        if slots is None:
            with self._lock:
                slots = self._slots.get(key)
                if slots is None:
                    host, port = self.addresses[key]
                    slots = [SyncConnection(host, port, self.config)
                             for _ in range(self.connections_per_nsqd)]
                    self._slots[key] = slots
        return slots[threading.get_ident() % len(slots)]

    def _ready(self, order: list[str]) -> tuple[str, SyncConnection] | None:
        """The fast path: this thread's open connection to the first nsqd in order that
        is not backing off."""
        for key in order:
            if self.health.backing_off(key):
                continue
            conn = self._slot(key)
            if not conn.closed and not conn.stale:
                return key, conn
            return None  # needs (re)connecting: the slow path does that
        return None

    def _get(self, order: list[str] | None = None, deadline: float | None = None
             ) -> tuple[str, SyncConnection]:
        """An open connection, connecting as needed, in strategy order; ConnectError with
        every cause when none can be opened."""
        health = self.health
        errors: list[BaseException] = []
        for key in health.candidates(health.order() if order is None else order):
            conn = self._slot(key)
            # only a connect that happened now says nsqd is up: an open connection may
            # be the one the other pool just saw break
            connecting = conn.closed or conn.stale
            try:
                conn.ensure_open(deadline)
            except Exception as exc:  # noqa: BLE001 - collected, reported together
                health.connect_failed(key, exc)
                if not is_transient(exc):
                    raise
                errors.append(exc)
                continue
            if connecting:
                health.connected(key)
            return key, conn
        detail = "; ".join(str(e) for e in errors)
        raise ConnectError(f"no nsqd reachable among {self.order}: {detail}")

    def connected(self) -> set[str]:
        """The nsqd with at least one open blocking connection."""
        return {a for a, slots in list(self._slots.items()) if any(not c.closed for c in slots)}

    def close(self) -> None:
        with self._lock:
            slots, self._slots = self._slots, {}
        for conns in slots.values():
            for c in conns:
                c.close()
