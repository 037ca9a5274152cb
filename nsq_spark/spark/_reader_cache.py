"""Connected Readers kept in Spark's Python worker between micro-batches (the executor
side's counterpart of Kafka's ``spark.kafka.consumer.cache.*``).

A fetch task that opens its own Reader pays for connect + IDENTIFY + SUB + the first
message (25-30 ms here), and for ``close`` (22 ms) at its end, every micro-batch. Spark
reuses its Python workers (``spark.python.worker.reuse``, on by default), so the next
task of the query in this process takes the Reader the last one left here, still
subscribed, with RDY 0.

The rules:

* **One task at a time.** A task *takes* the Reader out of the cache (:meth:`take`);
  nothing else can see it until the task gives it back (:meth:`give_back`) at its end,
  paused (RDY 0). A task that fails closes its Reader instead (:meth:`discard`): close
  requeues whatever it holds.
* **Keyed** by what makes the connection: addresses, topic, channel, the connection
  options (TLS, AUTH, compression, msg_timeout ...) and max_in_flight (:func:`cache_key`),
  not the partition index: the next task of the query in this worker takes it, whichever
  partition it fetches. Two queries on one channel share nothing.
* **Held messages cannot outlive nsqd's msg_timeout unnoticed.** A paused Reader may
  hold messages nsqd sent before it saw RDY 0 (un-FINished, in flight on nsqd): the
  next task takes them first. A Reader idle in the cache longer than its idle timeout
  is closed -- by a daemon thread, and again at :meth:`take` -- and close requeues them.
  The idle timeout is ``readerCacheIdleTimeout`` (the options refuse more than half the
  msg_timeout the options ask for, nsqd's default 60 s unless ``msgTimeout`` says
  otherwise; the default, 5 s, is lowered to that half), and at most half the shortest
  msg_timeout the Reader's connections actually negotiated with nsqd
  (:func:`idle_timeout_within`: an nsqd started with ``--msg-timeout=4s`` answers
  IDENTIFY with 4 s whatever was assumed; a 20 s idle timeout there let nsqd time out
  14,351 held messages in a tester's run). An executor that dies closes its sockets
  with it, but nsqd does not requeue what a closed connection held (seen here: 50 of 50
  stayed in flight after a SIGKILL): they are redelivered after ``msg_timeout``, never
  lost, and never FINished without being spooled first.
* **Closed at worker exit** (``atexit``; a worker killed outright closes its sockets by
  dying, with the same effect). A forked child never uses its parent's Readers (their
  IO threads did not survive the fork): the cache notices the pid change and forgets
  them without closing them.

The cache is generic over what it holds (:class:`Pausable`), so unit tests give it
stand-ins checked by mypy (``tests/spark/stand_in_reader.py``, run through ``mypy
--strict`` by ``tests/test_typing.py``); it reads the clock through ``clock``.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, Iterable, Protocol, TypeVar
from .._log import get_logger

log = get_logger(__name__)

__all__ = ["CachedReaders", "Pausable", "cache_key", "readers"]


class Pausable(Protocol):
    """What the cache needs of a Reader."""

    def set_max_in_flight(self, max_in_flight: int) -> None: ...

    def close(self) -> Any: ...


R = TypeVar("R", bound=Pausable)

# Seconds between the sweeper's looks, at most (it looks sooner for shorter timeouts).
SWEEP_EVERY = 1.0


@dataclass
class _Idle(Generic[R]):
    reader: R
    since: float
    idle_timeout: float


class CachedReaders(Generic[R]):
    """Readers by key, each either taken by one task or idle here (module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 sweeper: bool = True) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._idle: dict[Hashable, _Idle[R]] = {}
        self._pid = os.getpid()
        self._sweeper = sweeper
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.reused = self.created = self.expired = 0  # counters for logs and tests

    def take(self, key: Hashable, make: Callable[[], R]) -> tuple[R, bool]:
        """The idle Reader of ``key`` (True), or a new one from ``make`` (False). An
        idle one past its timeout is closed instead of reused."""
        self._forget_after_fork()
        with self._lock:
            entry = self._idle.pop(key, None)
        if entry is not None:
            if self._clock() - entry.since < entry.idle_timeout:
                self.reused += 1
                return entry.reader, True
            self._close(entry.reader, "idle past its timeout")
            self.expired += 1
        self.created += 1
        return make(), False

    def give_back(self, key: Hashable, reader: R, idle_timeout: float) -> None:
        """The task is done with ``reader``: pause it (RDY 0) and keep it for the next
        task of ``key`` for up to ``idle_timeout`` seconds."""
        reader.set_max_in_flight(0)
        self._forget_after_fork()
        with self._lock:
            old = self._idle.pop(key, None)
            self._idle[key] = _Idle(reader, self._clock(), idle_timeout)
        if old is not None and old.reader is not reader:  # pragma: no cover - one task
            self._close(old.reader, "replaced")           # per key at a time
        if self._sweeper:
            self._ensure_sweeper()
        self._wake.set()

    def discard(self, reader: R) -> None:
        """A task that failed: close its Reader (which requeues what it holds)."""
        self._close(reader, "its task failed")

    def sweep(self) -> int:
        """Close the Readers idle past their timeout; how many."""
        now = self._clock()
        with self._lock:
            old = [k for k, e in self._idle.items() if now - e.since >= e.idle_timeout]
            gone = [self._idle.pop(k) for k in old]
        for e in gone:
            self._close(e.reader, "idle past its timeout")
        self.expired += len(gone)
        return len(gone)

    def close_all(self) -> None:
        with self._lock:
            gone = list(self._idle.values())
            self._idle.clear()
        for e in gone:
            self._close(e.reader, "worker exit")

    def __len__(self) -> int:
        return len(self._idle)

    def next_expiry(self) -> float | None:
        """Seconds until the next idle Reader expires (None: none is idle)."""
        with self._lock:
            if not self._idle:
                return None
            now = self._clock()
            return max(0.0, min(e.since + e.idle_timeout - now for e in self._idle.values()))

    # -- internals ------------------------------------------------------------------------

    def _close(self, reader: R, why: str) -> None:
        try:
            reader.close()
        except Exception as exc:  # a broken Reader must not fail the next task
            log.warning("closing a cached Reader (%s) failed: %s", why, exc)
        else:
            log.debug("cached Reader closed (%s)", why)

    def _forget_after_fork(self) -> None:
        if os.getpid() != self._pid:
            with self._lock:
                self._idle.clear()
            self._pid = os.getpid()
            self._thread = None
            self._wake = threading.Event()

    def _ensure_sweeper(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._sweep_loop, daemon=True,
                                        name="nsq-spark-reader-cache")
        self._thread.start()

    def _sweep_loop(self) -> None:
        while True:
            wait = self.next_expiry()
            self._wake.wait(SWEEP_EVERY if wait is None else min(wait + 0.01, SWEEP_EVERY))
            self._wake.clear()
            try:
                self.sweep()
            except Exception:  # pragma: no cover - keep sweeping
                log.exception("reader cache sweep failed")


