"""A live smoke of the checkout on one Python: run by tests/pythons with that version's
cached venv python, the checkout first on PYTHONPATH, ``PYSPARK_PYTHON`` unset (the
library gives Spark's local workers this interpreter: nsq_spark.spark.register).

argv[1]: JSON ``{"nsqd_tcp", "nsqd_http", "lookupd_http", "workdir"}``. Prints one
``CHECK <name> ...`` line per check passed and ``DONE`` at the end; any failure raises
(non-zero exit).
"""

from __future__ import annotations

import json
import os
import sys

import nsq_spark as nsq
from nsq_spark.admin import NsqdClient

cfg = json.loads(sys.argv[1])
print(f"PYTHON {sys.version_info[0]}.{sys.version_info[1]} {sys.executable}", flush=True)
print(f"NSQ_SPARK {os.path.dirname(nsq.__file__)}", flush=True)


def check(name: str, detail: str = "") -> None:
    print(f"CHECK {name} {detail}", flush=True)


topic = "py_smoke"
with NsqdClient(cfg["nsqd_http"]) as admin:
    admin.create_topic(topic)
    for channel in ("reader", "spark"):
        admin.create_channel(topic, channel)
check("admin", "topic and channels created")

sent = [f"m-{i:04d}".encode() for i in range(200)]
with nsq.Producer(cfg["nsqd_tcp"]) as producer:
    producer.publish(topic, sent[0])
    producer.mpublish(topic, sent[1:])
check("producer", f"{len(sent)} published")

got: list[bytes] = []
with nsq.Reader(topic, "reader", lookupd_http_addresses=[cfg["lookupd_http"]],
                max_in_flight=100) as reader:
    while len(got) < len(sent):
        batch = reader.get_batch(max_messages=200, timeout=10)
        assert batch, f"the Reader got {len(got)} of {len(sent)}, then nothing for 10 s"
        got += [m.body for m in batch]
        reader.finish(batch)
assert sorted(got) == sent, (len(got), len(set(got)))
check("reader", f"{len(got)} read through lookupd, each once")

from pyspark.sql import SparkSession  # noqa: E402

import nsq_spark.spark  # noqa: E402

spark = (SparkSession.builder.master("local[1]").appName("nsq-spark-python-smoke")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
nsq_spark.spark.register(spark)
rows: list[bytes] = []
query = (spark.readStream.format("nsq").option("topic", topic).option("channel", "spark")
         .option("nsqdTcpAddresses", cfg["nsqd_tcp"])
         .option("nsqdHttpAddresses", cfg["nsqd_http"])
         .option("spoolPath", os.path.join(cfg["workdir"], "spool"))
         .option("numPartitions", 1).load()
         .writeStream.foreachBatch(
             lambda df, _: rows.extend(bytes(r.body) for r in df.select("body").collect()))
         .option("checkpointLocation", os.path.join(cfg["workdir"], "ckpt"))
         .trigger(availableNow=True).start())
assert query.awaitTermination(180), "the AvailableNow query did not stop by itself"
assert sorted(rows) == sent, (len(rows), len(set(rows)))
check("spark_stream", f"{len(rows)} rows, each once, workers on {sys.executable}")

spark.createDataFrame([(b"back-%d" % i,) for i in range(20)], "body binary") \
    .write.format("nsq").mode("append").option("nsqdTcpAddresses", cfg["nsqd_tcp"]) \
    .option("topic", "py_smoke_back").save()
with NsqdClient(cfg["nsqd_http"]) as admin:
    back = admin.stats(topic="py_smoke_back").topic("py_smoke_back")
assert back is not None and back.message_count == 20, back
check("spark_write", f"{back.message_count} published by df.write.format('nsq')")
spark.stop()
print("DONE", flush=True)
