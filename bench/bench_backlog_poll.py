"""What the driver's idle polling of nsqd costs, and what it adds to new-data latency.

With the default trigger Spark calls the source's ``latestOffset`` about every 10 ms
while nothing comes. This calls it at that pace against one real nsqd and nsqlookupd
(no Spark: the driver's code alone, in this process), for several values of
``backlogPollInterval``, and reports:

* idle: measurements per second (each a lookupd ``/lookup`` plus an nsqd ``/stats``) and
  the CPU this process spent, over 5 s with nothing published;
* detection: after at least 0.3 s of idle polling, one message is published and the
  calls go on at the same pace until one plans a batch; the delay, 20 times (p50, p95).

Run: ``NSQ_BIN_DIR=... python bench/bench_backlog_poll.py``. Figures in
``nsq_spark/spark/options.py`` (``DEFAULT_POLL_INTERVAL``).
"""

from __future__ import annotations

import tempfile
import time
import urllib.request

from nsq_spark.spark._backlog import create_channel
from nsq_spark.spark.datasource import NSQStreamReader
from nsq_spark.testing import NSQCluster

PACE = 0.01  # Spark's idle trigger pace with the default trigger


def publish(http_address: str, topic: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(
            f"http://{http_address}/pub?topic={topic}", data=b"x"), timeout=5) as resp:
        resp.read()


def empty(http_address: str, topic: str, channel: str) -> None:
    """What a batch would do to the backlog: take it."""
    with urllib.request.urlopen(urllib.request.Request(
            f"http://{http_address}/channel/empty?topic={topic}&channel={channel}",
            data=b"", method="POST"), timeout=5) as resp:
        resp.read()


def run(cluster: NSQCluster, interval: float, idle_seconds: float = 5.0,
        samples: int = 20) -> str:
    http = cluster.nsqds[0].http_address
    reader = NSQStreamReader({"topic": "poll", "channel": "c",
                              "spoolPath": tempfile.mkdtemp(prefix="poll-bench-"),
                              "lookupdHttpAddresses": cluster.lookupd_http_addresses[0],
                              "backlogPollInterval": str(interval)})
    start = reader.initialOffset()
    reader.latestOffset(start, None)
    subscription = reader._subscription
    measure = subscription.backlogs
    count = [0]

    def counted() -> dict[str, int | None]:
        count[0] += 1
        return measure()

    subscription.backlogs = counted  # type: ignore[method-assign]
    cpu, t0 = time.process_time(), time.monotonic()
    while time.monotonic() - t0 < idle_seconds:
        assert reader.latestOffset(start, None) == start
        time.sleep(PACE)
    cpu = time.process_time() - cpu
    idle_rate = count[0] / idle_seconds
    delays = []
    for i in range(samples):
        until = time.monotonic() + 0.3 + 0.037 * (i % 7)  # idle first, at varying phase
        while time.monotonic() < until:
            reader.latestOffset(start, None)
            time.sleep(PACE)
        publish(http, "poll")
        t = time.monotonic()
        while (end := reader.latestOffset(start, None))["batch"] == start["batch"]:
            time.sleep(PACE)
        delays.append(time.monotonic() - t)
        empty(http, "poll", "c")
        start = end
    delays.sort()
    return (f"backlogPollInterval={interval:<5} idle: {idle_rate:5.1f} measurements/s, "
            f"driver CPU {100 * cpu / idle_seconds:4.1f}% of a core; new data planned after "
            f"p50 {1000 * delays[len(delays) // 2]:4.0f} ms, "
            f"p95 {1000 * delays[int(len(delays) * 0.95)]:4.0f} ms")


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--intervals", default="0,0.05,0.1,0.25",
                    help="backlogPollInterval values, comma-separated (default 0,0.05,0.1,0.25)")
    ap.add_argument("--idle-seconds", type=float, default=5.0)
    ap.add_argument("--samples", type=int, default=20, help="detections per interval")
    args = ap.parse_args(argv)
    with NSQCluster(nsqd=1, lookupd=1) as cluster:
        create_channel(cluster.nsqds[0].http_address, "poll", "c")
        time.sleep(0.5)  # nsqd registers the topic with lookupd
        for interval in (float(x) for x in args.intervals.split(",")):
            print(run(cluster, interval, args.idle_seconds, args.samples), flush=True)


if __name__ == "__main__":
    main()
