"""Read one topic, transform, write another topic (a streaming NSQ -> NSQ job).

    python examples/spark_topic_to_topic.py --lookupd 127.0.0.1:4161 \
        --nsqd 127.0.0.1:4150 --source clicks --target clicks_upper \
        --checkpoint /data/ckpt/upper --spool /data/spool/upper

The sink publishes the ``body`` column with MPUB (pipelined, retried by the Producer);
an optional ``topic`` column routes each row, and an optional ``defer_ms`` column
publishes that row with DPUB. The sink is at-least-once, like NSQ: a retried batch is
published again, so consumers of the target topic should deduplicate if it matters.
"""

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lookupd", required=True, help="nsqlookupd HTTP host:port[,...]")
    ap.add_argument("--nsqd", required=True, help="nsqd TCP host:port[,...] to publish to")
    ap.add_argument("--source", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--spool", required=True)
    ap.add_argument("--state-partitions", type=int, default=8,
                    help="partitions of the dedup state (spark.sql.shuffle.partitions; fixed "
                         "by the first run of a checkpoint)")
    args = ap.parse_args()

    # Spark's Python workers run PYSPARK_PYTHON ("python3" if unset), which must have
    # nsq-spark installed: default to this interpreter (a venv works without activating
    # it). On a cluster, point it at a Python with the package on every worker.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # dropDuplicatesWithinWatermark keeps its state in spark.sql.shuffle.partitions parts,
    # each committed every micro-batch; Spark's 200 are sized for clusters: 200 messages
    # took about two minutes with them on 2 cores (see examples/nsq_to_parquet.py)
    spark = (SparkSession.builder.appName("nsq-topic-to-topic")
             .config("spark.sql.shuffle.partitions", args.state_partitions).getOrCreate())
    src = (spark.readStream.format("nsq")
           .option("topic", args.source).option("channel", "to_" + args.target)
           .option("lookupdHttpAddresses", args.lookupd)
           .option("spoolPath", args.spool).load())
    out = (src.withWatermark("timestamp", "10 minutes")
              .dropDuplicatesWithinWatermark(["id"])
              .select(F.upper(F.col("body").cast("string")).alias("body"),
                      # long bodies go to a side topic, to show routing by column
                      F.when(F.length("body") > 1000, F.lit(args.target + "_large"))
                       .alias("topic")))
    (out.writeStream.format("nsq")
        .option("topic", args.target)  # rows whose topic column is null
        .option("nsqdTcpAddresses", args.nsqd)
        .option("checkpointLocation", args.checkpoint)
        .start().awaitTermination())


if __name__ == "__main__":
    main()
