"""Per-task cost of a streaming fetch task, without Spark: what one micro-batch's
partition costs on the executor when there are a few messages to take.

One nsqd on loopback; each round publishes ``--messages`` bodies (default 10), then
calls ``fetch_stream_partition`` for the next batch with that share, as a Spark task
would, and times it (from the call to the generator's end: connect or cache take, fetch,
spool, FIN, seal, complete, close or give back). The first ``--warmup`` rounds are not
counted. Run it against any checkout (it passes ``readerCache`` only when asked)::

    PYTHONPATH=<checkout> python bench/bench_fetch_task.py [--rounds 40] [--cache on|off]

Prints one JSON line: median, p90 and mean ms per task, and the median CPU ms of this
process per task (steadier than the wall time on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request


def _mpub(http_address: str, topic: str, bodies: list[bytes]) -> None:
    req = urllib.request.Request(f"http://{http_address}/mpub?topic={topic}",
                                 data=b"\n".join(bodies), method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--messages", type=int, default=10)
    ap.add_argument("--cache", choices=("on", "off", "default"), default="default")
    args = ap.parse_args(argv)

    from nsq_spark.spark import _fetch as fetch
    from nsq_spark.spark._backlog import create_channel
    from nsq_spark.spark.options import parse_read_options
    from nsq_spark.spark._spool import Spool
    from nsq_spark.testing import NSQCluster

    with NSQCluster(nsqd=1, lookupd=0) as cluster, \
            tempfile.TemporaryDirectory(prefix="nsq-fetch-task-") as work:
        http = cluster.nsqd_http_addresses[0]
        topic = "fetch_task_cost"
        create_channel(http, topic, "c")  # the channel exists, as for a running query
        options = {"topic": topic, "channel": "c",
                   "nsqdTcpAddresses": cluster.nsqd_tcp_addresses[0], "spoolPath": work,
                   "idleTimeout": "1", "maxFetchPeriod": "10", "redeliveryWindow": "0"}
        if args.cache != "default":
            options["readerCache"] = "true" if args.cache == "on" else "false"
        opts = parse_read_options(options, streaming=True)
        spool = Spool(work, "q")
        times: list[float] = []
        cpu: list[float] = []  # this process's CPU (the task and the Reader's IO thread)
        for batch in range(1, args.rounds + args.warmup + 1):
            _mpub(http, topic, [b"b-%d-%d" % (batch, i) for i in range(args.messages)])
            time.sleep(0.05)  # the messages are queued before the task starts, as in Spark
            t0, c0 = time.perf_counter(), time.process_time()
            rows = sum(rb.num_rows for rb in fetch.fetch_stream_partition(
                opts, spool, batch, 0, args.messages))
            elapsed = time.perf_counter() - t0
            cpu.append((time.process_time() - c0) * 1000)
            if rows < args.messages:
                raise SystemExit(f"batch {batch}: {rows} of {args.messages} rows")
            if batch > args.warmup:
                times.append(elapsed * 1000)
            spool.delete_upto(batch)
        try:  # the cached Reader goes before its nsqd does (older checkouts have none)
            from nsq_spark.spark._reader_cache import readers
        except ImportError:
            pass
        else:
            readers().close_all()
        times.sort()
        print(json.dumps({"cache": args.cache, "rounds": len(times),
                          "median_ms": round(statistics.median(times), 1),
                          "p90_ms": round(times[int(len(times) * 0.9) - 1], 1),
                          "mean_ms": round(statistics.fmean(times), 1),
                          "cpu_median_ms": round(statistics.median(cpu[args.warmup:]), 1)}))


if __name__ == "__main__":
    main()
