"""A Spark driver in its own process for the crash test: NSQ -> Parquet with a checkpoint.

    python crash_driver.py CONFIG_JSON

CONFIG_JSON: {"checkpoint", "output", "spool", "lookupd", "topic", "channel",
"mode": "run" | "drain", "max_per_trigger"}. ``run`` keeps a processing-time query
going until the process is killed; ``drain`` runs Trigger.AvailableNow and exits.
Prints one ``ROWS <n>`` line per finished micro-batch (the running total of this
process) and ``DONE`` at the end. No register call: the source is found by discovery.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import build_session, print_dropped  # noqa: E402


def main() -> None:
    cfg = json.loads(sys.argv[1])
    # local[2,4]: two cores, up to 4 attempts per task (local mode defaults to 1)
    spark = build_session("nsq-crash-driver", master="local[2,4]")
    df = (spark.readStream.format("nsq")
          .option("topic", cfg["topic"]).option("channel", cfg["channel"])
          .option("lookupdHttpAddresses", cfg["lookupd"])
          .option("numPartitions", 2).option("maxInFlight", 500)
          .option("maxMessagesPerTrigger", cfg.get("max_per_trigger", 10000))
          .option("idleTimeout", 0.5).option("maxFetchPeriod", 20)
          .option("spoolPath", cfg["spool"]).load())
    writer = (df.writeStream.format("parquet").option("path", cfg["output"])
              .option("checkpointLocation", cfg["checkpoint"]))
    if cfg["mode"] == "drain":
        q = writer.trigger(availableNow=True).start()
    else:
        q = writer.trigger(processingTime=cfg.get("interval", "0 seconds")).start()
    seen, total = set(), 0
    deadline = time.monotonic() + cfg.get("max_seconds", 240)
    while time.monotonic() < deadline:
        for p in q.recentProgress:
            if p["batchId"] not in seen:
                seen.add(p["batchId"])
                total += p["numInputRows"]
                print(f"ROWS {total}", flush=True)
        if not q.isActive:
            break
        time.sleep(0.1)
    print_dropped(q)
    if q.exception() is not None:
        print(f"FAILED {q.exception()}", flush=True)
        sys.exit(2)
    q.stop()
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
