"""Executor side of the ``nsq`` source: fetch with the full Reader, spool, FIN, hand over.

Runs inside Spark's Python worker. The Reader hands out MessageBlocks (the bytes received
and the frame offsets, no object per message), which become Arrow columns in C
(:func:`~nsq_spark.spark.schema.blocks_to_batch`) and are FINished by the block; only the
``dedup`` option turns them into Message objects, to look their keys up.

``fetch_stream_partition`` implements the spool protocol described in
:mod:`nsq_spark.spark.spool`; ``fetch_batch_partition`` is the batch read (no spool: a
chunk is FINished once Spark has taken it).

Speculative execution is refused (:func:`check_speculation_off`): a losing attempt
FINishes messages whose rows Spark throws away. The check runs in the fetch task, before
it connects to nsqd, because that is where the setting can be seen: Spark SQL hands its
``spark.*`` settings to tasks as local properties, while the driver-side Python process
of a data source sees no Spark configuration at all (pyspark 4.3: no ``TaskContext``,
nothing in its environment). So a query with ``spark.speculation=true`` fails at its
first batch, having read nothing.

Fencing (whatever the setting): an attempt that outlives its batch (committed, spool
deleted) or whose partition another attempt sealed FINishes nothing more and writes
nothing more; it requeues what it holds and fails (:class:`~.spool.SpoolFenced`). The
checks and their ordering are in :mod:`nsq_spark.spark.spool`.

Timings (seconds spent fetching, writing the spool, and handing batches to Spark) are
logged at INFO per task and kept in ``last_task_timings`` for the benchmark.

Causes reach the driver: Spark shows the driver a task's error, not the executor's log,
so a task that subscribed nowhere fails with each nsqd's last answer in its message
(``Reader.stats()["connect_errors"]``): :class:`~nsq_spark.errors.SubscribeRefusedError`
at once when every nsqd refused for a reason no retry fixes (AUTH, TLS), otherwise, after
the first wait, :class:`~nsq_spark.errors.ConnectError` for a batch read and a WARNING
for a streaming task (an nsqd that is down is transient there: the driver reports it and
the next trigger tries again). A ``dedup`` store that fails is a
:class:`~nsq_spark.errors.DedupStoreError` naming the option, the store without its
password, and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .options import ReadOptions
from .schema import blocks_to_batch, messages_to_batch
from .seen import Redeliveries
from .spool import FLUSH_INTERVAL, PartitionSpool, Spool, SpoolConflict, SpoolFenced

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from nsq_spark.message import Message
    from nsq_spark.protocol import MessageBlock

log = logging.getLogger(__name__)

# Filled by every fetch task of this process: {"fetch": s, "spool": s, "handover": s,
# "rows": n, "replayed": n}; the benchmark reads it through a side channel.
last_task_timings: dict[str, float] = {}

ReaderFactory = Callable[[ReadOptions], Any]

# Seconds a fetch task waits for its first message when the driver saw a backlog.
FIRST_WAIT = 5.0

# Settled chunks are handed to Spark together once they hold this many rows (or bytes),
# and at the end of the task.
HANDOVER_ROWS = 10_000
HANDOVER_BYTES = 8 << 20

# Seconds get_batch waits while a chunk is in the writer thread, so that its FIN goes out
# soon after it is durable.
WRITER_POLL = 0.002


def default_reader_factory(opts: ReadOptions) -> Any:
    """A pull-mode ``nsq_spark.Reader`` for the options (no message handler): the fetch
    functions use its block API (``get_blocks``, ``finish_blocks``, ``requeue_blocks``)."""
    from nsq_spark.reader import Reader

    return Reader(**opts.reader_kwargs())


class _Timer:
    # fetch: Reader connect/get_blocks/FIN/close; convert: blocks -> Arrow batch;
    # spool: waiting for a chunk to be durable (critical path); spool_write: the writer
    # thread's time (Arrow IPC encode, write, fsync; overlaps fetching); handover: Spark
    # taking the batch from the generator; dedup: shared-store round trips; open/close:
    # the parts of fetch spent creating the Reader and closing it (requeue of the rest);
    # seen: loading the redelivery index and checking ids; redelivered: rows dropped.
    __slots__ = ("fetch", "convert", "spool", "spool_write", "handover", "dedup", "open",
                 "close", "seen", "rows", "replayed", "redelivered", "_started", "_cpu")

    def __init__(self) -> None:
        self.fetch = self.convert = self.spool = self.spool_write = 0.0
        self.handover = self.dedup = self.open = self.close = self.seen = 0.0
        self.rows = self.replayed = self.redelivered = 0
        self._started = time.time()
        self._cpu = time.process_time()  # a Python worker runs one task at a time

    def publish(self) -> None:
        last_task_timings.clear()
        last_task_timings.update({k: getattr(self, k) for k in self.__slots__
                                  if not k.startswith("_")})
        last_task_timings.update(t_start=self._started, t_end=time.time(),
                                 cpu=time.process_time() - self._cpu)
        out = os.environ.get("NSQ_SPARK_TIMINGS_DIR")
        if out:  # the benchmark's side channel (executors are other processes)
            with open(os.path.join(out, f"{uuid.uuid4().hex}.json"), "w") as f:
                json.dump(last_task_timings, f)


class _Dedup:
    """The ``dedup`` option at fetch time, ordered so that it can only ever let a
    duplicate through, never lose a message:

    1. candidates are checked against the shared store -- checked, not marked: a key that
       was absent is erased again right away. With the default key (the message ``id``)
       only messages delivered before (``attempts > 1``) can be redeliveries, so only those
       cost a round trip; with ``key=body`` every message is checked;
    2. the survivors are spooled and FINished; the seen ones are FINished without spooling;
    3. only then are the survivors' keys marked as seen (one pipelined round trip).

    A crash between 2 and 3 lets a later redelivery through (a duplicate); nothing is
    marked seen before it is durable, so nothing is dropped that was not delivered.
    """

    def __init__(self, spec: str) -> None:
        from nsq_spark.dedup import by_message_id, cached_from_spec

        self.spec = spec
        self.store = cached_from_spec(spec)
        self.key = getattr(self.store, "key_func", None) or by_message_id
        self.by_id = self.key is by_message_id

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A store round trip; a failure becomes a DedupStoreError naming the option and
        the fix (the raw error of a redis client names neither)."""
        try:
            return fn(*args)
        except Exception as exc:
            raise dedup_store_error(self.spec, exc) from exc

    def split(self, messages: list["Message"]) -> tuple[list["Message"], list["Message"]]:
        from nsq_spark.dedup import check_and_set_many, erase_many

        key = self.key
        cands = [m for m in messages if m.attempts > 1] if self.by_id else messages
        if not cands:
            return messages, []
        keys = [key(m) for m in cands]
        flags = self._call(check_and_set_many, self.store, keys)
        self._call(erase_many, self.store, [k for k, seen in zip(keys, flags) if not seen])
        seen = {id(m) for m, f in zip(cands, flags) if f}
        if not seen:
            return messages, []
        return ([m for m in messages if id(m) not in seen],
                [m for m in messages if id(m) in seen])

    def batch(self, blocks: list["MessageBlock"], topic: str, channel: str
              ) -> tuple["pa.RecordBatch", list["Message"], list["Message"]]:
        """The record batch of the messages of ``blocks`` not seen before; the kept and
        the dropped messages."""
        keep, drop = self.split([m for b in blocks for m in b.messages()])
        return messages_to_batch(keep, topic, channel), keep, drop

    def mark(self, messages: list["Message"]) -> None:
        from nsq_spark.dedup import check_and_set_many

        if messages:
            self._call(check_and_set_many, self.store, [self.key(m) for m in messages])


