"""What the ``nsq`` source's driver does per micro-batch, call by call, without Spark.

The part of the per-batch cost over ``pyrate`` (``bench_spark_latency
--with-python-floor``) that is the driver's own: one nsqd on loopback, one message
published before each batch and seen in the channel (so that every ``latestOffset``
plans one, as at 20 msg/s with the default trigger), then Spark's three calls in its order: ``latestOffset``
(the backlog measured on nsqd, the last batch's summary read, its spool tidied),
``partitions`` (the batch's directory, its marker and its started record, each written
durably) and ``commit`` (the batch's spool deleted, the redelivery index pruned). The
channel is emptied after each batch (the fetch tasks' part: not run here). Reported:
the median wall milliseconds of each call over ``--batches`` batches (the first
``--warmup`` not counted), the backlog measurement alone (``/stats``), and the fsyncs
in each call per batch.

    NSQ_BIN_DIR=... flock /tmp/nsq-spark-bench.lock python -m bench.bench_driver_batch \\
        [--batches 100] [--spool DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import urllib.request
from typing import Any, Callable


def _post(url: str, data: bytes = b"x") -> None:
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5) as resp:
        resp.read()


def _wait_depth(http: str, want: int) -> None:
    """Until nsqd's channel holds ``want`` messages (a PUB reaches the channel from the
    topic's queue a moment after it returns)."""
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"http://{http}/stats?format=json&topic=driver"
                                    "&channel=c", timeout=5) as resp:
            stats = json.loads(resp.read())
        depth = sum(c["depth"] for t in stats["topics"] for c in t["channels"])
        if depth == want:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the channel holds {depth} messages, not {want}, after 10 s")
        time.sleep(0.001)


def measure(http: str, tcp: str, spool: str, batches: int, warmup: int) -> dict[str, Any]:
    from nsq_spark.spark.datasource import NSQStreamReader

    _post(f"http://{http}/topic/create?topic=driver", b"")
    _post(f"http://{http}/channel/create?topic=driver&channel=c", b"")
    reader = NSQStreamReader({"topic": "driver", "channel": "c", "spoolPath": spool,
                              "nsqdTcpAddresses": tcp, "nsqdHttpAddresses": http})
    subscription = reader._subscription
    backlogs = subscription.backlogs
    times: dict[str, list[float]] = {"latestOffset": [], "partitions": [], "commit": [],
                                     "measure": []}
    calls = ("latestOffset", "partitions", "commit")
    synced = dict.fromkeys(calls, 0)  # fsyncs in each call

    def timed_backlogs() -> Any:
        t = time.perf_counter()
        out = backlogs()
        times["measure"].append(time.perf_counter() - t)
        return out

    subscription.backlogs = timed_backlogs  # type: ignore[method-assign]
    fsyncs = [0]
    real_fsync: Callable[[int], None] = os.fsync

    def counted_fsync(fd: int) -> None:
        fsyncs[0] += 1
        real_fsync(fd)

    os.fsync = counted_fsync  # type: ignore[assignment]
    try:
        start = reader.initialOffset()
        for i in range(warmup + batches):
            if i == warmup:
                synced = dict.fromkeys(calls, 0)
                for v in times.values():
                    v.clear()
            _post(f"http://{http}/pub?topic=driver")
            _wait_depth(http, 1)
            f0, t0 = fsyncs[0], time.perf_counter()
            end = reader.latestOffset(start, None)
            f1, t1 = fsyncs[0], time.perf_counter()
            if int(end["batch"]) != int(start["batch"]) + 1:
                raise RuntimeError(f"batch {i}: no batch planned for a backlog of 1 ({end})")
            reader.partitions(start, end)
            f2, t2 = fsyncs[0], time.perf_counter()
            reader.commit(end)
            f3, t3 = fsyncs[0], time.perf_counter()
            for call, n in zip(calls, (f1 - f0, f2 - f1, f3 - f2)):
                synced[call] += n
            times["latestOffset"].append(t1 - t0)
            times["partitions"].append(t2 - t1)
            times["commit"].append(t3 - t2)
            _post(f"http://{http}/channel/empty?topic=driver&channel=c", b"")
            start = end
    finally:
        os.fsync = real_fsync  # type: ignore[assignment]
    out: dict[str, Any] = {"batches": batches}
    for name, values in times.items():
        out[f"{name}_ms_p50"] = round(1e3 * statistics.median(values), 2)
    out["driver_ms_p50"] = round(1e3 * statistics.median(
        a + b + c for a, b, c in zip(times["latestOffset"], times["partitions"],
                                     times["commit"])), 2)
    for call in calls:
        out[f"{call}_fsyncs"] = round(synced[call] / batches, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--spool", default=None, help="spool dir (default: a temp dir on /tmp)")
    args = ap.parse_args(argv)
    if args.batches < 1 or args.warmup < 0:
        ap.error("--batches must be at least 1 and --warmup at least 0")
    from nsq_spark.testing import NSQCluster

    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    with tempfile.TemporaryDirectory(prefix="bench-driver-", dir=args.spool) as spool, \
            NSQCluster(nsqd=1, lookupd=0) as cluster:
        out = measure(cluster.nsqd_http_addresses[0], cluster.nsqd_tcp_addresses[0], spool,
                      args.batches, args.warmup)
    with open("/proc/loadavg") as f:
        out["load"] = f"{load} -> " + " ".join(f.read().split()[:3])
    print(json.dumps(out))
    print(f"per batch (median of {args.batches}): driver {out['driver_ms_p50']} ms = "
          f"latestOffset {out['latestOffset_ms_p50']} (nsqd /stats "
          f"{out['measure_ms_p50']}) + partitions {out['partitions_ms_p50']} + commit "
          f"{out['commit_ms_p50']}; fsyncs per batch "
          + ", ".join(f"{c} {out[c + '_fsyncs']}" for c in ("latestOffset", "partitions",
                                                              "commit"))
          + f"; load {out['load']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
