"""Executor side of ``df.write.format("nsq")`` / ``df.writeStream.format("nsq")``.

Rows carry ``body`` (binary or string, required), optionally ``topic`` (string: routes
the row; null or absent means the ``topic`` option) and ``defer_ms`` (integer: publish
with DPUB after that many milliseconds; null means now). Bodies are published with MPUB
in slices of ``batchSize`` messages / ``maxBatchBytes`` bytes, per task and topic, in row
order. A failed MPUB is retried (``retries`` attempts with exponential backoff); MPUB is
all-or-nothing in nsqd, but a retry after a lost acknowledgement publishes the slice
again, and Spark re-runs a failed task or micro-batch whole, so the sink is
at-least-once -- as NSQ itself is, and as Spark's Kafka sink is. Publishes are pipelined
(``Producer.mpublish_async``) and awaited per Arrow batch; the Producer does the retries
(``max_tries``).

**Publish ids a re-run reproduces** (``publishIds``, on with ``replicas`` or
``idempotencyKeyColumn``). NSQ keeps no producer state to deduplicate by (Kafka has
idempotent producers and transactions, Pulsar a producer name and sequence, NATS a
message-id window), so the identifier has to come from the writer and the dedup from the
next consumer. Each message is stamped with a publish id (the version-3 envelope of
:mod:`nsq_spark.envelope`) derived, by :func:`~nsq_spark.envelope.publish_id_for`, from
an idempotency key:

* ``idempotencyKeyColumn`` given: the row's value of that column (string or binary; a
  null is an error naming the row). Equal keys are one message to a consumer that
  deduplicates by publish id, whichever task, batch or job writes them -- the
  Producer's ``idempotency_keys``, the same id for the same key.
* otherwise :class:`WriteScope`: the micro-batch (Spark's query id, which a restart on
  the same checkpoint keeps, and the batch id: the task's local properties
  ``sql.streaming.queryId`` and ``streaming.sql.batchId``, which Spark sets for the
  stream writer and for every job of a ``foreachBatch`` function), the task's partition,
  the row's position in the task, its topic and its body. Outside a streaming query (a
  plain ``df.write``) the micro-batch is replaced by an id the driver draws for the
  write: a retried task reproduces its ids, a second job does not.

So a micro-batch that Spark runs again after a crash (the sink published, the batch was
not committed) republishes the same ids when it is *deterministic*: the same rows in the
same partitions in the same order. A query that maps, filters or projects the rows of a
replayable source (the ``nsq`` source replays its spool; files; Kafka) is. A shuffle
(``repartition``, a join, an aggregation) does not promise an order within a partition,
nor does a non-deterministic expression (``rand()``, ``current_timestamp()``) give the
same body; then the ids differ and the copies are duplicates downstream, as without ids
-- never a loss, because the body is part of the key: a different row in the same
position gets a different id. Where the order is not deterministic, name a key column
(e.g. ``publish_id`` or ``id`` of the source, or the business key). Two writes of the
same rows to the same topic in one ``foreachBatch`` call are one publish (same scope,
same position, same body): give them a key column that tells them apart.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .._log import get_logger
from .options import NSQOptionError, WriteOptions

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

log = get_logger(__name__)

# The task local properties Spark sets for every job of a micro-batch (MicroBatchExecution;
# seen in the stream writer's tasks and in those of df.write inside foreachBatch).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
# Bytes the version-3 envelope adds to a body without trace context (MPUB slicing).
ENVELOPE_OVERHEAD = 27


@dataclass
class PublishCommit:
    """What one write task published (the WriterCommitMessage)."""

    messages: int
    deferred: int
    mpubs: int


@dataclass(frozen=True)
class WriteScope:
    """What names one write task's rows in their default idempotency keys: the
    micro-batch (``query`` and ``batch``: Spark's ids, None outside a streaming query),
    else the driver's ``write_id``; and the task's ``partition``."""

    partition: int
    query: str | None = None
    batch: str | None = None
    write_id: str | None = None

    def prefix(self) -> bytes:
        """The keys' common start; a row's key adds its position, topic and body."""
        if self.query is not None and self.batch is not None:
            head = f"q\0{self.query}\0{self.batch}"
        elif self.write_id is not None:
            head = f"w\0{self.write_id}"
        else:
            raise ValueError("a WriteScope needs a micro-batch (query and batch) or a "
                             "write_id")
        return f"nsq-spark-sink\0{head}\0{self.partition}\0".encode()


def task_scope(write_id: str | None) -> WriteScope:
    """The scope of the running Spark task (:class:`WriteScope`); outside a task (tests,
    direct calls): partition 0 of ``write_id``, or of a fresh one."""
    write_id = write_id or uuid.uuid4().hex
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - the sink runs under Spark
        return WriteScope(0, write_id=write_id)
    ctx = TaskContext.get()
    if ctx is None:
        return WriteScope(0, write_id=write_id)
    return WriteScope(ctx.partitionId(), ctx.getLocalProperty(QUERY_ID_PROPERTY),
                      ctx.getLocalProperty(BATCH_ID_PROPERTY), write_id)


def nsqd_addresses(opts: WriteOptions) -> list[str]:
    """nsqd TCP addresses to publish to: given, or every nsqd the lookupds know."""
    if opts.nsqd_tcp_addresses:
        return list(opts.nsqd_tcp_addresses)
    from nsq_spark._addresses import strip_userinfo
    from nsq_spark.admin.errors import AdminError
    from nsq_spark._lookupd import lookup_sync, producer_address

    found: set[str] = set()
    for addr in opts.lookupd_http_addresses:
        try:
            producers = lookup_sync(addr, "", timeout=5, path="/nodes")
        except (OSError, AdminError) as exc:
            # AdminError: every failure of one lookupd (no answer, a refused certificate,
            # an answer that is not a lookupd's); the others may still answer
            where = strip_userinfo(addr)
            log.for_lookupd(where).warning("lookupd %s: /nodes failed: %s", where, exc)
            continue
        found.update(producer_address(p.producer) for p in producers)
    if not found:
        from nsq_spark.errors import ConnectError

        shown = [strip_userinfo(a) for a in opts.lookupd_http_addresses]  # no password
        raise ConnectError(f"no nsqd found through lookupdHttpAddresses {shown}: check "
                           "that nsqlookupd is up and nsqd registered with it, or give "
                           "nsqdTcpAddresses")
    return sorted(found)


def default_producer(opts: WriteOptions) -> Any:
    """The task's Producer: the options' addresses, retries, publish ids and replicas."""
    from nsq_spark._publish.producer import Producer

    return Producer(nsqd_addresses(opts), max_tries=opts.retries,
                    publish_ids=opts.publish_ids, replicas=opts.replicas,
                    write_quorum=opts.write_quorum, **opts.connection)


def _column_bytes(rb: "pa.RecordBatch", name: str) -> list[bytes | None]:
    import pyarrow as pa

    col = rb.column(rb.schema.get_field_index(name))
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.binary())
    elif not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        raise NSQOptionError(f"column '{name}' must be binary or string, not {col.type}")
    values: list[bytes | None] = col.to_pylist()
    return values


class _Keys:
    """Each row's idempotency key, or None for all without publish ids."""

    def __init__(self, opts: WriteOptions, scope: WriteScope | None) -> None:
        self.column = opts.idempotency_key_column if opts.publish_ids else None
        self.prefix = (scope or task_scope(None)).prefix() \
            if opts.publish_ids and self.column is None else None

    def for_rows(self, rb: "pa.RecordBatch", topics: list[str], bodies: list[bytes],
                 first_row: int) -> list[bytes] | None:
        """The keys of ``rb``'s rows (``first_row``: the task's number of its first row):
        the key column's values, or prefix | row | topic | body (the module doc)."""
        if self.column is not None:
            names = rb.schema.names
            if self.column not in names:
                raise NSQOptionError(f"option 'idempotencyKeyColumn': the DataFrame has no "
                                     f"column '{self.column}' (its columns: {names})")
            out: list[bytes] = []
            for i, key in enumerate(_column_bytes(rb, self.column)):
                if not key:  # null, or empty (publish_id_for refuses an empty key)
                    raise ValueError(
                        f"the nsq sink's idempotencyKeyColumn '{self.column}' is "
                        f"{'null' if key is None else 'empty'} in row {first_row + i} of "
                        "this task: every row needs its own key; fill it or filter the row")
                out.append(key)
            return out
        if self.prefix is None:
            return None
        prefix = self.prefix
        return [b"%s%d\0%s\0%s" % (prefix, first_row + i, topic.encode(), body)
                for i, (topic, body) in enumerate(zip(topics, bodies))]


def publish_batches(opts: WriteOptions, batches: Iterator["pa.RecordBatch"],
                    producer_factory: Callable[[], Any] | None = None,
                    scope: WriteScope | None = None) -> PublishCommit:
    """Publish every row of ``batches``; returns the counts. ``scope``: the task's
    (:func:`task_scope`; default: a fresh write id, partition 0)."""
    factory = producer_factory or (lambda: default_producer(opts))
    keys = _Keys(opts, scope)
    producer = None
    commit = PublishCommit(0, 0, 0)
    pending: list[Any] = []
    overhead = ENVELOPE_OVERHEAD if opts.publish_ids else 0
    try:
        for rb in batches:
            if rb.num_rows == 0:
                continue
            names = rb.schema.names
            if "body" not in names:
                raise NSQOptionError("the nsq sink needs a 'body' column (binary or string); "
                                     f"the DataFrame has {names}")
            row_topics = (rb.column(names.index("topic")).to_pylist() if "topic" in names
                          else None)
            defers = (rb.column(names.index("defer_ms")).to_pylist() if "defer_ms" in names
                      else None)
            bodies: list[bytes] = []
            topics: list[str] = []
            for i, body in enumerate(_column_bytes(rb, "body")):
                if body is None:
                    raise ValueError("the nsq sink cannot publish a null body (row "
                                     f"{commit.messages + i} of this task); filter nulls out")
                topic = (row_topics[i] if row_topics is not None else None) or opts.topic
                if topic is None:
                    raise NSQOptionError("a row has no 'topic' value and the option 'topic' "
                                         "is not set: set .option('topic', ...) or fill the "
                                         "topic column")
                bodies.append(body)
                topics.append(topic)
            row_keys = keys.for_rows(rb, topics, bodies, commit.messages)
            if producer is None:
                producer = factory()
            groups: dict[str, tuple[list[bytes], list[bytes]]] = {}
            for i, body in enumerate(bodies):
                key = row_keys[i] if row_keys is not None else None
                if defers is not None and defers[i] is not None:
                    kw = {} if key is None else {"idempotency_key": key}
                    pending.append(producer.publish_async(topics[i], body, int(defers[i]),
                                                          **kw))
                    commit.deferred += 1
                    continue
                group_bodies, group_keys = groups.setdefault(topics[i], ([], []))
                group_bodies.append(body)
                if key is not None:
                    group_keys.append(key)
            for topic, (group_bodies, group_keys) in groups.items():
                for piece in _slices(group_bodies, opts.batch_size, opts.max_batch_bytes,
                                     overhead):
                    more: dict[str, Any] = {} if not group_keys else \
                        {"idempotency_keys": group_keys[piece.start:piece.stop]}
                    # pipelined: the next MPUB goes out before this one is acknowledged
                    pending.append(producer.mpublish_async(
                        topic, group_bodies[piece.start:piece.stop], **more))
                    commit.mpubs += 1
            _wait_all(pending, timeout=opts.publish_timeout)
            pending.clear()
            commit.messages += rb.num_rows
    finally:
        if producer is not None:
            producer.close()
    return commit


def _wait_all(futures: list[Any], timeout: float) -> None:
    """Wait for every publish; raise the first failure (after the Producer's retries)."""
    import concurrent.futures

    done, not_done = concurrent.futures.wait(futures, timeout=timeout)
    if not_done:
        raise TimeoutError(f"{len(not_done)} publishes were not acknowledged by nsqd within "
                           f"{timeout:.0f}s")
    for f in futures:
        f.result()


def _slices(bodies: list[bytes], max_count: int, max_bytes: int, overhead: int = 0
            ) -> Iterator[range]:
    """Index ranges of ``bodies``, each one MPUB: at most ``max_count`` bodies and
    ``max_bytes`` bytes (each body framed by its 4-byte size, plus ``overhead``: the
    envelope a publish id adds), never empty."""
    start, size = 0, 0
    for i, body in enumerate(bodies):
        n = len(body) + 4 + overhead
        if i > start and (i - start >= max_count or size + n > max_bytes):
            yield range(start, i)
            start, size = i, 0
        size += n
    if start < len(bodies):
        yield range(start, len(bodies))
