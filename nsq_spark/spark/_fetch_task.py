"""One streaming fetch task's IO: the Reader, the writer threads, FIN and the hand-over,
driven by the pure :class:`~nsq_spark.spark.chunking.ChunkPlanner`.

:class:`FetchTask` runs steps 3-5 of the spool protocol (:mod:`nsq_spark.spark.spool`)
for one (batch, partition): it asks the planner what to do, does it, and tells the
planner what happened. A full chunk goes to a writer thread (Arrow IPC, write, fsync)
while the next chunk's messages arrive -- that is why a chunk is by default half of
``maxInFlight`` --; as soon as it is durable, and the fence holds, it is FINished (nsqd
then refills the window). Settled chunks go to Spark in order, joined into record
batches of about ``HANDOVER_ROWS`` rows, and at least every ``HEARTBEAT`` seconds: Spark
sees that it cancelled a task only when rows come, and kills the worker of a task that
sends none, leaving what it held in flight on nsqd; while the task waits with no rows,
an empty record batch finds out whether Spark has closed its socket already (a crash
before a hand-over loses nothing: the chunks are in the spool).

What the task needs of a Reader is :class:`ReaderPort` (the Reader's public block API);
where it gets one is a :class:`ReaderLease`: a new Reader closed at the end, or one taken
from and given back to this worker's cache (:mod:`.reader_cache`). The end of a task is
RDY 0 and what the Reader already holds (:mod:`.chunking` says why there is no timed
drain); a task that fails closes its Reader, which requeues what it holds.

Copies of one publish (:mod:`.copies`): a chunk holding publish ids takes its ticket in
the batch's order once it and every chunk before it are durable and the fence holds, and
before its FIN, in a thread of its own (the tickets of one task are taken in chunk
order); the rows that are copies are FINished with the chunk and not handed over.

Timings (seconds fetching, writing, handing over; rows) go to whoever observes them
(:func:`observe_timings`: the benchmark does); they are logged at INFO per task too.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import (TYPE_CHECKING, Any, Callable, Generator, Iterable, Iterator, Protocol,
                    Sequence)

from .._log import get_logger
from ._chunking import Action, ChunkPlanner, body_bytes
from ._copies import CopyOrder, chunk_keep
from ._filters import DeadLetterSplit, Dedup, split_held
from .options import NSQD_MSG_TIMEOUT, READER_CACHE_SHARE_OF_MSG_TIMEOUT, ReadOptions
from ._reader_cache import CachedReaders, cache_key, idle_timeout_within
from ._schema import arrow_schema, blocks_to_batch
from ._seen import Redeliveries
from ._spool import FLUSH_INTERVAL, PartitionSpool, SpoolConflict, SpoolFenced

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from nsq_spark.message import Message
    from nsq_spark.protocol import MessageBlock

# The fetch task's lines keep the logger name they had before the task became its own
# module: users' log configurations filter on it (logs.py documents it).
log = get_logger("nsq_spark.spark.fetch")


class ReaderPort(Protocol):
    """What a fetch task uses of ``nsq_spark.Reader`` (its public block API)."""

    def get_blocks(self, max_messages: int, timeout: float, *,
                   max_bytes: int | None = None) -> list["MessageBlock"]: ...

    def finish_blocks(self, blocks: Iterable["MessageBlock"]) -> None: ...

    def requeue_blocks(self, blocks: Iterable["MessageBlock"],
                       delay_ms: int | None = None, backoff: bool = True) -> None: ...

    def split_blocks(self, blocks: Iterable["MessageBlock"], chosen: Sequence[bool]
                     ) -> tuple[list["MessageBlock"], list["MessageBlock"]]: ...

    def set_max_in_flight(self, max_in_flight: int) -> None: ...

    def is_starved(self) -> bool: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> Any: ...


ReaderFactory = Callable[[ReadOptions], ReaderPort]

# Seconds a fetch task waits for its first message when the driver saw a backlog.
FIRST_WAIT = 5.0
# Seconds between looks at the Reader's connections during a first wait.
FIRST_WAIT_SLICE = 0.25
# Settled chunks are handed to Spark together once they hold this many rows (or bytes),
# and at the end of the task.
HANDOVER_ROWS = 10_000
HANDOVER_BYTES = 8 << 20
# Seconds get_blocks waits while a chunk is in the writer thread, so that its FIN goes
# out soon after it is durable.
WRITER_POLL = 0.002
# The drain at the end takes everything the Reader holds, however many.
DRAIN_ALL = 1_000_000
# Seconds a fetch task goes at most without handing Spark something: the settled rows it
# holds (else every HANDOVER_ROWS), or while it waits with none, an empty record batch.
# Spark's reading thread notices that a task was cancelled (query.stop(), a failed stage)
# only when rows come (an empty batch does not get it there: seen with pyspark 4.3); it
# then closes the worker's socket, the task's next hand-over (the empty batch, at the
# latest) fails, and closing its Reader requeues what it holds. A task that hands nothing
# over is killed with its Python worker (a SIGKILL) 2-4 s after the cancel (Spark's
# monitor polls every 2 s, then waits spark.python.task.killTimeout), and nsqd keeps what
# a killed worker held in flight until its msg_timeout: seen here, 3,600 messages after
# query.stop() during a batch.
HEARTBEAT = 0.5


# -- timings -------------------------------------------------------------------------------

TimingsObserver = Callable[[dict[str, float]], None]
_observers: list[TimingsObserver] = []
_observers_lock = threading.Lock()
# "module:function" of an observer each Python worker installs at its first task (the
# benchmark's executors are other processes; it names its observer here).
OBSERVER_ENV = "NSQ_SPARK_TASK_OBSERVER"
_env_observer_loaded = False


def observe_timings(observer: TimingsObserver) -> Callable[[], None]:
    """Call ``observer`` with each fetch task's timings (:class:`TaskTimings` as a dict)
    in this process; returns the function that removes it."""
    with _observers_lock:
        _observers.append(observer)

    def remove() -> None:
        with _observers_lock:
            if observer in _observers:
                _observers.remove(observer)
    return remove


def _load_env_observer() -> None:
    global _env_observer_loaded
    if _env_observer_loaded:
        return
    _env_observer_loaded = True
    spec = os.environ.get(OBSERVER_ENV)
    if not spec:
        return
    module, _, name = spec.partition(":")
    try:
        observe_timings(getattr(importlib.import_module(module), name))
    except Exception as exc:  # an observer must never fail a task
        log.warning("%s=%r: cannot load the timings observer: %s", OBSERVER_ENV, spec, exc)


class TaskTimings:
    """Seconds and counts of one fetch task. fetch: Reader open/get_blocks/FIN/release;
    convert: blocks -> Arrow batch; spool: waiting for a chunk to be durable (critical
    path); spool_write: the writer thread's time (Arrow IPC encode, write, fsync;
    overlaps fetching); handover: Spark taking the batch from the generator; dedup:
    shared-store round trips; open/close: the parts of fetch spent getting the Reader
    and releasing it (a close requeues the rest; the cache only pauses it); seen:
    loading the redelivery index and checking ids; redelivered: rows dropped; reused: 1
    if the Reader came from the cache; copies: the order of copies (taking tickets, in
    their thread, and deciding; overlaps fetching), copies_wait: the part of it spent
    waiting for other tasks choosing, copies_dropped: rows that were copies.

    Each timed stage has its CPU seconds too (``<stage>_cpu``: the CPU of the thread
    that ran it, :func:`time.thread_time`), so that the task's CPU splits by stage
    (bench/RESULTS.md has the profile): ``main_cpu`` is the task's thread in all (the
    stages it runs, and the loop around them), ``cpu`` the whole process; what is
    neither the task's thread nor the writer and copies threads is the Reader's IO
    thread (``io_cpu``, in :meth:`as_dict`)."""

    STAGES = ("fetch", "convert", "spool", "spool_write", "handover", "dedup", "seen",
              "copies")
    __slots__ = ("fetch", "convert", "spool", "spool_write", "handover", "dedup", "open",
                 "close", "seen", "copies", "copies_wait", "rows", "replayed",
                 "redelivered", "copies_dropped", "reused", "fetch_cpu", "convert_cpu",
                 "spool_cpu", "spool_write_cpu", "handover_cpu", "dedup_cpu", "seen_cpu",
                 "copies_cpu", "_started", "_cpu", "_main_cpu")

    def __init__(self) -> None:
        self.fetch = self.convert = self.spool = self.spool_write = 0.0
        self.handover = self.dedup = self.open = self.close = self.seen = 0.0
        self.copies = self.copies_wait = 0.0
        self.fetch_cpu = self.convert_cpu = self.spool_cpu = self.spool_write_cpu = 0.0
        self.handover_cpu = self.dedup_cpu = self.seen_cpu = self.copies_cpu = 0.0
        self.rows = self.replayed = self.redelivered = self.copies_dropped = self.reused = 0
        self._started = time.time()
        self._cpu = time.process_time()  # a Python worker runs one task at a time
        self._main_cpu = time.thread_time()  # the task's own thread

    @staticmethod
    def start() -> tuple[float, float]:
        """A span's start in the calling thread: (wall, thread CPU)."""
        return time.perf_counter(), time.thread_time()

    def stop(self, stage: str, span: tuple[float, float]) -> float:
        """Add the span since ``span`` (from :meth:`start`, same thread) to ``stage``
        and its CPU; returns the wall seconds."""
        wall = time.perf_counter() - span[0]
        setattr(self, stage, getattr(self, stage) + wall)
        setattr(self, f"{stage}_cpu", getattr(self, f"{stage}_cpu")
                + time.thread_time() - span[1])
        return wall

    def as_dict(self) -> dict[str, float]:
        """Every figure; called in the task's thread (``main_cpu``)."""
        out: dict[str, float] = {k: getattr(self, k) for k in self.__slots__
                                 if not k.startswith("_")}
        cpu = time.process_time() - self._cpu
        main = time.thread_time() - self._main_cpu
        out.update(t_start=self._started, t_end=time.time(), cpu=cpu, main_cpu=main,
                   io_cpu=max(0.0, cpu - main - self.spool_write_cpu - self.copies_cpu))
        return out

    def publish(self) -> None:
        """To the observers (none by default)."""
        _load_env_observer()
        with _observers_lock:
            observers = list(_observers)
        if not observers:
            return
        doc = self.as_dict()
        for observer in observers:
            try:
                observer(doc)
            except Exception as exc:
                log.warning("timings observer %r failed: %s", observer, exc)


