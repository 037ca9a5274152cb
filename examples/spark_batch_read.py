"""A batch job: take up to N messages off an NSQ channel and summarise them.

    python examples/spark_batch_read.py --nsqd 127.0.0.1:4150 --topic events \
        --channel report --max-messages 100000

Reading CONSUMES: every message this job reads is FINished on nsqd and no other consumer
of the channel will see it. A chunk is FINished once Spark has taken it, so if the job
fails later those messages are not returned. For a replayable read, run the streaming
source with ``Trigger.AvailableNow`` (examples/nsq_to_parquet.py --available-now).
"""

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nsqd", required=True, help="nsqd TCP host:port[,...]")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--channel", default="report")
    ap.add_argument("--max-messages", type=int, default=100_000)
    args = ap.parse_args()

    # Spark's Python workers run PYSPARK_PYTHON ("python3" if unset), which must have
    # nsq-spark installed: default to this interpreter (a venv works without activating
    # it). On a cluster, point it at a Python with the package on every worker.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.appName("nsq-batch").getOrCreate()
    df = (spark.read.format("nsq")
          .option("topic", args.topic).option("channel", args.channel)
          .option("nsqdTcpAddresses", args.nsqd)
          .option("maxMessages", args.max_messages)
          .option("idleTimeout", 2)  # stop when the channel has been empty for 2 s
          .load()
          .cache())  # read once: a second evaluation would consume other messages
    (df.groupBy("nsqd_address")
       .agg(F.count("*").alias("messages"), F.sum(F.length("body")).alias("bytes"),
            F.min("timestamp").alias("oldest"), F.max("attempts").alias("max_attempts"))
       .show(truncate=False))


if __name__ == "__main__":
    main()
