"""A Spark driver in its own process for the pipeline fault test: NSQ -> Spark -> NSQ.

    python pipeline_driver.py CONFIG_JSON

CONFIG_JSON: {"checkpoint", "spool", "nsqd_tcp", "nsqd_http", "source", "channel",
"sink", "max_per_trigger", "hold_after": batch id or null}. The query reads the
``source`` topic and, in ``foreachBatch``, publishes each row's body prefixed with
``out-`` to the ``sink`` topic with ``df.write.format("nsq")`` and ``publishIds``.
Prints ``PUBLISHED <batch> <rows>`` once a batch's write returned; with ``hold_after``
it then waits inside that batch's function (so the batch is published and not
committed) until the test SIGKILLs it. Without it, Trigger.AvailableNow drains the
source and the driver prints ``DONE``.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import build_session  # noqa: E402


def main() -> None:
    cfg = json.loads(sys.argv[1])
    spark = build_session("nsq-pipeline-driver", master="local[2]")
    from pyspark.sql import functions as F

    df = (spark.readStream.format("nsq")
          .option("topic", cfg["source"]).option("channel", cfg["channel"])
          .option("nsqdTcpAddresses", cfg["nsqd_tcp"])
          .option("nsqdHttpAddresses", cfg["nsqd_http"])
          .option("numPartitions", 2).option("maxInFlight", 1000)
          .option("maxMessagesPerTrigger", cfg["max_per_trigger"])
          .option("idleTimeout", 0.5).option("spoolPath", cfg["spool"]).load())

    def publish(batch, batch_id: int) -> None:
        out = batch.select(F.concat(F.lit(b"out-"), F.col("body")).alias("body"))
        (out.write.format("nsq").option("topic", cfg["sink"])
         .option("nsqdTcpAddresses", cfg["nsqd_tcp"]).option("publishIds", "true")
         .mode("append").save())
        print(f"PUBLISHED {batch_id} {batch.count()}", flush=True)
        if batch_id == cfg.get("hold_after"):
            time.sleep(600)  # published, not committed: the test kills the driver here

    writer = df.writeStream.foreachBatch(publish).option("checkpointLocation",
                                                         cfg["checkpoint"])
    if cfg.get("hold_after") is None:
        q = writer.trigger(availableNow=True).start()
        q.awaitTermination(240)
    else:
        q = writer.trigger(processingTime="0 seconds").start()
        q.awaitTermination(600)
    if q.exception() is not None:
        print(f"FAILED {q.exception()}", flush=True)
        sys.exit(2)
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
