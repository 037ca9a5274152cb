"""Executor side of the ``nsq`` source: fetch with the full Reader, spool, FIN, hand over.

Runs inside Spark's Python worker. The Reader hands out MessageBlocks (the bytes received
and the frame offsets, no object per message), which become Arrow columns in C
(:func:`~nsq_spark.spark._schema.blocks_to_batch`) and are FINished by the block; only the
``dedup`` option turns them into Message objects, to look their keys up.

``fetch_stream_partition`` implements the spool protocol described in
:mod:`nsq_spark.spark._spool`; ``fetch_batch_partition`` is the batch read (no spool: a
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
checks and their ordering are in :mod:`nsq_spark.spark._spool`.

The parts: :mod:`.chunking` decides (cut, wait, drain, settle, stop; no IO),
:class:`~.fetch_task.FetchTask` drives it with a Reader (:class:`~.fetch_task.ReaderPort`)
from a :class:`~.fetch_task.ReaderLease` -- new, or from this worker's cache
(:mod:`.reader_cache`, option ``readerCache``) --, :mod:`.filters` keeps duplicates and
dead letters out of the rows. Timings (seconds spent fetching, writing the spool, and
handing batches to Spark) are logged at INFO per task and go to the observers of
:func:`~.fetch_task.observe_timings` (the benchmark installs one).

``topic`` (default the ``topic`` option) is the topic a partition fetches: its rows carry
it and the Reader cache keys on it; ``max_bytes`` caps the body bytes a partition takes:
no message is taken past the one whose body reaches it (:mod:`.chunking`).

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
import time
import uuid
from typing import TYPE_CHECKING, Iterator

from .._log import get_logger
from ._fetch_task import (FIRST_WAIT, FetchTask, PartitionTally, ReaderFactory, ReaderLease,
                         ReaderPort, TaskTimings, blocks_body_bytes, dedup_lease_ms,
                         first_blocks, not_subscribed, not_subscribed_error, observe_timings,
                         seal_and_complete)
from ._filters import DeadLetterSplit, Dedup, check_dedup_spec, dedup_store_error, split_held
from .options import ReadOptions
from ._reader_cache import CachedReaders, readers
from ._copies import CopyOrder, chunk_keep
from ._schema import blocks_to_batch
from ._seen import PID_DTYPE, IdSet, Redeliveries, SeenIndex, topic_tag
from ._spool import PartitionSpool, Spool

if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

    import pyarrow as pa

log = get_logger(__name__)

__all__ = ["FIRST_WAIT", "ReaderFactory", "ReaderPort", "check_dedup_spec",
           "check_speculation_off", "dedup_store_error", "default_reader_factory",
           "fetch_batch_partition", "fetch_stream_partition", "not_subscribed_error",
           "observe_timings"]


def default_reader_factory(opts: ReadOptions) -> ReaderPort:
    """A pull-mode ``nsq_spark.Reader`` for the options (no message handler): the fetch
    functions use its block API (``get_blocks``, ``finish_blocks``, ``requeue_blocks``)."""
    from nsq_spark._consumer.reader import Reader

    return Reader(**opts.reader_kwargs())


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
                           reader_factory: ReaderFactory | None = default_reader_factory,
                           marker: str | None = None, *, topic: str | None = None,
                           max_bytes: int | None = None,
                           reader_cache: "CachedReaders[ReaderPort] | bool | None" = True,
                           ) -> Iterator["pa.RecordBatch"]:
    """Rows of micro-batch ``batch``, partition ``index``: replayed or fetched.

    ``share`` is this partition's target in messages, ``max_bytes`` in body bytes (None:
    until idle or maxFetchPeriod); what the task holds when it reaches its message share
    is spooled too, so it may end a little above; it takes nothing past the message that
    reaches its byte share (:mod:`.chunking`). ``topic``: the topic this partition fetches
    (default ``opts.topic``). ``marker`` is the driver's shared-spool marker: a task that
    cannot see it fails (SparkSpoolError). ``reader_cache``: True (default) uses this
    worker's cache when ``opts.reader_cache`` is on and the factory is the default one;
    a :class:`~.reader_cache.CachedReaders` uses that one; False or None, none.
    """
    check_speculation_off()
    if topic is not None and topic != opts.topic:
        opts = dataclasses.replace(opts, topic=topic)
    if marker is not None:
        spool.check_marker(batch, marker)
    timings = TaskTimings()
    part = spool.partition(batch, index, marker)
    done = part.completion()
    if done is not None:
        log.info("batch %d part %d: replaying %d spooled chunks (%d rows)",
                 batch, index, done.chunks, done.rows)
        # the copies are decided again, as they were (.copies): the same rows
        order = copy_order(opts, spool, part, batch, index, None)
        for k in range(done.chunks):
            for rb in chunk_keep(order, k, part.read_chunk(k), replay=True):
                timings.replayed += rb.num_rows
                yield rb
        timings.publish()
        return
    # nsqd's redeliveries of what is spooled are dropped (see .seen); loaded only when
    # this task fetches
    span = timings.start()
    gate = (Redeliveries(spool, batch, index, opts.topic, pids=opts.drop_copies)
            if opts.redelivery_window > 0 else None)
    timings.stop("seen", span)
    order = copy_order(opts, spool, part, batch, index, gate)
    # an earlier attempt may have died part-way: its chunks are FINished, so they are
    # part of this partition's result; continue after them
    have = part.chunk_count()
    tally = PartitionTally()
    for k in range(have):
        try:
            batches = part.read_chunk(k)
        except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
            log.warning("batch %d part %d: chunk %d is torn (%s); discarding it", batch,
                        index, k, exc)
            have = k
            break
        for rb in batches:
            tally.spooled += rb.num_rows
            if gate is not None:
                gate.remember(rb)
        # its copies as decided when it was spooled; or, if that attempt died before
        # the chunk took its ticket, now (chunks before it are durable: they are here)
        for rb in chunk_keep(order, k, batches, replay=True):
            tally.add(rb)
            yield rb
    # a torn chunk, or chunks after a gap (several writers), were never FINished
    part.discard_from(have)
    timings.replayed = tally.rows
    if have:
        log.info("batch %d part %d: resumed after %d chunks (%d rows) of an earlier attempt",
                 batch, index, have, tally.rows)
    if (share is not None and tally.spooled >= share) \
            or (max_bytes is not None and tally.bytes >= max_bytes) or part.sealed():
        # the share is reached, or another attempt sealed the partition and died
        # before completing it: what is spooled is the result, nothing more is fetched
        yield from seal_and_complete(part, batch, index, have, tally, gate, timings,
                                     order=order)
        timings.publish()
        return
    if reader_factory is None:
        raise ValueError(f"batch {batch} part {index} is not complete in the spool and "
                         "there is no reader_factory to fetch it with")
    cache: CachedReaders[ReaderPort] | None = None
    if isinstance(reader_cache, CachedReaders):
        cache = reader_cache
    elif reader_cache is True and opts.reader_cache \
            and reader_factory is default_reader_factory:
        cache = readers()
    task = FetchTask(opts, part, batch, index, have, tally,
                     None if share is None else share - tally.spooled,
                     None if max_bytes is None else max_bytes - tally.bytes,
                     ReaderLease(opts, reader_factory, cache), timings, gate, order)
    yield from task.run()


def copy_order(opts: ReadOptions, spool: Spool, part: PartitionSpool, batch: int,
               index: int, gate: Redeliveries | None) -> CopyOrder | None:
    """The copies' order of this partition (None with ``dropCopies`` off). The earlier
    batches' publish ids are the redelivery index's (the gate's, or read at the first
    chunk holding publish ids when replaying; none with ``redeliveryWindow`` 0): the
    same set whenever the batch runs (it is pruned only at commits)."""
    if not opts.drop_copies:
        return None
    tag = topic_tag(opts.topic)

    def earlier() -> IdSet:
        if gate is not None:
            return gate.earlier_pids
        if opts.redelivery_window > 0:
            return SeenIndex(spool).load_pids_before(batch, tag)
        return IdSet(dtype=PID_DTYPE)

    return CopyOrder(spool.fs, spool.batch_dir(batch), index, tag, earlier,
                     check_fence=part.check_fence, check_marker=part.check_marker)


def fetch_batch_partition(opts: ReadOptions, share: int,
                          reader_factory: ReaderFactory = default_reader_factory, *,
                          topic: str | None = None, max_bytes: int | None = None,
                          ) -> Iterator["pa.RecordBatch"]:
    """Batch read: up to ``share`` messages (and ``max_bytes`` body bytes, if given) or
    until idle, from ``topic`` (default ``opts.topic``); reading consumes. A batch read
    connects and closes its own Reader (no cache: a closed Reader requeues what it holds,
    and nothing is left behind when the job ends).

    Each chunk is FINished after Spark has taken it from this generator (the next
    ``next()`` call), i.e. at-most-once for the job: a job failing after that point
    does not get them back. Use the streaming source with ``Trigger.AvailableNow`` for a
    replayable read.
    """
    check_speculation_off()
    if topic is not None and topic != opts.topic:
        opts = dataclasses.replace(opts, topic=topic)
    dedup = Dedup(opts.dedup, dedup_lease_ms(opts)) if opts.dedup else None
    dead_letters = DeadLetterSplit(opts, f"read-{uuid.uuid4().hex[:8]}")
    if share < opts.max_in_flight:
        opts = dataclasses.replace(opts, max_in_flight=share)
    reader = reader_factory(opts)
    try:
        remaining = share
        bytes_left = max_bytes
        deadline = time.monotonic() + opts.max_fetch_period
        # idleTimeout means "no message while subscribed": on a loaded machine connecting
        # alone can take longer than a short idleTimeout, so the first wait (which also
        # starts the Reader) is FIRST_WAIT; nothing then and no subscription is an error
        first = True
        while remaining > 0 and time.monotonic() < deadline \
                and (bytes_left is None or bytes_left > 0):
            wait = opts.idle_timeout
            if first:
                wait = max(wait, FIRST_WAIT)
            wait = min(wait, max(0.0, deadline - time.monotonic()))
            want = min(opts.spool_chunk_size, remaining)
            # a byte share: no message past the one that reaches it
            if first:  # fails at once if every nsqd refused
                got = first_blocks(reader, want, wait, opts, "the batch read", bytes_left)
            elif bytes_left is not None:
                got = reader.get_blocks(max_messages=want, timeout=wait,
                                        max_bytes=bytes_left)
            else:
                got = reader.get_blocks(max_messages=want, timeout=wait)
            if first and not got:
                causes = not_subscribed(reader)
                if causes is not None:
                    raise not_subscribed_error(opts, "the batch read", wait, causes)
            first = False
            if not got:
                break
            if dedup is not None:
                d = dedup.batch(got, opts.topic, opts.channel)
                rb, keep = d.rb, d.keep
                got = split_held(reader, got, d)  # requeued, not rows
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
                if dedup is not None:
                    dedup.release(keep)
                raise
            n = sum(map(len, got))
            if remaining - n < opts.max_in_flight:  # ask nsqd for no more than is left
                reader.set_max_in_flight(max(0, remaining - n))
            reader.finish_blocks(got)
            if dedup is not None:
                dedup.commit(keep)
            remaining -= n
            if bytes_left is not None:
                bytes_left -= blocks_body_bytes(got)
    finally:
        reader.close()