def idle_timeout_within(configured: float, negotiated_ms: Iterable[Any], share: float
                        ) -> float:
    """How long a cached Reader may stay idle: ``configured``, at most ``share`` of the
    shortest msg_timeout its connections negotiated (``negotiated_ms``: nsqd's IDENTIFY
    answers in ms; None for a connection without one yet is skipped). ``share``: the
    options' (``READER_CACHE_SHARE_OF_MSG_TIMEOUT``), the one rule for both bounds."""
    known = [float(ms) / 1000.0 for ms in negotiated_ms if ms]
    return min([configured, *(t * share for t in known)])


def cache_key(opts: Any, topic: str) -> tuple[Any, ...]:
    """What makes a Reader's connection: addresses, topic, channel, the connection
    options, max_in_flight. Not the partition index: any task of the query that runs in
    this worker next takes the Reader, whichever partition it fetches (nothing a paused
    Reader holds is spooled yet, so it belongs to no partition), and so the messages it
    holds reach the next batch even when Spark runs that partition on another worker."""
    conn = json.dumps(opts.connection, sort_keys=True, default=repr)
    return (tuple(opts.nsqd_tcp_addresses), tuple(opts.lookupd_http_addresses), topic,
            opts.channel, conn, opts.max_in_flight)


_READERS: CachedReaders[Any] | None = None
_READERS_LOCK = threading.Lock()


def readers() -> CachedReaders[Any]:
    """This Python worker's cache (created at first use, closed at exit)."""
    global _READERS
    with _READERS_LOCK:
        if _READERS is None:
            _READERS = CachedReaders()
            atexit.register(_READERS.close_all)
        return _READERS
