"""nsq_to_parquet: archive NSQ topics to Parquet with Spark, in the spirit of nsq_to_file.

nsq_to_file writes each topic to rotating (gzipped) files on local disk. This does the
same with the nsq_spark Spark connector: a Structured Streaming query reads the topic on
its own channel and appends Parquet files (one set per micro-batch, i.e. per trigger
interval: that is the rotation) partitioned by day and hour of the message timestamp::

    python examples/nsq_to_parquet.py --topic events \\
        --lookupd-http-address 127.0.0.1:4161 --output-dir /data/archive \\
        --trigger-seconds 60

    # drain what is queued now, then exit (a cron job, or a backfill):
    python examples/nsq_to_parquet.py --topic events \\
        --nsqd-tcp-address 127.0.0.1:4150 --nsqd-http-address 127.0.0.1:4151 \\
        --output-dir /data/archive --available-now

Guarantees: the source FINishes a message only after it is in its spool (under the
checkpoint dir unless ``--spool-path`` says otherwise), and Spark's file sink commits each
micro-batch once through the checkpoint. A crash between spool and FIN makes nsqd
deliver those messages again under the same ``id``: ``--dedup-window`` drops them
(``dropDuplicatesWithinWatermark`` on ``id``). Output columns: ``id, body, timestamp,
attempts, nsqd_address, topic, channel`` plus the ``date`` and ``hour`` partitions.
Restart with the same ``--checkpoint-dir`` to continue where the last run stopped.
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topic", required=True, help="NSQ topic to archive")
    p.add_argument("--channel", default="nsq_to_parquet",
                   help="channel to consume on (default nsq_to_parquet)")
    p.add_argument("--nsqd-tcp-address", action="append", default=[],
                   help="nsqd TCP address (repeatable); or use --lookupd-http-address")
    p.add_argument("--nsqd-http-address", action="append", default=[],
                   help="the same nsqds' HTTP addresses (lets the driver skip empty "
                   "batches by reading the channel depth)")
    p.add_argument("--lookupd-http-address", action="append", default=[],
                   help="nsqlookupd HTTP address (repeatable)")
    p.add_argument("--output-dir", required=True, help="where the Parquet files go "
                   "(any Spark path: local, hdfs://, s3a://)")
    p.add_argument("--checkpoint-dir", help="Spark checkpoint (default: "
                   "<output-dir>/_checkpoint)")
    p.add_argument("--spool-path", help="the source's spool (default: "
                   "<checkpoint-dir>/nsq-spool); durable and reachable from every executor")
    p.add_argument("--trigger-seconds", type=float, default=60.0,
                   help="seconds per micro-batch = per output file set (default 60)")
    p.add_argument("--available-now", action="store_true",
                   help="archive what is queued now, then exit")
    p.add_argument("--max-messages-per-trigger", type=int, default=0,
                   help="cap per micro-batch (default: no cap)")
    p.add_argument("--num-partitions", type=int, default=2, help="fetch tasks per batch")
    p.add_argument("--dedup-window", default="",
                   help="drop redelivered messages (same id) seen within this event-time "
                   "window, e.g. '10 minutes' (default: off)")
    p.add_argument("--compression", default="zstd",
                   help="Parquet compression codec (default zstd)")
    p.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"),
                   help="Spark master (default local[2] or $SPARK_MASTER)")
    args = p.parse_args(argv)
    if bool(args.nsqd_tcp_address) == bool(args.lookupd_http_address):
        p.error("give --nsqd-tcp-address or --lookupd-http-address (one of them)")
    args.checkpoint_dir = args.checkpoint_dir or os.path.join(args.output_dir, "_checkpoint")
    args.spool_path = args.spool_path or os.path.join(args.checkpoint_dir, "nsq-spool")
    return args


def build_query(spark, args: argparse.Namespace):
    """The streaming query (not started)."""
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("nsq")
              .option("topic", args.topic)
              .option("channel", args.channel)
              .option("spoolPath", args.spool_path)
              .option("numPartitions", args.num_partitions))
    if args.nsqd_tcp_address:
        reader = reader.option("nsqdTcpAddresses", ",".join(args.nsqd_tcp_address))
        if args.nsqd_http_address:
            reader = reader.option("nsqdHttpAddresses", ",".join(args.nsqd_http_address))
    else:
        reader = reader.option("lookupdHttpAddresses", ",".join(args.lookupd_http_address))
    if args.max_messages_per_trigger:
        reader = reader.option("maxMessagesPerTrigger", args.max_messages_per_trigger)
    df = reader.load()
    if args.dedup_window:
        df = df.withWatermark("timestamp", args.dedup_window) \
               .dropDuplicatesWithinWatermark(["id"])
    df = (df.withColumn("date", F.date_format("timestamp", "yyyy-MM-dd"))
            .withColumn("hour", F.date_format("timestamp", "HH")))
    writer = (df.writeStream.format("parquet")
              .option("path", args.output_dir)
              .option("checkpointLocation", args.checkpoint_dir)
              .option("compression", args.compression)
              .partitionBy("date", "hour")
              .queryName(f"nsq_to_parquet_{args.topic}"))
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{args.trigger_seconds} seconds")
    return writer


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import nsq_spark.spark

    spark = (SparkSession.builder.master(args.master).appName("nsq_to_parquet")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", str(max(2, args.num_partitions)))
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    nsq_spark.spark.register(spark)   # not needed when pyspark finds pyspark_nsq itself
    query = build_query(spark, args).start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