# -- where the Reader comes from -------------------------------------------------------------


class ReaderLease:
    """A fetch task's Reader: new (closed at the end), or from this worker's cache
    (given back paused at the end of a task that succeeded; closed if it failed)."""

    def __init__(self, opts: ReadOptions, factory: ReaderFactory,
                 cache: "CachedReaders[ReaderPort] | None") -> None:
        self.opts = opts
        self.factory = factory
        self.cache = cache
        self.key = cache_key(opts, opts.topic) if cache is not None else None
        self.reader: ReaderPort | None = None
        self.reused = False

    def open(self, max_in_flight: int) -> ReaderPort:
        opts = self.opts
        if max_in_flight != opts.max_in_flight:
            opts = dataclasses.replace(opts, max_in_flight=max_in_flight)
        if self.cache is None:
            self.reader = self.factory(opts)
            return self.reader
        reader, self.reused = self.cache.take(self.key, lambda: self.factory(opts))
        if self.reused:
            reader.set_max_in_flight(max_in_flight)  # it was paused (RDY 0)
        self.reader = reader
        return reader

    def release(self, ok: bool) -> None:
        reader, self.reader = self.reader, None
        if reader is None:
            return
        if self.cache is None:
            reader.close()  # requeues whatever was pulled and not FINished
        elif ok:
            self.cache.give_back(self.key, reader, self._idle_timeout(reader))
        else:
            self.cache.discard(reader)

    def _idle_timeout(self, reader: ReaderPort) -> float:
        """``readerCacheIdleTimeout`` (bounded where the options are parsed by the
        msg_timeout they ask for), and at most half the msg_timeout nsqd negotiated with
        the Reader's connections, which an nsqd's ``--msg-timeout`` decides when the
        options ask for none (:mod:`.reader_cache`)."""
        configured = self.opts.reader_cache_idle_timeout
        try:
            conns = reader.stats().get("connections") or {}
        except Exception as exc:  # the configured bound still holds
            log.debug("no stats from the Reader to bound its idle timeout: %s", exc)
            return configured
        idle = idle_timeout_within(configured, (c.get("msg_timeout") for c in conns.values()),
                                   READER_CACHE_SHARE_OF_MSG_TIMEOUT)
        if idle < configured and (configured, idle) not in _lowered:
            _lowered.add((configured, idle))
            log.info("readerCacheIdleTimeout %g s lowered to %g s for this Reader: half the "
                     "msg_timeout its nsqd negotiated", configured, idle)
        return idle


