"""Stream an NSQ topic into Parquet files, exactly once per message id.

    python examples/nsq_to_parquet.py --lookupd 127.0.0.1:4161 --topic events \
        --channel parquet --out /data/events --checkpoint /data/ckpt/events \
        --spool /data/spool/events

The checkpoint (Spark's) and the spool (the connector's write-ahead log of fetched
messages) must both be on durable storage reachable from the driver and every executor;
keep one of each per query. Restarting with the same paths resumes where it stopped.

NSQ delivers at least once: a message redelivered after a crash keeps its ``id``. The
query drops such duplicates with ``dropDuplicatesWithinWatermark("id")`` (state kept for
the watermark delay); the connector's ``dedup`` option (a shared Redis/memcached store)
is the alternative when state in the query is not wanted.
"""

import argparse
import os
import sys
import threading

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener


class Progress(StreamingQueryListener):
    """One line per micro-batch that read something, and the total at the end."""

    def __init__(self) -> None:
        self.messages = 0
        self.batches = 0
        self.ended = threading.Event()

    def onQueryStarted(self, event) -> None:  # type: ignore[no-untyped-def]
        pass

    def onQueryProgress(self, event) -> None:  # type: ignore[no-untyped-def]
        rows = event.progress.numInputRows
        if rows:
            self.messages += rows
            self.batches += 1
            print(f"batch {event.progress.batchId}: {rows} messages", flush=True)

    def onQueryIdle(self, event) -> None:  # type: ignore[no-untyped-def]
        pass

    def onQueryTerminated(self, event) -> None:  # type: ignore[no-untyped-def]
        self.ended.set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lookupd", required=True, help="nsqlookupd HTTP host:port[,...]")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--channel", default="parquet")
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--spool", required=True)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--max-per-trigger", type=int, default=100_000)
    ap.add_argument("--state-partitions", type=int, default=8,
                    help="partitions of the dedup state (spark.sql.shuffle.partitions; fixed "
                         "by the first run of a checkpoint)")
    ap.add_argument("--available-now", action="store_true",
                    help="drain what is queued now, then stop (for scheduled jobs)")
    args = ap.parse_args()

    # Spark's Python workers run PYSPARK_PYTHON ("python3" if unset), which must have
    # nsq-spark installed: default to this interpreter (a venv works without activating
    # it). On a cluster, point it at a Python with the package on every worker.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # The dedup state is split into spark.sql.shuffle.partitions parts, each a state
    # store committed every micro-batch. Spark's default of 200 is sized for clusters:
    # tests/test_cli_nsq_to_parquet.py (300 messages, 2 cores) took 62 s with it, 43 s
    # with 8.
    spark = (SparkSession.builder.appName("nsq-to-parquet")
             .config("spark.sql.shuffle.partitions", args.state_partitions).getOrCreate())
    events = (spark.readStream.format("nsq")  # found by pyspark_nsq, no register call
              .option("topic", args.topic).option("channel", args.channel)
              .option("lookupdHttpAddresses", args.lookupd)
              .option("numPartitions", args.partitions)
              .option("maxMessagesPerTrigger", args.max_per_trigger)
              .option("spoolPath", args.spool)
              .load())
    deduped = (events.withWatermark("timestamp", "1 hour")
               .dropDuplicatesWithinWatermark(["id"]))
    writer = (deduped.writeStream.format("parquet").option("path", args.out)
              .option("checkpointLocation", args.checkpoint))
    writer = writer.trigger(availableNow=True) if args.available_now else \
        writer.trigger(processingTime="5 seconds")
    progress = Progress()
    spark.streams.addListener(progress)
    print(f"archiving topic {args.topic!r} (channel {args.channel!r}) into {args.out}"
          + (": what is queued now, then stop" if args.available_now else
             ": until interrupted"), flush=True)
    writer.start().awaitTermination()
    progress.ended.wait(30)  # the listener hears of the last batch after the query ends
    print(f"archived {progress.messages} messages in {progress.batches} batches into "
          f"{args.out}", flush=True)


if __name__ == "__main__":
    main()
