"""The streaming source's fetch tasks on a topic with and without replicas, side by side
in one run: what keeping one row per publish costs (:mod:`nsq_spark.spark._copies`), and
what the ``publish_id`` column costs on its own.

Three nsqds on loopback (the test harness's), one micro-batch of two fetch tasks, each in
a process of its own (as on two executors: their tickets race for the batch's order),
``fetch_stream_partition`` called as Spark calls it, the spool in a temporary directory.
Per round, the same number of publishes, three ways:

* ``plain``: bodies without an envelope, each on one nsqd (spread over the three);
* ``ids``: ``Producer(publish_ids=True)``: one copy each, in a publish envelope (27 bytes
  more), so every chunk takes a ticket and nothing is dropped;
* ``replicas``: ``Producer(replicas=2)``: two copies of each, on two nsqds; half of what
  the tasks fetch are copies.

Reported per case: rows, messages fetched, wall seconds of the batch (both tasks, from
their start to the later end: the last second or so is the idle wait that ends a task
without a share, the same in every case), rows/s and messages/s, and the two tasks' CPU seconds
(``time.process_time`` of their processes: the Reader's IO thread, the writer and copies
threads included) per message and per row; plus the copies' own seconds (``copies``:
tickets and decisions, in their thread) and the seconds spent waiting for the other
task's choosing (``copies_wait``). Run from the repo root::

    flock /tmp/nsq-spark-bench.lock python -m bench.bench_copies [--publishes 100000]
        [--rounds 3] [--max-in-flight 2500]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from typing import Any

CASES = ("plain", "ids", "replicas")


def _ready(_: int) -> None:
    import nsq_spark.spark._fetch  # noqa: F401  (imported before the timing)


def _task(args: tuple[dict[str, str], str, int, int, int | None]) -> dict[str, Any]:
    """One fetch task, in its own process: rows, CPU seconds and its timings."""
    options, spool_path, batch, index, share = args
    from nsq_spark.spark._fetch import fetch_stream_partition
    from nsq_spark.spark._fetch_task import observe_timings
    from nsq_spark.spark.options import parse_read_options
    from nsq_spark.spark._spool import Spool

    timings: list[dict[str, float]] = []
    observe_timings(timings.append)
    opts = parse_read_options(options, streaming=True)
    t0, c0 = time.perf_counter(), time.process_time()
    rows = sum(rb.num_rows for rb in fetch_stream_partition(
        opts, Spool(spool_path, "bench"), batch, index, share, reader_cache=False))
    return {**(timings[-1] if timings else {}), "rows_out": rows,
            "wall": time.perf_counter() - t0, "start": t0, "cpu": time.process_time() - c0}


def _publish(cluster: Any, topic: str, case: str, n: int, size: int) -> int:
    """Publish ``n`` bodies the ``case`` way; returns the copies queued."""
    from nsq_spark._publish.producer import Producer

    bodies = [b"%09d-" % i + b"x" * (size - 10) for i in range(n)]
    kwargs: dict[str, Any] = {"plain": {}, "ids": {"publish_ids": True},
                              "replicas": {"replicas": 2}}[case]
    with Producer(cluster.nsqd_tcp_addresses, **kwargs) as p:
        if case == "plain":  # spread over the three, as the others are
            for i, at in enumerate(range(0, n, 500)):
                with Producer(cluster.nsqd_tcp_addresses[i % 3]) as one:
                    one.mpublish(topic, bodies[at:at + 500])
        else:
            for at in range(0, n, 500):
                p.mpublish(topic, bodies[at:at + 500])
    return n * (2 if case == "replicas" else 1)


def _queued(cluster: Any, topic: str) -> int:
    total = 0
    for node in cluster.nsqds:
        for t in node.stats(topic).get("topics") or []:
            if t["topic_name"] == topic:
                for c in t.get("channels") or []:
                    if c["channel_name"] == "c":
                        total += int(c["depth"])
    return total


def run_case(cluster: Any, pool: Any, case: str, round_: int, args: Any, work: str
             ) -> dict[str, Any]:
    from nsq_spark.spark._backlog import create_channel

    topic = f"copies_{case}_{round_}"
    for http in cluster.nsqd_http_addresses:
        create_channel(http, topic, "c")
    copies = _publish(cluster, topic, case, args.publishes, args.size)
    deadline = time.monotonic() + 60
    while _queued(cluster, topic) < copies and time.monotonic() < deadline:
        time.sleep(0.1)
    spool = os.path.join(work, f"{case}-{round_}")
    os.makedirs(os.path.join(spool, "bench", "batch-000000000001"))
    options = {"topic": topic, "channel": "c",
               "nsqdTcpAddresses": ",".join(cluster.nsqd_tcp_addresses),
               "spoolPath": spool, "maxInFlight": str(args.max_in_flight),
               "idleTimeout": "1", "maxFetchPeriod": "120"}
    # no share: each task takes what comes until idle, as a batch draining a backlog
    results = pool.map(_task, [(options, spool, 1, i, None) for i in range(2)])
    wall = (max(r["start"] + r["wall"] for r in results)
            - min(r["start"] for r in results))
    rows = sum(r["rows_out"] for r in results)
    cpu = sum(r["cpu"] for r in results)
    fetched = copies - _queued(cluster, topic)
    return {"case": case, "round": round_, "rows": rows, "messages": fetched,
            "wall_s": round(wall, 3), "rows_per_s": round(rows / wall),
            "messages_per_s": round(fetched / wall),
            "cpu_s": round(cpu, 3), "cpu_us_per_message": round(cpu / fetched * 1e6, 2),
            "cpu_us_per_row": round(cpu / rows * 1e6, 2),
            "copies_dropped": int(sum(r.get("copies_dropped", 0) for r in results)),
            "copies_s": round(sum(r.get("copies", 0.0) for r in results), 3),
            "copies_wait_s": round(sum(r.get("copies_wait", 0.0) for r in results), 3),
            "seen_s": round(sum(r.get("seen", 0.0) for r in results), 3),
            "convert_s": round(sum(r.get("convert", 0.0) for r in results), 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--publishes", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=100, help="body bytes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="rounds not counted")
    ap.add_argument("--max-in-flight", type=int, default=2500)
    args = ap.parse_args(argv)

    from nsq_spark.testing import NSQCluster

    print(json.dumps({"loadavg": os.getloadavg(), "cpus": os.cpu_count(),
                      "publishes": args.publishes, "size": args.size}), flush=True)
    out: list[dict[str, Any]] = []
    ctx = mp.get_context("spawn")
    with NSQCluster(nsqd=3, lookupd=0) as cluster, \
            tempfile.TemporaryDirectory(prefix="nsq-bench-copies-") as work, \
            ctx.Pool(2) as pool:
        pool.map(_ready, [0, 1])  # the workers are up before the timing
        for round_ in range(args.warmup + args.rounds):
            for case in CASES:
                r = run_case(cluster, pool, case, round_, args, work)
                if round_ >= args.warmup:
                    out.append(r)
                print(json.dumps({**r, "warmup": round_ < args.warmup}), flush=True)
    for case in CASES:
        mine = [r for r in out if r["case"] == case]
        print(json.dumps({"case": case, "median_rows_per_s": statistics.median(
            r["rows_per_s"] for r in mine), "median_messages_per_s": statistics.median(
            r["messages_per_s"] for r in mine), "median_cpu_us_per_message":
            statistics.median(r["cpu_us_per_message"] for r in mine),
            "median_cpu_us_per_row": statistics.median(r["cpu_us_per_row"] for r in mine)}),
            flush=True)
    print(json.dumps({"loadavg_end": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