# (configured, lowered) idle timeouts already logged by this worker
_lowered: set[tuple[float, float]] = set()


# -- the task ------------------------------------------------------------------------------


@dataclasses.dataclass
class PartitionTally:
    """What the partition's completion record says of its rows: count, body bytes, the
    nsqd timestamps of the oldest and newest (ns; None without rows); and ``spooled``,
    the rows in its chunks, copies included (what counts against its share: each was a
    message fetched)."""

    rows: int = 0
    spooled: int = 0
    bytes: int = 0
    oldest_timestamp_ns: int | None = None
    newest_timestamp_ns: int | None = None

    def add(self, rb: "pa.RecordBatch") -> None:
        if not rb.num_rows:
            return
        import pyarrow.compute as pc

        self.rows += rb.num_rows
        self.bytes += batch_body_bytes(rb)
        lo_hi = pc.min_max(rb.column("timestamp"))
        lo, hi = lo_hi["min"].value, lo_hi["max"].value  # microseconds (Spark's unit)
        if lo is not None:
            lo, hi = lo * 1000, hi * 1000
            self.oldest_timestamp_ns = lo if self.oldest_timestamp_ns is None \
                else min(self.oldest_timestamp_ns, lo)
            self.newest_timestamp_ns = hi if self.newest_timestamp_ns is None \
                else max(self.newest_timestamp_ns, hi)