def dedup_store_error(spec: str, exc: BaseException) -> Exception:
    """The ``dedup`` option's store failed: a DedupStoreError that names the option, the
    store with its password hidden, this host, the cause and the fix."""
    from urllib.parse import urlsplit

    from nsq_spark.errors import DedupStoreError
    from nsq_spark.validate import redact_url

    cause = f"{type(exc).__name__}: {exc}"
    try:
        password = urlsplit(spec).password
    except ValueError:
        password = None
    if password:  # a client may echo its connection arguments
        cause = cause.replace(password, "***")
    return DedupStoreError(
        f"option 'dedup' ({redact_url(spec)}): the deduplication store failed from host "
        f"{os.uname().nodename}: {cause}; check that it runs and is reachable from every "
        "executor (address, port, password), or remove the option 'dedup'")


def _concat(pa: Any, batches: list) -> "pa.RecordBatch":
    if hasattr(pa, "concat_batches"):  # pyarrow >= 19
        return pa.concat_batches(batches)
    table = pa.Table.from_batches(batches).combine_chunks()
    return (table.to_batches() or [batches[0].slice(0, 0)])[0]


def check_dedup_spec(spec: str) -> None:
    """At query start: the spec must build a store shared by all executors."""
    from nsq_spark.dedup import from_spec

    from .options import NSQOptionError

    try:
        store = from_spec(spec)
    except Exception as exc:
        raise NSQOptionError(f"option 'dedup': {exc}") from exc
    if not getattr(store, "shared", False):
        raise NSQOptionError(
            f"option 'dedup': {spec!r} lives inside one process; Spark tasks run in many, so "
            "use a shared store (redis://host:port/0?ttl=..., memcached://host:port?ttl=...)")


