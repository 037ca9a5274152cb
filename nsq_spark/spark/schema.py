"""The row schema of the ``nsq`` source, in Spark and in Arrow, and the bulk conversion of
fetched messages into one Arrow record batch (one list pass per column, no per-row Spark
objects)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from nsq_spark.message import Message

# Spark DDL of the source's rows. ``id`` is nsqd's 16-character message id: the same
# message redelivered keeps it, so it is the dedup key.
SCHEMA_DDL = ("id string, body binary, timestamp timestamp, attempts int, "
              "nsqd_address string, topic string, channel string")

COLUMNS = ("id", "body", "timestamp", "attempts", "nsqd_address", "topic", "channel")

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
        ])
    return _ARROW_SCHEMA


def spark_schema():  # -> pyspark.sql.types.StructType
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
    ])


def _as_bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else bytes(value)  # type: ignore[arg-type]


def messages_to_batch(messages: Sequence["Message"], topic: str,
                      channel: str) -> "pa.RecordBatch":
    """One Arrow record batch from fetched messages (bulk: a list pass per column)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(messages)
    ids = pa.array([m.id for m in messages], pa.binary()).cast(pa.string())
    bodies = pa.array([_as_bytes(m.body) for m in messages], pa.binary())
    ts_ns = pa.array([m.timestamp for m in messages], pa.int64())
    ts = pc.divide(ts_ns, 1000).cast(pa.timestamp("us", tz="UTC"))
    attempts = pa.array([m.attempts for m in messages], pa.int32())
    addresses = pa.array([m.nsqd_address for m in messages], pa.string())
    topics = pa.repeat(pa.scalar(topic, pa.string()), n)
    channels = pa.repeat(pa.scalar(channel, pa.string()), n)
    return pa.RecordBatch.from_arrays(
        [ids, bodies, ts, attempts, addresses, topics, channels], schema=arrow_schema())
