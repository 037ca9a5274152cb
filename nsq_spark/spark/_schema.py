"""The row schema of the ``nsq`` source, in Spark and in Arrow, and the bulk conversion of
fetched messages into one Arrow record batch: from MessageBlocks (the fetch path: no Python
object per row) or from Message objects (the dedup path and hand-made messages).

Envelopes (:mod:`nsq_spark.envelope`) are opened here, column-wise, by the one rule of
:func:`nsq_spark.envelope.open_body`: a damaged envelope is never opened, never cut and
never a key -- the row keeps the whole body, and no id.

``publish_id`` (nullable ``binary``, 16 bytes): the publish id of a body in a publish
envelope (version 3: ``Producer(publish_ids=True)`` or ``replicas``); ``body`` is then the
published body. The copies of one publish (replicas on several nsqds, a publisher's
retries) carry the same one; the streaming source keeps one row of them
(:mod:`.copies`). Each such row's CRC-32 is checked in Python (``zlib``, on the Arrow
buffer, no copy): only rows whose body starts with the magic pay it.

``trace_parent`` (nullable): the W3C traceparent a producer put into the body with
``Telemetry(trace_context=True)`` (the message-id envelope's version 2, see
:mod:`nsq_spark.spool._format`, or a publish envelope's extension); for those rows ``body``
is the inner body. Version-1 envelopes (``message_id_digest`` alone) stay in ``body`` as
before.

A batch without any envelope pays one numpy gather of its bodies' first bytes (+4.5 ns a
row, bench/RESULTS.md) and gets cached null columns; the envelopes a Producer writes are
opened column-wide (``binary_slice``/``if_else``), plus the check of each one (a BLAKE2b
digest for version 2, a CRC-32 for version 3; figures in bench/RESULTS.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from nsq_spark.envelope import PUBLISH_ENVELOPE_MAGIC as _PUBLISH_MAGIC
from nsq_spark.spool._format import TRACED_ENVELOPE_MAGIC as _TRACED_MAGIC
from .._log import get_logger

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from nsq_spark.message import Message
    from nsq_spark.protocol import MessageBlock

# Spark DDL of the source's rows. ``id`` is nsqd's 16-character message id: the same
# message redelivered keeps it, so it is the dedup key.
SCHEMA_DDL = ("id string, body binary, timestamp timestamp, attempts int, "
              "nsqd_address string, topic string, channel string, trace_parent string, "
              "publish_id binary")

COLUMNS = ("id", "body", "timestamp", "attempts", "nsqd_address", "topic", "channel",
           "trace_parent", "publish_id")

log = get_logger(__name__)

_ARROW_SCHEMA = None


def arrow_schema() -> "pa.Schema":
    """The Arrow schema of spool files and of the batches handed to Spark."""
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        import pyarrow as pa

        _ARROW_SCHEMA = pa.schema([
            pa.field("id", pa.string()),
            pa.field("body", pa.binary()),
            # Spark's TimestampType is microseconds; nsqd's timestamp is nanoseconds.
            pa.field("timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("attempts", pa.int32()),
            pa.field("nsqd_address", pa.string()),
            pa.field("topic", pa.string()),
            pa.field("channel", pa.string()),
            pa.field("trace_parent", pa.string()),
            # 16 bytes, or null: Spark's BinaryType is Arrow's variable-size binary
            pa.field("publish_id", pa.binary()),
        ])
    return _ARROW_SCHEMA


def spark_schema() -> "StructType":
    from pyspark.sql.types import (BinaryType, IntegerType, StringType, StructField,
                                   StructType, TimestampType)

    return StructType([
        StructField("id", StringType()),
        StructField("body", BinaryType()),
        StructField("timestamp", TimestampType()),
        StructField("attempts", IntegerType()),
        StructField("nsqd_address", StringType()),
        StructField("topic", StringType()),
        StructField("channel", StringType()),
        StructField("trace_parent", StringType()),
        StructField("publish_id", BinaryType()),
    ])


_ID_OFFSETS: dict[int, "pa.Buffer"] = {}


def _id_offsets(n: int) -> "pa.Buffer":
    """int32 offsets 0, 16, 32, ... of ``n`` 16-byte ids (cached per chunk size)."""
    buf = _ID_OFFSETS.get(n)
    if buf is None:
        import sys
        from array import array

        import pyarrow as pa

        offsets = array("i", range(0, 16 * n + 1, 16))  # not pa.array(range): imports pandas
        if sys.byteorder != "little":  # pragma: no cover - Arrow buffers are little-endian
            offsets.byteswap()
        buf = pa.py_buffer(offsets.tobytes())
        if len(_ID_OFFSETS) < 64:
            _ID_OFFSETS[n] = buf
    return buf


# binary_slice's stop for "to the end" (its default stop fails in pyarrow 26 with "Negative
# buffer resize"); frames are at most 1 GiB (ConnectionConfig.max_frame_size)
_PAST_ANY_BODY = 1 << 30
_HEADER_DTYPE = None  # numpy dtype of a frame's timestamp + attempts (numpy loads lazily)


def blocks_to_batch(blocks: Sequence["MessageBlock"], topic: str,
                    channel: str) -> "pa.RecordBatch":
    """One Arrow record batch from MessageBlocks, with no Python object per message.

    A block's frames, back to back in the bytes received, are already a binary array:
    the block's offsets are its offsets. The columns are cut from it in C: ``body`` and
    ``id`` with ``binary_slice``, the big-endian ``timestamp`` and ``attempts`` through one
    structured numpy view of their 10 bytes per row. About 0.1 us per message in chunks
    of 1,250 messages, mostly per-call overhead.
    """
    import sys

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from nsq_spark.protocol import BODY_AT, ID_AT, TIMESTAMP_AT

    global _HEADER_DTYPE
    if _HEADER_DTYPE is None:
        _HEADER_DTYPE = np.dtype([("ts", ">i8"), ("attempts", ">u2")])

    if sys.byteorder != "little":  # pragma: no cover - Arrow buffers are little-endian
        return messages_to_batch([m for b in blocks for m in b.messages()], topic, channel)
    blocks = [b for b in blocks if len(b)]
    n = sum(map(len, blocks))
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=arrow_schema())
    parts = [pa.Array.from_buffers(pa.binary(), len(b),
                                   [None, pa.py_buffer(b.offsets), pa.py_buffer(b.data)])
             for b in blocks]
    frames = parts[0] if len(parts) == 1 else pa.concat_arrays(parts)
    ids = pc.binary_slice(frames, ID_AT, BODY_AT).cast(pa.string())  # checks UTF-8
    bodies = pc.binary_slice(frames, BODY_AT, _PAST_ANY_BODY)
    # timestamp and attempts, 10 bytes per row back to back: one structured numpy view
    header = pc.binary_slice(frames, TIMESTAMP_AT, ID_AT).buffers()[2]
    fields = np.frombuffer(header, _HEADER_DTYPE, n)
    # Spark's TimestampType is microseconds; nsqd's timestamp is nanoseconds
    ts = pa.Array.from_buffers(_TS_TYPE(), n, [None, pa.py_buffer(
        (fields["ts"] // 1000).astype("<i8"))])
    attempts = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(
        fields["attempts"].astype("<i4"))])
    addresses = {b.nsqd_address for b in blocks}
    if len(addresses) == 1:
        address_col = _repeated(addresses.pop(), n)
    else:
        address_col = pa.concat_arrays([_repeated(b.nsqd_address, len(b)) for b in blocks])
    bodies, parents, pids = open_envelopes(bodies)
    return pa.RecordBatch.from_arrays(
        [ids, bodies, ts, attempts, address_col, _repeated(topic, n),
         _repeated(channel, n), parents, pids], schema=arrow_schema())


_REPEATED: dict[tuple[str | None, int], "pa.Array"] = {}


def _repeated(value: str | None, n: int) -> "pa.Array":
    """A string column of ``n`` rows all ``value`` (topic, channel, nsqd address), built
    once per (value, chunk size): Arrow arrays are immutable, so chunks share it."""
    col = _REPEATED.get((value, n))
    if col is None:
        import pyarrow as pa

        col = pa.repeat(pa.scalar(value, pa.string()), n)
        if len(_REPEATED) < 256:
            _REPEATED[(value, n)] = col
    return col


def messages_to_batch(messages: Sequence["Message"], topic: str,
                      channel: str) -> "pa.RecordBatch":
    """One Arrow record batch from fetched messages (bulk: a list pass per column).

    About 200 ns per message: nsqd's ids are 16 ASCII bytes, so the ``id`` column is one
    joined buffer with fixed offsets (validated as UTF-8 once); the other columns are one
    list comprehension each, converted by pyarrow in C.
    """
    import pyarrow as pa

    n = len(messages)
    joined = b"".join([m.id for m in messages])
    if len(joined) == 16 * n:
        ids = pa.Array.from_buffers(pa.string(), n, [None, _id_offsets(n), pa.py_buffer(joined)])
        ids.validate(full=True)  # ASCII from nsqd; a corrupt id fails here, not in Spark
    else:  # not nsqd's 16-byte ids (a hand-made Message): the general path
        ids = pa.array([m.id for m in messages], pa.binary()).cast(pa.string())
    bodies = [m.body for m in messages]
    try:
        body_col = pa.array(bodies, pa.binary())
    except (TypeError, pa.ArrowTypeError):  # bodies that are not bytes-like objects
        body_col = pa.array([_as_bytes(b) for b in bodies], pa.binary())
    # Spark's TimestampType is microseconds; nsqd's timestamp is nanoseconds
    ts = pa.array([m.timestamp // 1000 for m in messages], pa.int64()).view(_TS_TYPE())
    attempts = pa.array([m.attempts for m in messages], pa.int32())
    addresses = pa.array([m.nsqd_address for m in messages], pa.string())
    topics = pa.repeat(pa.scalar(topic, pa.string()), n)
    channels = pa.repeat(pa.scalar(channel, pa.string()), n)
    body_col, parents, pids = open_envelopes(body_col)
    return pa.RecordBatch.from_arrays(
        [ids, body_col, ts, attempts, addresses, topics, channels, parents, pids],
        schema=arrow_schema())




_NULLS: dict[tuple[str, int], "pa.Array"] = {}


def _nulls(kind: str, n: int) -> "pa.Array":
    """An all-null ``trace_parent`` (``kind`` "string") or ``publish_id`` ("binary")
    column of ``n`` rows (cached per chunk size)."""
    col = _NULLS.get((kind, n))
    if col is None:
        import pyarrow as pa

        col = pa.nulls(n, pa.string() if kind == "string" else pa.binary())
        if len(_NULLS) < 128:
            _NULLS[(kind, n)] = col
    return col


def _null_parents(n: int) -> "pa.Array":
    return _nulls("string", n)


def _null_pids(n: int) -> "pa.Array":
    return _nulls("binary", n)


def _may_be_traced(bodies: "pa.Array") -> bool:
    """Whether a body of ``bodies`` (a binary array) may start with an envelope (any
    version: they all start with a zero byte): one numpy gather of the first bytes,
    searched as bytes (about 2 µs for a chunk of 1,250; pyarrow's starts_with costs 50).
    False is certain; True (also for an empty body at the end of the data, whose start
    is clipped to the last byte) is checked exactly by the caller."""
    import numpy as np

    n = len(bodies)
    buffers = bodies.buffers()
    if n == 0 or buffers[2] is None or not buffers[2].size:
        return False
    starts = np.frombuffer(buffers[1], np.int32, count=n, offset=bodies.offset * 4)
    first = np.frombuffer(buffers[2], np.uint8).take(starts, mode="clip")
    return _TRACED_MAGIC[:1] in first.tobytes()


def open_envelopes(bodies: "pa.Array") -> "tuple[pa.Array, pa.Array, pa.Array]":
    """``(body, trace_parent, publish_id)`` columns of a binary column of bodies as nsqd
    delivered them: publish envelopes (version 3) and traced ones (version 2) opened,
    checked; null columns when there are none (found without a Python object per row).
    A body that only starts like an envelope stays whole, with null columns."""
    n = len(bodies)
    if not _may_be_traced(bodies):
        return bodies, _null_parents(n), _null_pids(n)
    import pyarrow.compute as pc

    published = pc.starts_with(bodies, pattern=_PUBLISH_MAGIC.decode("ascii"))
    if not pc.any(published).as_py():
        opened, parents = _open_traced(bodies)
        return opened, parents, _null_pids(n)
    return _open_published(bodies, published)


# what _publish_kinds says of a row
_NOT_PUBLISHED, _PLAIN, _TRACEPARENT_ONLY, _OTHER_EXTENSION = 0, 1, 2, 3
_damaged_logged_at = 0.0
_damaged_since = 0
# seconds between two WARNINGs about damaged publish envelopes (the count is in each)
DAMAGED_LOG_INTERVAL = 60.0


def _publish_kinds(bodies: "pa.Array", published: "pa.Array") -> "np.ndarray":
    """Per row: not (or a damaged) publish envelope, one with no extension, one with a
    traceparent alone, one with any other extension. The checks of
    :func:`nsq_spark.envelope.publish_extensions` (length, extension, CRC-32) run on the
    Arrow buffer, without copying a body; rows without the magic pay nothing."""
    import numpy as np

    from nsq_spark import envelope

    n = len(bodies)
    kinds = np.zeros(n, np.int8)
    offsets = np.frombuffer(bodies.buffers()[1], np.int32, count=n + 1,
                            offset=bodies.offset * 4)
    data = bodies.buffers()[2]
    rows = np.flatnonzero(published.to_numpy(zero_copy_only=False))
    ext = envelope.publish_extensions(data, offsets[rows], offsets[rows + 1])
    damaged = int((ext < 0).sum())
    kinds[rows[ext == 0]] = _PLAIN
    others = rows[ext > 0]
    if len(others):
        # the head holds the extension's length: matching it says "a traceparent alone"
        head, at = envelope.TRACEPARENT_ONLY_HEAD, envelope.PUBLISH_EXT_AT
        raw = np.frombuffer(data, np.uint8)
        starts = offsets[others].astype(np.int64) + at
        heads = raw[starts[:, None] + np.arange(len(head))]
        alone = (heads == np.frombuffer(head, np.uint8)).all(axis=1)
        kinds[others[alone]] = _TRACEPARENT_ONLY
        kinds[others[~alone]] = _OTHER_EXTENSION
    if damaged:
        _log_damaged(damaged)
    return kinds


def _log_damaged(count: int) -> None:
    """A WARNING at most every DAMAGED_LOG_INTERVAL seconds, with the count since the
    last one (a damaged envelope is a row with its whole body, never dropped)."""
    import time

    global _damaged_logged_at, _damaged_since
    _damaged_since += count
    now = time.monotonic()
    if now - _damaged_logged_at >= DAMAGED_LOG_INTERVAL:
        log.warning("%d bodies started like a publish envelope but failed its checks "
                    "(cut short, or a CRC-32 that does not match): their rows hold the "
                    "whole body and no publish_id", _damaged_since)
        _damaged_logged_at, _damaged_since = now, 0


def _open_published(bodies: "pa.Array", published: "pa.Array"
                    ) -> "tuple[pa.Array, pa.Array, pa.Array]":
    """:func:`open_envelopes` for a column with publish envelopes: the two layouts a
    Producer writes (no extension; a traceparent alone) are cut column-wide, any other
    extension row by row by :func:`nsq_spark.envelope.open_body`; traced (version 2)
    rows as :func:`_open_traced` does."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from nsq_spark import envelope

    n = len(bodies)
    kinds = _publish_kinds(bodies, published)
    opened = kinds != _NOT_PUBLISHED
    if not opened.any():
        body, parents = _open_traced(bodies)
        return body, parents, _null_pids(n)
    if (kinds == _OTHER_EXTENSION).any():
        return _open_row_by_row(bodies)
    plain, traced = kinds == _PLAIN, kinds == _TRACEPARENT_ONLY
    pid_at = envelope.PUBLISH_ID_AT
    ids = pc.binary_slice(bodies, pid_at, pid_at + envelope.PUBLISH_ID_SIZE)
    null_pid = pa.scalar(None, pa.binary())
    if plain.all():  # a topic of a Producer with publish ids, no trace context
        return (pc.binary_slice(bodies, envelope.PUBLISH_BODY_AT, _PAST_ANY_BODY),
                _null_parents(n), ids)
    parents3: "pa.Array" = _null_parents(n)
    if traced.any():
        try:
            parents3 = pc.if_else(pa.array(traced), pc.binary_slice(
                bodies, envelope.PUBLISH_TRACEPARENT_AT,
                envelope.PUBLISH_TRACED_BODY_AT).cast(pa.string()),
                pa.scalar(None, pa.string()))
        except pa.ArrowInvalid:  # not UTF-8: not one of ours; the row-wise rule decides
            return _open_row_by_row(bodies)
    # the rows not opened here: traced (version 2) rows opened as before, others whole
    rest, parents = _open_traced(bodies)
    body = rest
    if plain.any():
        body = pc.if_else(pa.array(plain), pc.binary_slice(
            bodies, envelope.PUBLISH_BODY_AT, _PAST_ANY_BODY), body)
    if traced.any():
        body = pc.if_else(pa.array(traced), pc.binary_slice(
            bodies, envelope.PUBLISH_TRACED_BODY_AT, _PAST_ANY_BODY), body)
        parents = pc.if_else(pa.array(traced), parents3, parents)
    return body, parents, pc.if_else(pa.array(opened), ids, null_pid)


def _open_row_by_row(bodies: "pa.Array") -> "tuple[pa.Array, pa.Array, pa.Array]":
    """The general case: each body that starts with an envelope's magic through
    :func:`nsq_spark.envelope.open_body` (versions 2 and 3 opened; version 1, damaged
    and later versions whole)."""
    import pyarrow as pa

    from nsq_spark.envelope import open_body

    out: list[bytes | None] = []
    parents: list[str | None] = []
    pids: list[bytes | None] = []
    damaged = 0
    for body in bodies.to_pylist():
        if body is not None and body[:1] == b"\x00":
            e = open_body(body)
            if e.version in (2, 3):
                out.append(e.body)
                parents.append(e.traceparent)
                pids.append(e.publish_id)
                continue
            damaged += e.damaged is not None and body[:5] == _PUBLISH_MAGIC
        out.append(body)
        parents.append(None)
        pids.append(None)
    if damaged:
        _log_damaged(damaged)
    return pa.array(out, pa.binary()), pa.array(parents, pa.string()), pa.array(pids,
                                                                                  pa.binary())


def _open_traced(bodies: "pa.Array") -> "tuple[pa.Array, pa.Array]":
    """``(bodies, trace_parent)``: traced envelopes opened; a null column when there are
    none, found without a Python object per row. The envelope a Producer writes (a
    traceparent and no tracestate) is opened column-wide (``binary_slice``/``if_else``,
    about 30 ns a row); any other traced body row by row by the one envelope rule,
    :func:`nsq_spark.spool._format.open_traced_envelope`."""
    if not _may_be_traced(bodies):
        return bodies, _null_parents(len(bodies))
    import pyarrow as pa
    import pyarrow.compute as pc

    from nsq_spark.spool import _format as envelope

    traced = pc.starts_with(bodies, pattern=_TRACED_MAGIC.decode("ascii"))
    if not pc.any(traced).as_py():
        return bodies, _null_parents(len(bodies))
    at = envelope.TRACEPARENT_ONLY_AT
    head = pc.binary_slice(bodies, at, at + len(envelope.TRACEPARENT_ONLY_HEAD))
    # the usual envelope: its head, and long enough to hold the whole traceparent (a
    # shorter body with that head is cut short: not one of ours, left as it is, as
    # open_traced_envelope leaves it)
    usual = pc.and_(pc.and_(traced, pc.equal(head, pa.scalar(envelope.TRACEPARENT_ONLY_HEAD,
                                                             pa.binary()))),
                    pc.greater_equal(pc.binary_length(bodies),
                                     envelope.TRACEPARENT_ONLY_BODY_AT))
    if pc.all(pc.equal(traced, usual)).as_py():
        try:
            parents = pc.binary_slice(bodies, envelope.TRACEPARENT_AT,
                                      envelope.TRACEPARENT_ONLY_BODY_AT).cast(pa.string())
        except pa.ArrowInvalid:   # not UTF-8: not one of ours; the row-wise rule decides
            pass
        else:
            inner = pc.binary_slice(bodies, envelope.TRACEPARENT_ONLY_BODY_AT, _PAST_ANY_BODY)
            usual = _digest_matches(usual, inner, bodies)
            return (pc.if_else(usual, inner, bodies),
                    pc.if_else(usual, parents, pa.scalar(None, pa.string())))
    out: list[bytes | None] = []
    parents_list: list[str | None] = []
    for body, is_traced in zip(bodies.to_pylist(), traced.to_pylist()):
        if is_traced:
            opened = envelope.open_traced_envelope(body)
            out.append(opened.body)
            parents_list.append(opened.traceparent)
        else:
            out.append(body)
            parents_list.append(None)
    return pa.array(out, pa.binary()), pa.array(parents_list, pa.string())


def _digest_matches(usual: "pa.Array", inner: "pa.Array", bodies: "pa.Array") -> "pa.Array":
    """``usual`` where the envelope's digest is the inner body's (the one envelope rule:
    a damaged envelope is never opened, :func:`nsq_spark.envelope.open_body`). One
    BLAKE2b per traced row, in Python: only rows with a version-2 envelope pay it."""
    import hashlib

    import pyarrow as pa
    import pyarrow.compute as pc

    from nsq_spark import envelope

    at = len(envelope.TRACED_ENVELOPE_MAGIC)
    digests = pc.binary_slice(bodies, at, at + envelope.DIGEST_SIZE).to_pylist()
    flags = usual.to_pylist()
    ok = [bool(f) and hashlib.blake2b(b, digest_size=envelope.DIGEST_SIZE).digest() == d
          for f, b, d in zip(flags, inner.to_pylist(), digests)]
    return pa.array(ok, pa.bool_())


def conform(batch: "pa.RecordBatch") -> "pa.RecordBatch":
    """A batch of an older spool file (written before ``trace_parent`` or ``publish_id``
    existed) with the columns added, null; a batch of today's schema as it is."""
    import pyarrow as pa

    schema = arrow_schema()
    if batch.schema.names == schema.names:
        return batch
    have = set(batch.schema.names)
    columns = [batch.column(f.name) if f.name in have
               else _nulls("string" if f.name == "trace_parent" else "binary",
                           batch.num_rows)
               for f in schema]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _TS_TYPE() -> "pa.DataType":
    return arrow_schema().field("timestamp").type


def _as_bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else bytes(value)  # type: ignore[call-overload]