def check_speculation_off() -> None:
    """In a Spark task: refuse ``spark.speculation=true`` (NSQOptionError naming it).

    Two attempts of one fetch task both FINish what they fetch, and Spark keeps the rows
    of one: the other's messages are gone from nsqd and from the result (testers lost
    7,000-12,000 of 200,000 in every run). Spark SQL propagates its ``spark.*`` settings
    to tasks as local properties; outside a Spark task there is nothing to check."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - called from Spark only
        return
    ctx = TaskContext.get()
    if ctx is None:
        return
    value = ctx.getLocalProperty("spark.speculation")
    if value is not None and value.strip().lower() == "true":
        from .options import NSQOptionError

        raise NSQOptionError(
            "spark.speculation=true is not supported by the nsq source: a speculative "
            "copy of a fetch task FINishes messages on nsqd whose rows Spark discards, "
            "so they would be lost. Set spark.speculation=false (Spark's default) for "
            "this application, e.g. --conf spark.speculation=false")


def fetch_stream_partition(opts: ReadOptions, spool: Spool, batch: int, index: int,
                           share: int | None,
                           reader_factory: ReaderFactory = default_reader_factory,
                           marker: str | None = None,
                           ) -> Iterator["pa.RecordBatch"]:
    """Rows of micro-batch ``batch``, partition ``index``: replayed or fetched.

    ``share`` is this partition's target (None: until idle or maxFetchPeriod); what the
    task holds when it reaches it is spooled too, so it may end a little above. ``marker``
    is the driver's shared-spool marker: a task that cannot see it fails (SpoolError).
    """
    check_speculation_off()
    if marker is not None:
        spool.check_marker(batch, marker)
    timer = _Timer()
    part = spool.partition(batch, index, marker)
    done = part.completion()
    if done is not None:
        log.info("batch %d part %d: replaying %d spooled chunks (%d rows)",
                 batch, index, done.chunks, done.rows)
        for rb in part.replay(done.chunks):
            timer.replayed += rb.num_rows
            yield rb
        timer.publish()
        return
    # nsqd's redeliveries of what is spooled are dropped (see .seen); loaded only when
    # this task fetches
    t = time.perf_counter()
    gate = Redeliveries(spool, batch, index) if opts.redelivery_window > 0 else None
    timer.seen += time.perf_counter() - t
    # an earlier attempt may have died part-way: its chunks are FINished, so they are
    # part of this partition's result; continue after them
    have = part.chunk_count()
    rows = 0
    for k in range(have):
        try:
            batches = part.read_chunk(k)
        except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
            log.warning("batch %d part %d: chunk %d is torn (%s); discarding it", batch,
                        index, k, exc)
            have = k
            break
        for rb in batches:
            rows += rb.num_rows
            if gate is not None:
                gate.remember(rb)
            yield rb
    # a torn chunk, or chunks after a gap (several writers), were never FINished
    part.discard_from(have)
    timer.replayed = rows
    if have:
        log.info("batch %d part %d: resumed after %d chunks (%d rows) of an earlier attempt",
                 batch, index, have, rows)
    if (share is not None and rows >= share) or part.sealed():
        # the share is reached, or another attempt sealed the partition and died
        # before completing it: what is spooled is the result, nothing more is fetched
        yield from _seal_and_complete(part, batch, index, have, rows, gate, timer)
        timer.publish()
        return
    remaining = None if share is None else share - rows
    yield from _fetch_into_spool(opts, part, batch, index, have, rows, remaining,
                                 reader_factory, timer, gate)


def _fetch_into_spool(opts: ReadOptions, part: PartitionSpool, batch: int, index: int,
                      chunk_no: int, rows: int, remaining: int | None,
                      reader_factory: ReaderFactory, timer: _Timer,
                      gate: Redeliveries | None = None,
                      ) -> Iterator["pa.RecordBatch"]:
    """Fetch chunk by chunk. A full chunk goes to a writer thread (Arrow IPC, write,
    fsync) while the next chunk's messages arrive -- that is why a chunk is by default half
    of ``maxInFlight`` --; as soon as it is durable it is FINished (nsqd then refills the
    window). Settled chunks go to Spark in order, joined into record batches of about
    ``HANDOVER_ROWS`` rows (a crash before that loses nothing: they are in the spool).
    Smaller chunks let more of them wait in (as many) writer threads."""
    import pyarrow as pa

    dedup = _Dedup(opts.dedup) if opts.dedup else None
    dead_letters = _DeadLetterSplit(opts, f"batch{batch}-part{index}")
    chunk_size = opts.spool_chunk_size
    target = remaining  # this run's share: nothing more is asked of nsqd than this
    if remaining is not None and remaining < opts.max_in_flight:
        # a small share: take no more in flight than it, so that the other tasks of the
        # batch get their part instead of waiting while this one holds everything
        opts = dataclasses.replace(opts, max_in_flight=remaining)
        chunk_size = min(chunk_size, remaining)
    perf = time.perf_counter
    t0 = perf()
    reader = reader_factory(opts)
    timer.open = perf() - t0
    timer.fetch += timer.open
    # chunks of the in-flight window that may wait in the writers while the next fills
    max_jobs = max(1, opts.max_in_flight // chunk_size - 1)
    writer = ThreadPoolExecutor(max_workers=max_jobs, thread_name_prefix="nsq-spool")

    def write(k: int, rb: "pa.RecordBatch", dead: "pa.RecordBatch | None",
              keys: Any = None) -> None:
        t = perf()
        if dead is not None:
            dead_letters.write(dead)
        part.write_chunk(k, rb)
        if keys is not None:  # the other tasks of the batch check against these
            part.write_chunk_keys(k, keys)
        timer.spool_write += perf() - t

    finished = [0]  # messages FINished by this run
    paused = [False]  # the end was reached: RDY stays 0

    def limit_in_flight(n: int) -> None:
        """Before FINishing ``n`` more: what nsqd may still send is the share less what
        was FINished, so nothing beyond the share arrives to be requeued at the end."""
        if target is None or paused[0]:
            return
        left = max(0, target - finished[0] - n)
        if left < opts.max_in_flight:
            _set_max_in_flight(reader, left)

    def settle(job: tuple) -> Iterator["pa.RecordBatch"]:
        """Chunk durable -> FIN -> hand over."""
        fut, blocks, n, keep, drop, rb = job
        t = perf()
        try:
            fut.result()
            # the fence, after the chunk is durable and before its FIN: a batch already
            # committed, or a partition sealed by another attempt, gets no FIN from here
            reason = part.fenced()
            if reason is not None:
                raise SpoolFenced(f"batch {batch} part {index}: {reason}; this attempt "
                                  "FINishes nothing more")
        except BaseException:
            reader.requeue_blocks(blocks, delay_ms=0)
            raise
        timer.spool += perf() - t
        t = perf()
        limit_in_flight(n)
        reader.finish_blocks(blocks)
        finished[0] += n
        timer.fetch += perf() - t
        if dedup is not None:
            t = perf()
            dedup.mark(keep)
            timer.dedup += perf() - t
            if drop:
                log.info("batch %d part %d: dropped %d redelivered duplicates",
                         batch, index, len(drop))
        timer.rows += n
        held.append(rb)
        held_rows[0] += rb.num_rows
        held_rows[1] += rb.nbytes
        if held_rows[0] >= HANDOVER_ROWS or held_rows[1] >= HANDOVER_BYTES:
            yield from hand_over()

    def hand_over() -> Iterator["pa.RecordBatch"]:
        """Durable and FINished chunks to Spark, as one record batch (fewer, larger
        batches cost Spark less per row than many small ones)."""
        if not held:
            return
        t = perf()
        out = held[0] if len(held) == 1 else _concat(pa, held)
        held.clear()
        held_rows[:] = [0, 0]
        timer.convert += perf() - t
        t = perf()
        yield out
        timer.handover += perf() - t

    held: list = []  # settled chunks not yet handed over
    held_rows = [0, 0]  # their rows, bytes
    jobs: deque = deque()  # chunks in the writers, oldest first
    # a capped share means the driver saw a backlog: the first message may take a
    # lookupd round and a connect to arrive, so the first wait is longer than idleTimeout
    expecting = remaining is not None
    try:
        deadline = time.monotonic() + opts.max_fetch_period
        pending: list[MessageBlock] = []
        pending_n = 0  # messages in pending
        first_at = 0.0
        idle = False
        drained = False
        while True:
            while jobs and jobs[0][0].done():
                # a chunk in the writers is durable: FIN it now, so that nsqd refills the
                # in-flight window while the next chunk is still filling
                yield from settle(jobs.popleft())
            now = time.monotonic()
            want = chunk_size - pending_n
            if remaining is not None:
                want = min(want, remaining - pending_n)
            stop = idle or now >= deadline or (remaining is not None and want <= 0)
            if stop and not drained:
                # take what the Reader still holds (and what nsqd sent before RDY 0) into
                # the last chunk instead of requeueing it on close: the share is a
                # target, and a requeue here would be a redelivery for every task
                drained = paused[0] = True
                got = _drain(reader)
                if got:
                    if not pending:
                        first_at = time.monotonic()
                    pending.extend(got)
                    pending_n += sum(map(len, got))
            if not stop and want > 0 and (not pending or now - first_at < FLUSH_INTERVAL):
                t = perf()
                idle_wait = opts.idle_timeout
                if expecting:  # nsqd reported these messages: allow for discovery+connect
                    idle_wait = max(idle_wait, FIRST_WAIT)
                wait = min(idle_wait, max(0.0, deadline - now))
                if pending:
                    wait = min(wait, max(0.0, first_at + FLUSH_INTERVAL - now))
                if jobs:
                    wait = min(wait, WRITER_POLL)  # come back for the writers soon
                if expecting and not jobs:  # fails at once if every nsqd refused
                    got = _first_blocks(reader, want, wait, opts, f"batch {batch} part {index}")
                else:
                    got = reader.get_blocks(max_messages=want, timeout=wait)
                timer.fetch += perf() - t
                if expecting and not got and wait >= idle_wait:
                    _check_subscribed(reader, opts, batch, index, wait)
                if got:
                    expecting = False
                    if not pending:
                        first_at = time.monotonic()
                    pending.extend(got)
                    pending_n += sum(map(len, got))
                    if pending_n < chunk_size and (remaining is None or pending_n < remaining) \
                            and (jobs or not reader.is_starved()):
                        # else nothing comes until a FIN: nsqd's --max-rdy-count (or
                        # several nsqds) keep the window below maxInFlight
                        continue
                elif jobs and wait == WRITER_POLL:
                    continue  # only polled for the writer: not idle
                elif not pending or wait >= idle_wait:
                    idle = True
                    if not pending:
                        continue
            if not pending:
                if jobs:
                    yield from settle(jobs.popleft())
                    continue
                break
            t = perf()
            if dedup is not None:
                rb, keep, drop = dedup.batch(pending, opts.topic, opts.channel)
            else:
                rb, keep, drop = blocks_to_batch(pending, opts.topic, opts.channel), [], []
            timer.convert += perf() - t
            if gate is not None:  # redeliveries of spooled messages: FINished, not rows
                t = perf()
                rb = gate.keep(rb)
                timer.seen += perf() - t
            t = perf()
            rb, dead = dead_letters.split(rb)
            timer.convert += perf() - t
            while len(jobs) >= max_jobs:  # the window is full: wait for the oldest chunk
                yield from settle(jobs.popleft())
            keys = gate.last_keys if gate is not None and dead is None else None
            jobs.append((writer.submit(write, chunk_no, rb, dead, keys), pending, pending_n,
                         keep, drop, rb))
            chunk_no += 1
            rows += rb.num_rows
            if remaining is not None:
                remaining -= pending_n
            pending = []
            pending_n = 0
        while jobs:
            yield from settle(jobs.popleft())
        yield from hand_over()
        yield from _seal_and_complete(part, batch, index, chunk_no, rows, gate, timer)
    finally:
        writer.shutdown(wait=True)
        t = perf()
        reader.close()  # requeues whatever was pulled and not FINished
        timer.close = perf() - t
        timer.fetch += timer.close
        timer.publish()
        log.info("batch %d part %d: %d rows (%d replayed), %d redeliveries dropped; fetch "
                 "%.3fs convert %.3fs spool wait %.3fs (write %.3fs in the background) "
                 "handover %.3fs dedup %.3fs seen %.3fs", batch, index,
                 timer.rows + timer.replayed, timer.replayed, timer.redelivered, timer.fetch,
                 timer.convert, timer.spool, timer.spool_write, timer.handover, timer.dedup,
                 timer.seen)


def _seal_and_complete(part: PartitionSpool, batch: int, index: int, chunks: int,
                       rows: int, gate: Redeliveries | None, timer: _Timer,
                       ) -> Iterator["pa.RecordBatch"]:
    """Seal the partition, take in the chunks another attempt wrote before the seal (it
    may have FINished them: they must be rows), then the index, then ``_COMPLETE``."""
    part.seal()
    for k, batches in part.chunks_from(chunks):
        log.warning("batch %d part %d: chunk %d was written by another attempt of this "
                    "task before the seal; its rows are taken in", batch, index, k)
        for rb in batches:
            rows += rb.num_rows
            timer.replayed += rb.num_rows
            if gate is not None:
                gate.remember(rb)
            yield rb
        chunks = k + 1
    if gate is not None:
        timer.redelivered = gate.dropped
        gate.finish()  # before _COMPLETE: a complete partition always has its index
    final = part.complete(chunks, rows)
    if final.chunks != chunks:  # pragma: no cover - needs two racing attempts
        raise SpoolConflict(f"batch {batch} part {index}: another attempt completed "
                            f"the partition with {final.chunks} chunks")


def _check_subscribed(reader: Any, opts: ReadOptions, batch: int, index: int,
                      wait: float) -> None:
    """After a first wait in vain for a batch nsqd reported: no subscription for a reason
    no retry fixes (AUTH, TLS) fails the task with the cause; an nsqd that is down is
    transient (the driver reports it; the next trigger tries again), so only logged."""
    causes = _not_subscribed(reader)
    if not causes:
        return
    from nsq_spark.errors import SubscribeRefusedError

    err = not_subscribed_error(opts, f"batch {batch} part {index}", wait, causes)
    if isinstance(err, SubscribeRefusedError):
        raise err
    log.warning("%s; the batch goes on without them", err)


# Seconds the end of a fetch waits for messages nsqd sent before it saw RDY 0 (nsqd
# flushes its output buffer after at most READ_OUTPUT_BUFFER_TIMEOUT, 25 ms).
DRAIN_WAIT = 0.1


def _set_max_in_flight(reader: Any, n: int) -> None:
    if hasattr(reader, "set_max_in_flight"):  # test stand-ins may not have it
        reader.set_max_in_flight(n)


def _drain(reader: Any) -> list:
    """Pause the Reader (RDY 0) and take every block it holds or still receives."""
    out: list = []
    _set_max_in_flight(reader, 0)
    wait = DRAIN_WAIT
    while True:
        got = reader.get_blocks(max_messages=1_000_000, timeout=wait)
        if not got:
            return out
        out.extend(got)
        wait = DRAIN_WAIT / 2


class _DeadLetterSplit:
    """``maxAttempts``: rows delivered more often than it are taken out of the result
    and written to ``deadLetterPath`` (before the FIN), counted and logged."""

    def __init__(self, opts: ReadOptions, label: str) -> None:
        from .spool import DeadLetters

        self.max_attempts = opts.max_attempts
        self.store = (DeadLetters(opts.dead_letter_path)
                      if self.max_attempts and opts.dead_letter_path else None)
        self.label = f"{opts.topic}.{opts.channel}-{label}"
        self.count = 0

    def split(self, rb: "pa.RecordBatch") -> tuple["pa.RecordBatch", "pa.RecordBatch | None"]:
        if not self.max_attempts or rb.num_rows == 0:
            return rb, None
        import pyarrow.compute as pc

        over = pc.greater(rb.column("attempts"), self.max_attempts)
        if not pc.any(over).as_py():
            return rb, None
        return rb.filter(pc.invert(over)), rb.filter(over)

    def write(self, dead: "pa.RecordBatch") -> None:
        if self.store is None:  # pragma: no cover - options require a path
            raise RuntimeError("maxAttempts without a dead-letter path")
        path = self.store.write(dead, self.label)
        self.count += dead.num_rows
        log.warning("%d messages delivered more than maxAttempts=%d times went to the "
                    "dead-letter file %s (ids %s)", dead.num_rows, self.max_attempts, path,
                    dead.column("id").to_pylist()[:10])


def _not_subscribed(reader: Any) -> dict[str, dict[str, Any]] | None:
    """None when the Reader has a subscribed connection (or is a stand-in without stats);
    else the last failure of each nsqd it tried (``Reader.stats()["connect_errors"]``:
    ``{address: {"error": "AuthFailedError: ...", "transient": False}}``), maybe empty."""
    stats = getattr(reader, "stats", None)
    if stats is None:
        return None
    st = stats()
    if any(c.get("state") == "subscribed" for c in st["connections"].values()):
        return None
    return dict(st.get("connect_errors") or {})


# Seconds between looks at the Reader's connections during a first wait.
FIRST_WAIT_SLICE = 0.25


def _first_blocks(reader: Any, want: int, wait: float, opts: ReadOptions, what: str) -> list:
    """``reader.get_blocks`` for up to ``wait`` seconds, in slices; raises
    :func:`not_subscribed_error` for ``what`` as soon as no connection is up or connecting
    and an nsqd refused for a reason no retry fixes (AUTH, TLS): no point waiting out the
    rest."""
    stats = getattr(reader, "stats", None)
    if stats is None:  # a stand-in reader: nothing to look at
        return list(reader.get_blocks(max_messages=want, timeout=wait))
    started = time.monotonic()
    deadline = started + wait
    while True:
        left = deadline - time.monotonic()
        got = reader.get_blocks(max_messages=want,
                                timeout=max(0.0, min(FIRST_WAIT_SLICE, left)))
        if got or left <= FIRST_WAIT_SLICE:
            return list(got)
        st = stats()
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

    where = (f"nsqdTcpAddresses {opts.nsqd_tcp_addresses}" if opts.nsqd_tcp_addresses else
             f"the nsqds lookupdHttpAddresses {opts.lookupd_http_addresses} list")
    head = (f"{what} could not subscribe to {opts.topic}/{opts.channel} on any nsqd of "
            f"{where} within {round(wait, 1):g} s from host {os.uname().nodename}")
    detail = "; ".join(f"nsqd {a}: {c.get('error')}" for a, c in sorted(causes.items()))
    if any(not c.get("transient", True) for c in causes.values()):
        return SubscribeRefusedError(
            f"{head}: {detail}; fix the connection options (authSecret, tlsV1, tlsCaFile, "
            "tlsCertFile, tlsKeyFile, ...) or nsqd's --auth-http-address / TLS setup")
    return ConnectError(f"{head}{': ' + detail if detail else ''}; check that they are "
                        "reachable from the executors")


def fetch_batch_partition(opts: ReadOptions, share: int,
                          reader_factory: ReaderFactory = default_reader_factory,
                          ) -> Iterator["pa.RecordBatch"]:
    """Batch read: up to ``share`` messages or until idle; reading consumes.

    Each chunk is FINished after Spark has taken it from this generator (the next
    ``next()`` call), i.e. at-most-once for the job: a job failing after that point
    does not get them back. Use the streaming source with ``Trigger.AvailableNow`` for a
    replayable read.
    """
    check_speculation_off()
    dedup = _Dedup(opts.dedup) if opts.dedup else None
    dead_letters = _DeadLetterSplit(opts, f"read-{uuid.uuid4().hex[:8]}")
    if share < opts.max_in_flight:
        opts = dataclasses.replace(opts, max_in_flight=share)
    reader = reader_factory(opts)
    try:
        remaining = share
        deadline = time.monotonic() + opts.max_fetch_period
        # idleTimeout means "no message while subscribed": on a loaded machine connecting
        # alone can take longer than a short idleTimeout, so the first wait (which also
        # starts the Reader) is FIRST_WAIT; nothing then and no subscription is an error
        first = True
        while remaining > 0 and time.monotonic() < deadline:
            wait = opts.idle_timeout
            if first:
                wait = max(wait, FIRST_WAIT)
            wait = min(wait, max(0.0, deadline - time.monotonic()))
            want = min(opts.spool_chunk_size, remaining)
            if first:  # fails at once if every nsqd refused
                got = _first_blocks(reader, want, wait, opts, "the batch read")
            else:
                got = reader.get_blocks(max_messages=want, timeout=wait)
            if first and not got:
                causes = _not_subscribed(reader)
                if causes is not None:
                    raise not_subscribed_error(opts, "the batch read", wait, causes)
            first = False
            if not got:
                break
            if dedup is not None:
                rb, keep, _ = dedup.batch(got, opts.topic, opts.channel)
            else:
                rb, keep = blocks_to_batch(got, opts.topic, opts.channel), []
            rb, dead = dead_letters.split(rb)
            if dead is not None:
                dead_letters.write(dead)
            try:
                if rb.num_rows:
                    yield rb
            except GeneratorExit:
                # Spark stopped early (e.g. a LIMIT): give the messages back
                reader.requeue_blocks(got, delay_ms=0)
                raise
            n = sum(map(len, got))
            if remaining - n < opts.max_in_flight:  # ask nsqd for no more than is left
                _set_max_in_flight(reader, max(0, remaining - n))
            reader.finish_blocks(got)
            if dedup is not None:
                dedup.mark(keep)
            remaining -= n
    finally:
        reader.close()
