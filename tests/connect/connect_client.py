"""A Spark Connect client that cannot import nsq-spark: the source runs on the server.

Run with ``python -I`` (no PYTHONPATH, no user site, no script directory on sys.path).
Before pyspark is imported, every sys.path entry that holds ``nsq_spark`` or
``pyspark_nsq`` (the compat editable install's checkout line) is dropped and an import
of either is refused, so what works below works for a client machine without the
package. argv[1]: JSON ``{"remote", "nsqd_tcp", "nsqd_http", "batch_topic",
"stream_topic", "n", "spool", "checkpoint"}``. Prints ``CHECK`` lines and ``DONE``.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys

BLOCKED = ("nsq_spark", "pyspark_nsq")
sys.path[:] = [p for p in sys.path if not any(
    os.path.exists(os.path.join(p or ".", name)) or
    os.path.exists(os.path.join(p or ".", name + ".py")) for name in BLOCKED)]


class _Refuse(importlib.abc.MetaPathFinder):
    """A client machine without nsq-spark: importing it fails."""

    def find_spec(self, name, path=None, target=None):  # type: ignore[override]
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (the client has no nsq-spark)")
        return None


sys.meta_path.insert(0, _Refuse())
for name in BLOCKED:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError(f"the client can import {name}")
print("CLIENT_WITHOUT nsq_spark pyspark_nsq", flush=True)

from pyspark.sql import SparkSession  # noqa: E402

cfg = json.loads(sys.argv[1])
spark = SparkSession.builder.remote(cfg["remote"]).getOrCreate()
opts = {"nsqdTcpAddresses": cfg["nsqd_tcp"], "nsqdHttpAddresses": cfg["nsqd_http"],
        "channel": "spark", "numPartitions": "1", "idleTimeout": "0.3"}
n = cfg["n"]

# batch read: the server finds the format by discovery (its Python sees pyspark_nsq)
rows = (spark.read.format("nsq").options(**opts).option("topic", cfg["batch_topic"])
        .option("maxMessages", n).load().select("body", "topic").collect())
bodies = sorted(bytes(r.body) for r in rows)
assert bodies == [b"cb-%05d" % i for i in range(n)], (len(bodies), bodies[:3])
assert {r.topic for r in rows} == {cfg["batch_topic"]}
print(f"CHECK connect_batch_read {len(rows)} rows", flush=True)

# streaming read, Trigger.AvailableNow into the memory sink, then queried
q = (spark.readStream.format("nsq").options(**opts).option("topic", cfg["stream_topic"])
     .option("spoolPath", cfg["spool"]).option("maxMessagesPerTrigger", n // 2).load()
     .writeStream.format("memory").queryName("nsq_connect")
     .option("checkpointLocation", cfg["checkpoint"]).trigger(availableNow=True).start())
assert q.awaitTermination(120), "the AvailableNow query did not stop by itself"
batches = len(q.recentProgress)
bodies = sorted(bytes(r.body) for r in spark.sql("select body from nsq_connect").collect())
assert bodies == [b"cs-%05d" % i for i in range(n)], (len(bodies), len(set(bodies)))
print(f"CHECK connect_stream_read {len(bodies)} rows, each once, in {batches} batches",
      flush=True)
spark.stop()
print("DONE", flush=True)
