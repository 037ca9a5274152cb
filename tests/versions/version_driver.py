"""A Spark driver for one pyspark version: run by tests/versions with that version's venv
python, the checkout under test first on PYTHONPATH (so Spark's Python workers see
``pyspark_nsq`` too: the source is found by discovery; ``register()`` is called once
discovery has registered it, to check that it changes nothing).

argv[1]: JSON ``{"nsqd_tcp", "nsqd_http", "workdir"}``. Prints one ``CHECK <name> ...``
line per check passed and ``DONE`` at the end; any failure raises (non-zero exit).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "spark"))
from sparkutil import build_session, http_mpub  # noqa: E402

cfg = json.loads(sys.argv[1])
WORK = cfg["workdir"]
NSQD = {"nsqdTcpAddresses": cfg["nsqd_tcp"], "nsqdHttpAddresses": cfg["nsqd_http"],
        "channel": "spark", "numPartitions": "1", "idleTimeout": "0.3",
        # a fetch task may overshoot its share by what nsqd already sent (maxInFlight)
        "maxInFlight": "20"}
T0 = time.monotonic()


def check(name: str, detail: str = "") -> None:
    print(f"CHECK {name} {time.monotonic() - T0:.1f}s {detail}", flush=True)


def publish(topic: str, prefix: str, n: int, start: int = 0) -> set[bytes]:
    bodies = [f"{prefix}-{i:05d}".encode() for i in range(start, start + n)]
    http_mpub(cfg["nsqd_http"], topic, bodies)
    return set(bodies)


def batch_read(spark, topic: str, n: int) -> list[bytes]:
    df = spark.read.format("nsq").options(**NSQD).option("topic", topic) \
        .option("maxMessages", n).load()
    return [bytes(r.body) for r in df.select("body").collect()]


import pyspark  # noqa: E402

from nsq_spark.spark._compat import API  # noqa: E402

spark = build_session(app=f"nsq-spark-versions-{pyspark.__version__}", master="local[1]",
                      extra={"spark.sql.shuffle.partitions": "1",
                             "spark.default.parallelism": "1"})
print(f"PYSPARK {pyspark.__version__} {API}", flush=True)
import nsq_spark  # noqa: E402

print(f"NSQ_SPARK {os.path.dirname(nsq_spark.__file__)}", flush=True)

# -- batch read and write, found by discovery (pyspark_nsq) ---------------------------
sent = publish("v_batch", "b", 200)
got = batch_read(spark, "v_batch", 200)
assert sorted(got) == sorted(sent), f"batch read: {len(got)} rows, {len(set(got) & sent)} sent"
check("batch_read", f"{len(got)} rows")

rows = [(f"w-{i:03d}".encode(),) for i in range(50)]
spark.createDataFrame(rows, "body binary").write.format("nsq").mode("append") \
    .option("nsqdTcpAddresses", cfg["nsqd_tcp"]).option("topic", "v_write").save()
got = batch_read(spark, "v_write", 50)
assert sorted(got) == sorted(r[0] for r in rows), f"batch write: read back {len(got)}"
check("batch_write", f"{len(got)} rows")

# register() after discovery registered the source, and again: nothing changes (pyspark
# 4.0 refuses a second registration with DATA_SOURCE_ALREADY_EXISTS)
import nsq_spark.spark  # noqa: E402

nsq_spark.spark.register(spark)
nsq_spark.spark.register(spark)
sent = publish("v_register", "r", 20)
got = batch_read(spark, "v_register", 20)
assert sorted(got) == sorted(sent), f"after register(): {len(got)} rows"
check("register_idempotent", f"{len(got)} rows")

# -- streaming read: exactly once across a failed batch and two restarts --------------
topic, ckpt = "v_stream", os.path.join(WORK, "ckpt")
seen: list[bytes] = []
batches: list[int] = []
fail_on = {"batch": 0}  # the first batch: the restart must ask for the initial offset again


def sink(df, batch_id: int) -> None:
    got = [bytes(r.body) for r in df.select("body").collect()]
    if batch_id == fail_on["batch"]:
        # the batch was fetched (spooled, FINished on nsqd) but is never committed: the
        # restart must replay it from the spool, not lose it and not read it twice
        fail_on["batch"] = -1
        raise RuntimeError(f"planned failure of batch {batch_id} ({len(got)} rows)")
    batches.append(batch_id)
    seen.extend(got)


def stream(trigger: dict):
    return (spark.readStream.format("nsq").options(**NSQD).option("topic", topic)
            .option("spoolPath", os.path.join(WORK, "spool"))
            .option("maxMessagesPerTrigger", 100).load()
            .writeStream.foreachBatch(sink).option("checkpointLocation", ckpt)
            .trigger(**trigger).start())


sent = publish(topic, "s", 300)
q = stream({"processingTime": "1 second"})
try:
    q.awaitTermination(90)
    raise AssertionError("the planned failure did not stop the query")
except Exception as exc:  # StreamingQueryException, whatever the version's module
    assert "planned failure" in str(exc), exc
check("stream_failed_batch", f"committed batches {batches}, {len(seen)} rows")
assert batches == [], batches

q = stream({"processingTime": "1 second"})  # restart: replays batch 0, then goes on
q.processAllAvailable()
q.stop()
assert sorted(seen) == sorted(sent), (len(seen), len(set(seen)), len(sent))
check("stream_restart_replays", f"batches {batches}, {len(seen)} rows, each once")

# AvailableNow: 4.2+ drains the backlog in batches of maxMessagesPerTrigger and stops;
# older Spark runs it as one batch (Trigger.Once), capped by maxMessagesPerTrigger
sent |= publish(topic, "s", 250, start=300)
before = len(batches)
q = stream({"availableNow": True})
assert q.awaitTermination(90), "AvailableNow query did not stop by itself"
new = batches[before:]
if API.admission_control:
    assert sorted(seen) == sorted(sent), (len(seen), len(set(seen)), len(sent))
    assert len(new) >= 2, new
else:
    assert len(new) == 1 and 400 <= len(seen) <= 400 + 20, (new, len(seen))
    q = stream({"processingTime": "1 second"})
    q.processAllAvailable()
    q.stop()
    assert sorted(seen) == sorted(sent), (len(seen), len(set(seen)), len(sent))
check("stream_available_now", f"batches {new}, {len(seen)} rows in all, each once")

# -- streaming write -------------------------------------------------------------------
src = os.path.join(WORK, "text")
os.makedirs(src)
with open(os.path.join(src, "part.txt"), "w") as f:
    f.write("".join(f"sw-{i:03d}\n" for i in range(40)))
w = (spark.readStream.format("text").load(src).selectExpr("cast(value as binary) as body")
     .writeStream.format("nsq").option("nsqdTcpAddresses", cfg["nsqd_tcp"])
     .option("topic", "v_swrite").option("checkpointLocation", os.path.join(WORK, "wckpt"))
     .trigger(availableNow=True))
if API.stream_write:
    q = w.start()
    assert q.awaitTermination(90)
    got = batch_read(spark, "v_swrite", 40)
    assert sorted(got) == [f"sw-{i:03d}".encode() for i in range(40)], len(got)
    check("stream_write", f"{len(got)} rows")
else:
    try:
        q = w.start()
        q.awaitTermination(90)
        raise AssertionError("streaming write was not refused")
    except AssertionError:
        raise
    except Exception as exc:
        text = str(exc)
        want = f"streaming writes (df.writeStream.format('nsq')) need pyspark >= 4.1 (found " \
            f"{pyspark.__version__})"
        assert want in text and "SparkVersionError" in text, text[-3000:]
    check("stream_write_refused", want)

spark.stop()
print("DONE", flush=True)
