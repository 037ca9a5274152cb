"""A Spark driver on the standalone cluster, run by test_standalone.py in its own process
with the workers' Python (the package installed from its wheel, not this checkout).

    python cluster_driver.py CONFIG_JSON

Prints ``EXECUTOR_NSQ_SPARK <path>`` (where the executors import the package from),
``STARTED`` once the query runs, and ``DONE`` after it has processed everything available
when the file ``cfg["stop_file"]`` appeared. No register call: the source is found by
pyspark's discovery of the installed ``pyspark_nsq`` module.
"""

import json
import os
import sys
import time

# test helpers only (the package itself comes from the installed wheel)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "spark"))
from sparkutil import print_dropped  # noqa: E402


def main() -> None:
    cfg = json.loads(sys.argv[1])
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(cfg["master"]).appName("nsq-cluster-tier")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.memory", "512m")
               .config("spark.executor.memory", "512m")
               .config("spark.executor.cores", "1")
               .config("spark.cores.max", "2")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.pyspark.python", cfg["python"])
               .config("spark.pyspark.driver.python", cfg["python"]))
    for k, v in cfg["executor_env"].items():  # executors need the S3 credentials too
        builder = builder.config(f"spark.executorEnv.{k}", v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    where = spark.sparkContext.parallelize([0], 1).map(
        lambda _: __import__("nsq_spark").__file__).collect()[0]
    print(f"EXECUTOR_NSQ_SPARK {where}", flush=True)
    df = (spark.readStream.format("nsq")
          .option("topic", cfg["topic"]).option("channel", cfg["channel"])
          .option("lookupdHttpAddresses", cfg["lookupd"])
          .option("numPartitions", 2).option("maxInFlight", 1000)
          .option("maxMessagesPerTrigger", cfg["max_per_trigger"])
          .option("idleTimeout", 0.5).option("maxFetchPeriod", 20)
          # the executors keep their Readers between batches (the default, said here
          # because the test kills one that holds them); INFO says when one is reused
          .option("readerCache", "true").option("logLevel", "INFO")
          .option("spoolPath", cfg["spool"]).load())
    q = (df.writeStream.format("parquet").option("path", cfg["output"])
         .option("checkpointLocation", cfg["checkpoint"])
         .trigger(processingTime="500 milliseconds").start())
    print("STARTED", flush=True)
    deadline = time.monotonic() + cfg["max_seconds"]
    while time.monotonic() < deadline and q.isActive and not os.path.exists(cfg["stop_file"]):
        time.sleep(0.2)
    if q.exception() is not None:
        print(f"FAILED {q.exception()}", flush=True)
        sys.exit(2)
    q.processAllAvailable()  # what the source has seen is in the output and committed
    print_dropped(q)
    q.stop()
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
