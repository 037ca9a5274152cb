"""The streaming fetch task's CPU per message, stage by stage, without Spark, against the
Reader's block path in the same run.

One nsqd on loopback (its defaults: a backlog beyond 10,000 messages waits in its disk
queue, as in ``bench_spark``). Per round: ``--messages`` bodies of ``--size`` bytes are
queued in a channel, and one micro-batch of two fetch tasks drains them, each in a
process of its own (as on two executors, so each sees the other's chunks: the redelivery
index reads its peer's keys), ``fetch_stream_partition`` called as Spark calls it with a
share of half the backlog each, the spool in a temporary directory; then the same number
of messages, queued the same way, is drained by the Reader's block path alone
(``get_blocks`` + ``finish_blocks``, ``bench_spark.reader_blocks_child``) in a process of
its own. Nothing of Spark runs: the hand-over is a generator step, so what Spark's
worker does with a record batch is not in these figures (``bench_spark`` has them).

Reported per round, in CPU microseconds per message: the two tasks' processes (every
thread), split by stage as :class:`nsq_spark.spark._fetch_task.TaskTimings` times them
(``fetch``: the task's calls into the Reader; ``io``: the Reader's IO thread; ``convert``:
Arrow building; ``spool``: the task's fence checks and submits; ``spool_write``: the
writer threads; ``seen``: the redelivery index; ``copies``; ``handover``; ``loop``: the
task's thread outside every stage); the Reader alone; their ratio. Run from the repo
root::

    flock /tmp/nsq-spark-bench.lock python -m bench.bench_fetch_stages [--messages 300000]
        [--rounds 3] [--max-in-flight 2500]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.bench_spark import _publish, stage_profile


def _part(new: str, old: str) -> Any:
    """The connector's part at its path since 0.2.0 (``new``), else at the path it had
    before (``old``): ``bench.ab`` runs this file against revisions from before the parts
    became private (from 344fa93 on, where ``bench_spark`` has what is imported above).
    Here, not in ``bench_spark``: ``bench.ab`` copies only the benchmark it runs."""
    import importlib

    try:
        return importlib.import_module(new)
    except ModuleNotFoundError as e:
        if e.name is None or not new.startswith(e.name):
            raise   # something the part itself imports is missing: not the move
        return importlib.import_module(old)


def _ready(_: int) -> None:
    _part("nsq_spark.spark._fetch", "nsq_spark.spark.fetch")  # imported before the timing
    import pyarrow.compute  # noqa: F401


def _task(args: tuple[dict[str, str], str, int, int, int | None]) -> dict[str, Any]:
    """One fetch task, in its own process: its timings, rows and process CPU."""
    options, spool_path, batch, index, share = args
    from nsq_spark.spark.options import parse_read_options

    fetch_stream_partition = _part("nsq_spark.spark._fetch",
                                   "nsq_spark.spark.fetch").fetch_stream_partition
    observe_timings = _part("nsq_spark.spark._fetch_task",
                            "nsq_spark.spark.fetch_task").observe_timings
    Spool = _part("nsq_spark.spark._spool", "nsq_spark.spark.spool").Spool

    timings: list[dict[str, float]] = []
    remove = observe_timings(timings.append)
    try:
        opts = parse_read_options(options, streaming=True)
        rows = sum(rb.num_rows for rb in fetch_stream_partition(
            opts, Spool(spool_path, "bench"), batch, index, share, reader_cache=False))
    finally:
        remove()
    return {**(timings[-1] if timings else {}), "rows_out": rows}


def _reader(addr: str, topic: str, n: int, max_in_flight: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_spark", "--reader-child", addr, topic, "c",
         str(n), str(max_in_flight)], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the Reader's block path failed: {(out.stderr or out.stdout)[-2000:]}")
    doc: dict[str, Any] = json.loads(lines[-1])
    return doc


def run_round(cluster: Any, pool: Any, round_: int, args: Any, work: str) -> dict[str, Any]:
    http, addr = cluster.nsqd_http_addresses[0], cluster.nsqd_tcp_addresses[0]
    topic = f"stages{round_}"
    _publish(http, topic, args.messages, args.size, "c")
    spool = os.path.join(work, f"spool-{round_}")
    os.makedirs(os.path.join(spool, "bench", "batch-000000000001"))
    options = {"topic": topic, "channel": "c", "nsqdTcpAddresses": addr,
               "spoolPath": spool, "maxInFlight": str(args.max_in_flight),
               "idleTimeout": "2", "maxFetchPeriod": "600"}
    half = args.messages // 2
    t0 = time.perf_counter()
    tasks = pool.map(_task, [(options, spool, 1, i, half + (i == 0) * (args.messages % 2))
                             for i in range(2)])
    wall = time.perf_counter() - t0
    rows = sum(t["rows_out"] for t in tasks)
    _publish(http, f"reader{round_}", args.messages, args.size, "c")
    reader = _reader(addr, f"reader{round_}", args.messages, args.max_in_flight)
    profile = stage_profile(tasks)
    return {"round": round_, "rows": rows, "tasks_wall_s": round(wall, 3),
            "task_cpu_us_per_msg": profile,
            "reader_blocks_cpu_us_per_msg": round(reader["cpu_us_per_msg"], 3),
            "reader_blocks_s": round(reader["seconds"], 3),
            "ratio_to_reader": round(profile["all"] / reader["cpu_us_per_msg"], 3),
            "redelivered": sum(int(t.get("redelivered", 0)) for t in tasks),
            "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=100, help="body bytes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="rounds not counted")
    ap.add_argument("--max-in-flight", type=int, default=2500)
    args = ap.parse_args(argv)
    if args.messages < 2 or args.rounds < 1 or args.warmup < 0:
        ap.error("--messages must be at least 2, --rounds at least 1, --warmup at least 0")

    from nsq_spark.testing import NSQCluster

    out: list[dict[str, Any]] = []
    ctx = mp.get_context("spawn")
    with NSQCluster(nsqd=1, lookupd=0) as cluster, \
            tempfile.TemporaryDirectory(prefix="nsq-bench-stages-") as work, \
            ctx.Pool(2) as pool:
        pool.map(_ready, [0, 1])  # the workers are up before the timing
        for round_ in range(args.warmup + args.rounds):
            r = run_round(cluster, pool, round_, args, work)
            if round_ >= args.warmup:
                out.append(r)
            print(json.dumps({**r, "warmup": round_ < args.warmup}), flush=True)
    summary = {"messages": args.messages, "rounds": len(out),
               "median_task_cpu_us_per_msg": statistics.median(
                   r["task_cpu_us_per_msg"]["all"] for r in out),
               "median_reader_blocks_cpu_us_per_msg": statistics.median(
                   r["reader_blocks_cpu_us_per_msg"] for r in out),
               "median_ratio_to_reader": statistics.median(r["ratio_to_reader"] for r in out)}
    print(json.dumps(summary), flush=True)
    bad = [r for r in out if r["rows"] != args.messages]
    for r in bad:
        print(f"round {r['round']}: {r['rows']} rows of {args.messages} messages",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
