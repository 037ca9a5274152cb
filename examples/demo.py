"""The README's demo (`make demo`): a local NSQ, sample events, read back two ways.

1. Start a real nsqd + nsqlookupd (nsq_spark.testing.NSQCluster, local binaries).
2. Publish 10,000 JSON click events with the Producer (MPUB in batches).
3. Read them with a Spark Structured Streaming query over ``format("nsq")`` -- no
   register call: pyspark finds the ``pyspark_nsq`` module -- with
   ``Trigger.AvailableNow``, counting events per page.
4. Publish five more and read them with the plain Reader's pull API.

Run it from the repo root: ``make demo`` (which sets everything up), or
``.venv/bin/python examples/demo.py`` once set up.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time

from nsq_spark import Producer, Reader
from nsq_spark.testing import NSQCluster

TOPIC = "clicks"
PAGES = ["/", "/pricing", "/docs", "/blog", "/signup"]
EVENTS = 10_000


def sample_events(n: int, seed: int = 7) -> list[bytes]:
    rnd = random.Random(seed)
    return [json.dumps({"user": rnd.randrange(500), "page": rnd.choice(PAGES), "n": i}).encode()
            for i in range(n)]


def spark_session():  # type: ignore[no-untyped-def]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master("local[2]").appName("nsq-spark-demo")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate())


def main() -> int:
    events = sample_events(EVENTS)
    with NSQCluster(nsqd=1, lookupd=1) as cluster, tempfile.TemporaryDirectory() as tmp:
        print(f"nsqd at {cluster.nsqd_tcp_addresses}, nsqlookupd at {cluster.lookupd_http_addresses}")

        with Producer(cluster.nsqd_tcp_addresses) as producer:
            t0 = time.perf_counter()
            for i in range(0, len(events), 1000):
                producer.mpublish(TOPIC, events[i:i + 1000])
            print(f"published {len(events)} events in {time.perf_counter() - t0:.2f}s")

        spark = spark_session()
        spark.sparkContext.setLogLevel("ERROR")
        from pyspark.sql import functions as F

        stream = (spark.readStream.format("nsq")
                  .option("topic", TOPIC).option("channel", "spark")
                  .option("lookupdHttpAddresses", ",".join(cluster.lookupd_http_addresses))
                  .option("spoolPath", os.path.join(tmp, "spool"))
                  .load())
        pages = (stream.select(F.get_json_object(F.col("body").cast("string"), "$.page").alias("page"))
                 .groupBy("page").count())
        query = (pages.writeStream.format("memory").queryName("pages").outputMode("complete")
                 .option("checkpointLocation", os.path.join(tmp, "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(300)
        rows = spark.sql("SELECT page, `count` FROM pages ORDER BY page").collect()
        print("events per page, read by spark.readStream.format('nsq'):")
        for row in rows:
            print(f"  {row['page']:<10} {row['count']}")
        total = sum(row["count"] for row in rows)
        spark.stop()

        # Five more events on the same channel, read with the Reader's pull API.
        with Producer(cluster.nsqd_tcp_addresses) as producer:
            producer.mpublish(TOPIC, sample_events(5, seed=8))
        got = []
        with Reader(TOPIC, "spark", lookupd_http_addresses=cluster.lookupd_http_addresses,
                    max_in_flight=2500) as reader:
            for batch in reader.iter_batches(max_messages=1000, timeout=2.0):
                got.extend(batch)
                reader.finish(batch)
        print(f"the Reader's pull API read {len(got)} new messages on channel 'spark'")

    ok = total == EVENTS and len(got) == 5
    print("demo OK" if ok else f"demo FAILED: spark counted {total}, reader got {len(got)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