def batch_body_bytes(rb: "pa.RecordBatch") -> int:
    """Bytes of the ``body`` column's values (no copy: the offsets' span)."""
    body = rb.column("body")
    if not len(body):
        return 0
    import numpy as np

    offsets = np.frombuffer(body.buffers()[1], dtype=np.int32, count=len(body) + 1,
                            offset=body.offset * 4)
    return int(offsets[-1] - offsets[0])


def blocks_body_bytes(blocks: list["MessageBlock"]) -> int:
    from nsq_spark.protocol import BODY_AT

    return sum(body_bytes(b.offsets, len(b), BODY_AT) for b in blocks)


@dataclasses.dataclass
class _Chunk:
    """A chunk in a writer thread: the blocks to FIN once it is durable, its rows.
    ``future``: done when it is durable, or, for a chunk with publish ids, when it has
    its ticket too (its result: which rows are not copies)."""

    future: "Future[Any]"
    blocks: list["MessageBlock"]
    n: int
    keep: list["Message"]
    drop: list["Message"]
    rb: "pa.RecordBatch"


class FetchTask:
    """Fetch, spool, FIN and hand over the rest of one partition's share (module doc).

    ``chunk_no``/``rows``/``tally``: what earlier attempts left (replayed before this
    runs); ``share``/``byte_share``: what this run may still take (None: no cap)."""

    def __init__(self, opts: ReadOptions, part: PartitionSpool, batch: int, index: int,
                 chunk_no: int, tally: PartitionTally, share: int | None,
                 byte_share: int | None, lease: ReaderLease, timings: TaskTimings,
                 gate: Redeliveries | None = None, order: CopyOrder | None = None) -> None:
        self.opts = opts
        self.part = part
        self.batch = batch
        self.index = index
        self.chunk_no = chunk_no
        self.tally = tally
        self.share = share
        self.byte_share = byte_share
        self.lease = lease
        self.timings = timings
        self.gate = gate
        self.order = order
        self.label = f"batch {batch} part {index}"
        self.dedup = Dedup(opts.dedup, dedup_lease_ms(opts)) if opts.dedup else None
        self.dead_letters = DeadLetterSplit(opts, f"batch{batch}-part{index}")
        self.chunk_size = opts.spool_chunk_size
        self.max_in_flight = opts.max_in_flight
        if share is not None and share < self.max_in_flight:
            # a small share: take no more in flight than it, so that the other tasks of
            # the batch get their part instead of waiting while this one holds everything
            self.max_in_flight = share
            self.chunk_size = min(self.chunk_size, share)
        # chunks of the in-flight window that may wait in the writers while the next fills
        self.max_jobs = max(1, self.max_in_flight // self.chunk_size - 1)
        self.rdy = self.max_in_flight  # the max_in_flight the Reader has now
        self.held: list["pa.RecordBatch"] = []  # settled chunks not yet handed over
        self.held_rows = self.held_bytes = 0
        self.handed_at = time.monotonic()  # the last hand-over to Spark (HEARTBEAT)

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> Iterator["pa.RecordBatch"]:
        tm = self.timings
        span = tm.start()
        # a byte share starts at RDY 1 per nsqd: the bodies' size is not known yet
        # (chunking: RDY follows the byte share), the message share at its cap
        self.rdy = self.max_in_flight if self.byte_share is None else \
            min(self.max_in_flight, max(1, len(self.opts.nsqd_tcp_addresses)))
        reader = self.lease.open(self.rdy)
        tm.open = tm.stop("fetch", span)
        self.timings.reused = int(self.lease.reused)
        writer = ThreadPoolExecutor(max_workers=self.max_jobs, thread_name_prefix="nsq-spool")
        # the tickets of the copies' order: one thread, so that they are taken in order
        self.orderer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nsq-copies")
        ok = False
        try:
            yield from self._loop(reader, writer)
            ok = True
        finally:
            writer.shutdown(wait=True)
            self.orderer.shutdown(wait=True)
            span = tm.start()
            self.lease.release(ok)
            tm.close = tm.stop("fetch", span)
            tm.publish()
            log.info("%s: %d rows (%d replayed), %d redeliveries dropped, %d copies "
                     "dropped, Reader %s; fetch %.3fs convert %.3fs spool wait %.3fs (write "
                     "%.3fs in the background) handover %.3fs dedup %.3fs seen %.3fs "
                     "copies %.3fs", self.label, tm.rows + tm.replayed, tm.replayed,
                     tm.redelivered, tm.copies_dropped, "reused" if tm.reused else "new",
                     tm.fetch, tm.convert, tm.spool, tm.spool_write, tm.handover, tm.dedup,
                     tm.seen, tm.copies)

    def _loop(self, reader: ReaderPort, writer: ThreadPoolExecutor
              ) -> Iterator["pa.RecordBatch"]:
        opts, tm = self.opts, self.timings
        planner = ChunkPlanner(
            now=time.monotonic(), chunk_size=self.chunk_size, max_jobs=self.max_jobs,
            share=self.share, byte_share=self.byte_share, idle_timeout=opts.idle_timeout,
            max_fetch_period=opts.max_fetch_period, flush_interval=FLUSH_INTERVAL,
            first_wait=FIRST_WAIT, writer_poll=WRITER_POLL,
            # a capped share means the driver saw a backlog: the first message may take
            # a lookupd round and a connect to arrive
            expecting=self.share is not None, max_in_flight=self.max_in_flight,
            connections=self._connections(reader))
        pending: list[MessageBlock] = []
        jobs: deque[_Chunk] = deque()
        while True:
            if jobs and jobs[0].future.done():
                planner.oldest_durable = True
            step = planner.next(time.monotonic())
            if step.action is Action.FETCH:
                got = yield from self._take(reader, step, planner.bytes_wanted())
                if step.first and not got and step.timeout >= planner.idle_wait():
                    check_subscribed(reader, opts, self.label, step.timeout)
                n = sum(map(len, got))
                starved = bool(n) and not jobs and reader.is_starved()
                pending.extend(got)
                planner.fetched(n, blocks_body_bytes(got) if n else 0, time.monotonic(),
                                step.timeout, starved)
                if n and self.byte_share is not None:  # RDY follows the byte share
                    self._follow(reader, planner.in_flight_cap())
            elif step.action is Action.DRAIN:
                # the end is decided: RDY 0, and what the Reader already holds goes into
                # the last chunk (the share is a target; a requeue would be a redelivery)
                # -- but no message past a byte share reached: it stays in the Reader
                span = tm.start()
                reader.set_max_in_flight(0)
                self.rdy = 0
                left = planner.bytes_wanted()
                got = [] if left == 0 else reader.get_blocks(
                    max_messages=DRAIN_ALL, timeout=0,
                    **({} if left is None else {"max_bytes": left}))
                tm.stop("fetch", span)
                pending.extend(got)
                planner.drained(sum(map(len, got)), blocks_body_bytes(got) if got else 0,
                                time.monotonic())
            elif step.action is Action.CUT:
                planner.cut()
                jobs.append(self._cut(reader, pending, writer, jobs))
                pending = []
            elif step.action is Action.SETTLE:
                yield from self._settle(reader, jobs.popleft(), planner)
            else:  # FINISH
                break
        yield from self._hand_over()
        yield from seal_and_complete(self.part, self.batch, self.index, self.chunk_no,
                                     self.tally, self.gate, tm,
                                     dead_lettered=self.dead_letters.count, order=self.order)

    # -- the steps ------------------------------------------------------------------------

    def _connections(self, reader: ReaderPort) -> int:
        """nsqd connections a byte share's RDY must reach: the addresses given, else the
        Reader's (a cached one knows them; a new one, none yet: 1)."""
        if self.byte_share is None:
            return 1
        if self.opts.nsqd_tcp_addresses:
            return len(self.opts.nsqd_tcp_addresses)
        return max(1, len(reader.stats().get("connections") or ()))

    def _take(self, reader: ReaderPort, step: Any, max_bytes: int | None
              ) -> Generator["pa.RecordBatch", None, list["MessageBlock"]]:
        """A FETCH: up to ``step.want`` messages (and ``max_bytes`` of bodies) within
        ``step.timeout``, waiting in slices of at most HEARTBEAT with a hand-over to
        Spark between them (the rows held, else an empty batch: see HEARTBEAT)."""
        more: dict[str, Any] = {} if max_bytes is None else {"max_bytes": max(1, max_bytes)}
        deadline = time.monotonic() + step.timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            wait = min(left, HEARTBEAT)
            if wait > WRITER_POLL and self.held:  # a wait: what is settled goes first
                yield from self._hand_over()
            span = self.timings.start()
            if step.first:  # fails at once if every nsqd refused
                got = first_blocks(reader, step.want, wait, self.opts, self.label, **more)
            else:
                got = reader.get_blocks(max_messages=step.want, timeout=wait, **more)
            self.timings.stop("fetch", span)
            if got or wait >= left:
                return got
            span = self.timings.start()
            yield empty_batch()
            self.timings.stop("handover", span)

    def _follow(self, reader: ReaderPort, cap: int | None) -> None:
        """Set max_in_flight to ``cap``: lowered at once, raised only to double or more
        (or to the top), so that a growing byte share sends few RDY commands."""
        if cap is None or cap == self.rdy:
            return
        if self.rdy < cap < 2 * self.rdy and cap < self.max_in_flight:
            return
        reader.set_max_in_flight(cap)
        self.rdy = cap

    def _cut(self, reader: ReaderPort, blocks: list["MessageBlock"],
             writer: ThreadPoolExecutor, jobs: "Iterable[_Chunk]" = ()) -> _Chunk:
        """Convert, filter (duplicates, redeliveries, dead letters) and submit one chunk."""
        tm, gate = self.timings, self.gate
        span = tm.start()
        if self.dedup is not None:
            d = self.dedup.batch(blocks, self.opts.topic, self.opts.channel)
            rb, keep, drop = d.rb, d.keep, d.drop
            # held copies go back to nsqd now: neither spooled nor FINished with the chunk
            blocks = split_held(reader, blocks, d)
        else:
            rb, keep, drop = blocks_to_batch(blocks, self.opts.topic, self.opts.channel), [], []
        tm.stop("convert", span)
        if gate is not None:  # redeliveries of spooled messages: FINished, not rows
            span = tm.start()
            rb = gate.keep(rb)
            tm.stop("seen", span)
        span = tm.start()
        rb, dead = self.dead_letters.split(rb)
        tm.stop("convert", span)
        span = tm.start()
        keys = gate.last_keys if gate is not None and dead is None else None
        future: "Future[Any]" = writer.submit(self._write, self.chunk_no, rb, dead, keys)
        if self.order is not None and _has_publish_ids(rb):
            # its ticket once it and every chunk before it are durable (a chunk with a
            # ticket is never one a retry discards: .copies)
            before = [job.future for job in jobs]
            future = self.orderer.submit(self._take_ticket, self.chunk_no, rb,
                                         [*before, future])
        self.chunk_no += 1
        tm.stop("spool", span)
        return _Chunk(future, blocks, sum(map(len, blocks)), keep, drop, rb)

    def _take_ticket(self, k: int, rb: "pa.RecordBatch", durable: list["Future[Any]"]
                     ) -> "pa.RecordBatch":
        """In the copies' thread: chunk ``k``'s ticket and its rows without the copies."""
        for future in durable:
            future.result()
        assert self.order is not None
        span = self.timings.start()
        waited = self.order.waited
        (out,) = chunk_keep(self.order, k, [rb], replay=False)
        self.timings.stop("copies", span)
        self.timings.copies_wait += self.order.waited - waited
        return out

    def _write(self, k: int, rb: "pa.RecordBatch", dead: "pa.RecordBatch | None",
               keys: Any) -> None:
        """In a writer thread: dead letters, the chunk, its id keys."""
        span = self.timings.start()
        if dead is not None:
            self.dead_letters.write(dead)
        self.part.write_chunk(k, rb)
        if keys is not None:  # the other tasks of the batch check against these
            self.part.write_chunk_keys(k, keys, self.gate.tag if self.gate else None)
        self.timings.stop("spool_write", span)

    def _settle(self, reader: ReaderPort, job: _Chunk, planner: ChunkPlanner
                ) -> Iterator["pa.RecordBatch"]:
        """Chunk durable -> fence -> FIN -> hand over."""
        tm = self.timings
        span = tm.start()
        try:
            rows = job.future.result()  # with a ticket: the rows that are not copies
            # the fence, after the chunk is durable and before its FIN: a batch already
            # committed, or a partition sealed by another attempt, gets no FIN from here
            reason = self.part.fenced()
            if reason is not None:
                raise SpoolFenced(f"{self.label}: {reason}; this attempt FINishes nothing "
                                  "more")
        except BaseException:
            reader.requeue_blocks(job.blocks, delay_ms=0)
            if self.dedup is not None:
                self.dedup.release(job.keep)
            raise
        tm.stop("spool", span)
        span = tm.start()
        # nothing beyond the share arrives to be requeued at the end
        self._follow(reader, planner.in_flight_cap(job.n))
        reader.finish_blocks(job.blocks)
        planner.settled()
        tm.stop("fetch", span)
        if self.dedup is not None:
            span = tm.start()
            self.dedup.commit(job.keep)
            tm.stop("dedup", span)
            if job.drop:
                log.info("%s: dropped %d redelivered duplicates", self.label, len(job.drop))
        rb = job.rb if rows is None else rows
        self.tally.spooled += job.rb.num_rows
        tm.rows += job.n
        self.held.append(rb)
        self.held_rows += rb.num_rows
        self.held_bytes += rb.nbytes
        if self.held_rows >= HANDOVER_ROWS or self.held_bytes >= HANDOVER_BYTES or \
                time.monotonic() - self.handed_at >= HEARTBEAT:
            yield from self._hand_over()

    def _hand_over(self) -> Iterator["pa.RecordBatch"]:
        """Durable and FINished chunks to Spark, as one record batch (fewer, larger
        batches cost Spark less per row than many small ones)."""
        if not self.held:
            return
        tm = self.timings
        span = tm.start()
        out = self.held[0] if len(self.held) == 1 else concat_batches(self.held)
        self.held = []
        self.held_rows = self.held_bytes = 0
        # the partition's counts and timestamps once per hand-over, not per chunk: every
        # settled chunk is handed over before the seal
        self.tally.add(out)
        tm.stop("convert", span)
        span = tm.start()
        yield out
        self.handed_at = time.monotonic()
        tm.stop("handover", span)


def empty_batch() -> "pa.RecordBatch":
    """No rows, the source's schema: what a waiting task with no rows hands Spark
    (HEARTBEAT)."""
    import pyarrow as pa

    return pa.RecordBatch.from_pylist([], schema=arrow_schema())


def dedup_lease_ms(opts: ReadOptions) -> int:
    """The lease of the ``dedup`` option's claims: the connection's message timeout
    (``msgTimeout``), else nsqd's default (60 s) -- a task killed before its chunk is
    durable has its messages redelivered, and its claims ended, after about that."""
    return round(float(opts.connection.get("msg_timeout") or NSQD_MSG_TIMEOUT) * 1000)


def concat_batches(batches: list["pa.RecordBatch"]) -> "pa.RecordBatch":
    import pyarrow as pa

    if hasattr(pa, "concat_batches"):  # pyarrow >= 19
        return pa.concat_batches(batches)
    table = pa.Table.from_batches(batches).combine_chunks()
    return (table.to_batches() or [batches[0].slice(0, 0)])[0]


def _has_publish_ids(rb: "pa.RecordBatch") -> bool:
    col = rb.column("publish_id")
    return bool(col.null_count < len(col))


def seal_and_complete(part: PartitionSpool, batch: int, index: int, chunks: int,
                      tally: PartitionTally, gate: Redeliveries | None,
                      timings: TaskTimings, dead_lettered: int = 0,
                      order: CopyOrder | None = None) -> Iterator["pa.RecordBatch"]:
    """Seal the partition, take in the chunks another attempt wrote before the seal (it
    may have FINished them: they must be rows, less their copies), then the index, then
    ``_COMPLETE`` (with ``dead_lettered``: the rows this attempt wrote to the dead
    letters, and the copies ``order`` found in the partition)."""
    part.seal()
    for k, batches in part.chunks_from(chunks):
        log.warning("batch %d part %d: chunk %d was written by another attempt of this "
                    "task before the seal; its rows are taken in", batch, index, k)
        for rb in batches:
            tally.spooled += rb.num_rows
            if gate is not None:
                gate.remember(rb)
        for rb in chunk_keep(order, k, batches, replay=True):
            tally.add(rb)
            timings.replayed += rb.num_rows
            yield rb
        chunks = k + 1
    if gate is not None:
        timings.redelivered = gate.dropped
        span = timings.start()
        gate.finish()  # before _COMPLETE: a complete partition always has its index
        timings.stop("seen", span)
    if order is not None:
        timings.copies_dropped = order.dropped
    final = part.complete(chunks, tally.rows, bytes=tally.bytes,
                          oldest_timestamp_ns=tally.oldest_timestamp_ns,
                          newest_timestamp_ns=tally.newest_timestamp_ns,
                          redeliveries_dropped=timings.redelivered,
                          dead_lettered=dead_lettered,
                          copies_dropped=timings.copies_dropped)
    if final.chunks != chunks:  # pragma: no cover - needs two racing attempts
        raise SpoolConflict(f"batch {batch} part {index}: another attempt completed "
                            f"the partition with {final.chunks} chunks")


# -- is anything subscribed? ------------------------------------------------------------------


def check_subscribed(reader: ReaderPort, opts: ReadOptions, what: str, wait: float) -> None:
    """After a first wait in vain for a batch nsqd reported: no subscription for a reason
    no retry fixes (AUTH, TLS) fails the task with the cause; an nsqd that is down is
    transient (the driver reports it; the next trigger tries again), so only logged."""
    causes = not_subscribed(reader)
    if not causes:
        return
    from nsq_spark.errors import SubscribeRefusedError

    err = not_subscribed_error(opts, what, wait, causes)
    if isinstance(err, SubscribeRefusedError):
        raise err
    log.warning("%s; the batch goes on without them", err)


def not_subscribed(reader: ReaderPort) -> dict[str, dict[str, Any]] | None:
    """None when the Reader has a subscribed connection; else the last failure of each
    nsqd it tried (``Reader.stats()["connect_errors"]``: ``{address: {"error":
    "AuthFailedError: ...", "transient": False}}``), maybe empty."""
    from nsq_spark._handshake import ConnState

    st = reader.stats()
    if any(c.get("state") == ConnState.SUBSCRIBED for c in st["connections"].values()):
        return None
    return dict(st.get("connect_errors") or {})


def first_blocks(reader: ReaderPort, want: int, wait: float, opts: ReadOptions,
                 what: str, max_bytes: int | None = None) -> list["MessageBlock"]:
    """``reader.get_blocks`` for up to ``wait`` seconds, in slices; raises
    :func:`not_subscribed_error` for ``what`` as soon as no connection is up or connecting
    and an nsqd refused for a reason no retry fixes (AUTH, TLS): no point waiting out the
    rest. ``max_bytes``: passed on (a byte share)."""
    started = time.monotonic()
    deadline = started + wait
    more: dict[str, Any] = {} if max_bytes is None else {"max_bytes": max_bytes}
    while True:
        left = deadline - time.monotonic()
        got = reader.get_blocks(max_messages=want,
                                timeout=max(0.0, min(FIRST_WAIT_SLICE, left)), **more)
        if got or left <= FIRST_WAIT_SLICE:
            return list(got)
        st = reader.stats()
        causes = st.get("connect_errors") or {}
        if not st["connections"] and any(not c.get("transient", True)
                                         for c in causes.values()):
            raise not_subscribed_error(opts, what, time.monotonic() - started, dict(causes))


def not_subscribed_error(opts: ReadOptions, what: str, wait: float,
                         causes: dict[str, dict[str, Any]]) -> Exception:
    """The error of a fetch that subscribed nowhere: each nsqd's cause in the message (the
    driver shows only the task's error, not the executor's log). SubscribeRefusedError
    when a cause is one no retry fixes (AUTH, TLS), else ConnectError."""
    from nsq_spark.errors import ConnectError, SubscribeRefusedError

    from nsq_spark._addresses import strip_userinfo

    shown = [strip_userinfo(a) for a in opts.lookupd_http_addresses]   # never a password
    where = (f"nsqdTcpAddresses {opts.nsqd_tcp_addresses}" if opts.nsqd_tcp_addresses else
             f"the nsqds lookupdHttpAddresses {shown} list")
    head = (f"{what} could not subscribe to {opts.topic}/{opts.channel} on any nsqd of "
            f"{where} within {round(wait, 1):g} s from host {os.uname().nodename}")
    detail = "; ".join(f"nsqd {a}: {c.get('error')}" for a, c in sorted(causes.items()))
    if any(not c.get("transient", True) for c in causes.values()):
        return SubscribeRefusedError(
            f"{head}: {detail}; fix the connection options (authSecret, tlsV1, tlsCaFile, "
            "tlsCertFile, tlsKeyFile, ...) or nsqd's --auth-http-address / TLS setup")
    return ConnectError(f"{head}{': ' + detail if detail else ''}; check that they are "
                        "reachable from the executors")
