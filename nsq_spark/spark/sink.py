"""Executor side of ``df.write.format("nsq")`` / ``df.writeStream.format("nsq")``.

Rows carry ``body`` (binary or string, required), optionally ``topic`` (string: routes
the row; null or absent means the ``topic`` option) and ``defer_ms`` (integer: publish
with DPUB after that many milliseconds; null means now). Bodies are published with MPUB
in slices of ``batchSize`` messages / ``maxBatchBytes`` bytes, per task and topic, in row
order. A failed MPUB is retried (``retries`` attempts with exponential backoff); MPUB is
all-or-nothing in nsqd, but a retry after a lost acknowledgement publishes the slice
again, and Spark re-runs a failed task or micro-batch whole, so the sink is
at-least-once -- as NSQ itself is. Publishes are pipelined (``Producer.mpublish_async``)
and awaited per Arrow batch; the Producer does the retries (``max_tries``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from .._log import get_logger
from .options import NSQOptionError, WriteOptions

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

log = get_logger(__name__)


@dataclass
class PublishCommit:
    """What one write task published (the WriterCommitMessage)."""

    messages: int
    deferred: int
    mpubs: int


def nsqd_addresses(opts: WriteOptions) -> list[str]:
    """nsqd TCP addresses to publish to: given, or every nsqd the lookupds know."""
    if opts.nsqd_tcp_addresses:
        return list(opts.nsqd_tcp_addresses)
    from nsq_spark.addresses import strip_userinfo
    from nsq_spark.admin.errors import AdminError
    from nsq_spark.lookupd import lookup_sync, producer_address

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


def _column_bytes(rb: "pa.RecordBatch", name: str) -> list[bytes | None]:
    import pyarrow as pa

    col = rb.column(rb.schema.get_field_index(name))
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.binary())
    elif not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        raise NSQOptionError(f"column '{name}' must be binary or string, not {col.type}")
    values: list[bytes | None] = col.to_pylist()
    return values


def publish_batches(opts: WriteOptions, batches: Iterator["pa.RecordBatch"],
                    producer_factory: Any = None) -> PublishCommit:
    """Publish every row of ``batches``; returns the counts."""
    from nsq_spark.publish.producer import Producer

    factory = producer_factory or (lambda: Producer(
        nsqd_addresses(opts), max_tries=opts.retries, **opts.connection))
    producer = None
    commit = PublishCommit(0, 0, 0)
    pending: list[Any] = []
    try:
        for rb in batches:
            if rb.num_rows == 0:
                continue
            names = rb.schema.names
            if "body" not in names:
                raise NSQOptionError("the nsq sink needs a 'body' column (binary or string); "
                                     f"the DataFrame has {names}")
            bodies = _column_bytes(rb, "body")
            topics = (rb.column(names.index("topic")).to_pylist() if "topic" in names
                      else None)
            defers = (rb.column(names.index("defer_ms")).to_pylist() if "defer_ms" in names
                      else None)
            if producer is None:
                producer = factory()
            groups: dict[str, list[bytes]] = {}
            for i, body in enumerate(bodies):
                if body is None:
                    raise ValueError("the nsq sink cannot publish a null body (row "
                                     f"{commit.messages + i} of this task); filter nulls out")
                topic = (topics[i] if topics is not None else None) or opts.topic
                if topic is None:
                    raise NSQOptionError("a row has no 'topic' value and the option 'topic' "
                                         "is not set: set .option('topic', ...) or fill the "
                                         "topic column")
                if defers is not None and defers[i] is not None:
                    pending.append(producer.publish_async(topic, body, int(defers[i])))
                    commit.deferred += 1
                    continue
                groups.setdefault(topic, []).append(body)
            for topic, group in groups.items():
                for piece in _slices(group, opts.batch_size, opts.max_batch_bytes):
                    # pipelined: the next MPUB goes out before this one is acknowledged
                    pending.append(producer.mpublish_async(topic, piece))
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


def _slices(bodies: list[bytes], max_count: int, max_bytes: int) -> Iterator[list[bytes]]:
    start, size = 0, 0
    for i, body in enumerate(bodies):
        n = len(body) + 4  # MPUB frames each body with its 4-byte size
        if i > start and (i - start >= max_count or size + n > max_bytes):
            yield bodies[start:i]
            start, size = i, 0
        size += n
    if start < len(bodies):
        yield bodies[start:]
