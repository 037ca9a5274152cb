"""Consumer throughput: pynsq's Reader, go-nsq, and nsq_spark's Reader, same nsqd, same run.

One nsqd (v1.3.0, loopback) gets N messages of 100 bytes, queued in memory, copied into
one channel per consumer (channels are created before the publish, so each holds all N).
Each consumer then drains its channel in a fresh process with ``max_in_flight=2500``; the
clock runs from before the consumer connects until its N-th message was handled:

* ``pynsq``       pynsq's Reader, handler returns True, ``nsq.run()``
* ``go-nsq``      bench/go_consumer (go-nsq v1.1.0, no-op handler), built into bench/out/
* ``msg``         nsq_spark Reader, per-message handler returning True
* ``batch``       nsq_spark Reader, batch handler (list of messages)
* ``pull``        nsq_spark pull API: ``get_batch`` + bulk ``finish`` from the main thread
* ``blocks``      nsq_spark block pull API: ``get_blocks`` + ``finish_blocks`` (no object
                  per message; what the Spark source uses)
* ``aiter``       nsq_spark asyncio iteration: ``async for message in reader`` +
                  ``message.finish()``, on the main thread's loop (no thread)
* ``abatches``    nsq_spark asyncio iteration by batches: ``reader.batches(1000, 0.01)`` +
                  bulk ``finish``
* ``msg-dedup:STORE``, ``batch-dedup:STORE``, ``pull-dedup:STORE`` (STORE: ``opposite``,
                  ``redis``, ``memcached``): the same with ``dedup=`` that structure
                  (an OppositeBloomFilter of 2^22 buckets; a RedisDeduplicator /
                  MemcachedDeduplicator with a one-hour TTL on a redis-server / memcached
                  this benchmark starts): the consumer's cost of deduplication. Run
                  through ``bench.ab`` against the revision before claim-then-commit
                  (#32), the before tree runs its one-step gate (``check_and_set`` per
                  chunk, ``erase`` on a requeue) and this one claims per chunk and
                  commits per loop turn: the two side by side in one run. Not in the
                  default list.
* ``msg-otel``, ``batch-otel``, ``pull-otel``: the same three with
                  ``telemetry=Telemetry(...)`` on OpenTelemetry's SDK (an in-memory metric
                  reader, a tracer provider with no exporter): the cost of switching it
                  on. Not in the default list; the cost of it *off* is ``msg``/``batch``/
                  ``pull`` run through ``bench.ab`` against the revision before it.

Our consumers also report the CPU time of their process per message (all threads: the
IO loop's and the caller's).

Peak RSS of the nsq_spark consumers is measured too (the child's ``VmHWM``; not
``ru_maxrss``, which Linux keeps across fork and exec, so a child reported at least its
parent's peak: a bigger parent showed as a 10 MB bigger consumer), and
``--rss`` repeats the batch, pull and blocks consumers on 10x as many messages to show that it
stays flat.

    flock /tmp/nsq-spark-bench.lock python -m bench.bench_consume [--n 200000] [--rss]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GO_DIR = ROOT / "bench" / "go_consumer"
GO_BIN = ROOT / "bench" / "out" / "go_consumer"
MAX_IN_FLIGHT = 2500
BODY = b"x" * 100


def _maxrss_mb() -> float:
    """This process's own peak RSS: VmHWM belongs to its address space, made new by exec
    (ru_maxrss is carried over from the forked parent, measured: a child of a 200 MB
    parent reports 210 MB)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ---------------------------------------------------------------------------------------
# children: one consumer each, in its own process; print one JSON line


def child_pynsq(addr: str, topic: str, channel: str, n: int) -> dict:
    import nsq  # pynsq
    import tornado.ioloop

    count = [0]
    t0 = time.perf_counter()
    done = [0.0]

    def handler(m):
        count[0] += 1
        if count[0] == n:
            done[0] = time.perf_counter()
            tornado.ioloop.IOLoop.current().stop()
        return True

    nsq.Reader(topic=topic, channel=channel, message_handler=handler,
               nsqd_tcp_addresses=[addr], max_in_flight=MAX_IN_FLIGHT)
    nsq.run()
    return {"messages": count[0], "seconds": done[0] - t0}


def _telemetry_kw(kind: str) -> tuple[str, dict]:
    """``(kind without -otel, Reader keyword arguments)``: telemetry on the SDK for -otel."""
    if not kind.endswith("-otel"):
        return kind, {}
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from nsq_spark.telemetry import Telemetry

    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return kind.removesuffix("-otel"), {"telemetry": Telemetry(meters, TracerProvider())}


#: where the dedup stores of ``-dedup:STORE`` kinds are (set by the parent for its children)
REDIS_ENV, MEMCACHED_ENV = "NSQ_BENCH_REDIS_URL", "NSQ_BENCH_MEMCACHED"


def _dedup_kw(kind: str, topic: str) -> tuple[str, dict]:
    """``(kind without -dedup:STORE, Reader keyword arguments)``."""
    base, sep, store = kind.partition("-dedup:")
    if not sep:
        return kind, {}
    from nsq_spark.dedup import MemcachedDeduplicator, OppositeBloomFilter, RedisDeduplicator

    prefix = f"bench-{topic}-{os.getpid()}"
    if store == "opposite":
        return base, {"dedup": OppositeBloomFilter(1 << 22)}
    if store == "redis":
        return base, {"dedup": RedisDeduplicator(os.environ[REDIS_ENV], 3600, prefix=prefix)}
    if store == "memcached":
        return base, {"dedup": MemcachedDeduplicator(os.environ[MEMCACHED_ENV], 3600,
                                                     prefix=prefix)}
    raise SystemExit(f"unknown dedup store {store!r}: opposite, redis or memcached")


def child_ours(kind: str, addr: str, topic: str, channel: str, n: int) -> dict:
    from nsq_spark import Reader

    kind, dedup = _dedup_kw(kind, topic)
    kind, otel = _telemetry_kw(kind)
    otel.update(dedup)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    if kind in ("pull", "blocks"):
        r = Reader(topic, channel, nsqd_tcp_addresses=[addr], max_in_flight=MAX_IN_FLIGHT,
                   **otel)
        count = 0
        while count < n:
            if kind == "pull":
                batch = r.get_batch(max_messages=5000, timeout=10.0)
                if not batch:
                    break
                count += len(batch)
                r.finish(batch)
            else:
                blocks = r.get_blocks(max_messages=5000, timeout=10.0)
                if not blocks:
                    break
                count += sum(map(len, blocks))
                r.finish_blocks(blocks)
        dt = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        r.close()
        return {"messages": count, "seconds": dt, "cpu_us_per_msg": 1e6 * cpu / max(1, count)}

    if kind in ("aiter", "abatches"):
        return asyncio.run(_iterate(kind, addr, topic, channel, n, t0, cpu0))

    async def main() -> dict:
        done = asyncio.Event()
        count = [0]

        def handler(m):
            count[0] += 1
            if count[0] == n:
                done.set()
            return True

        def batch_handler(msgs):
            count[0] += len(msgs)
            if count[0] >= n:
                done.set()
            return True

        kw = {"message_handler": handler} if kind == "msg" else {"batch_handler": batch_handler}
        kw.update(otel)
        r = Reader(topic, channel, nsqd_tcp_addresses=[addr], max_in_flight=MAX_IN_FLIGHT, **kw)
        try:
            await asyncio.wait_for(done.wait(), 300)
        finally:
            dt = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            await r.aclose()
        return {"messages": count[0], "seconds": dt,
                "cpu_us_per_msg": 1e6 * cpu / max(1, count[0])}

    return asyncio.run(main())


async def _iterate(kind: str, addr: str, topic: str, channel: str, n: int, t0: float,
                   cpu0: float) -> dict:
    from nsq_spark import Reader

    r = Reader(topic, channel, nsqd_tcp_addresses=[addr], max_in_flight=MAX_IN_FLIGHT)
    count = 0
    # bounded: a stalled consumer stops the run instead of hanging it
    async with asyncio.timeout(300):
        if kind == "aiter":
            async for m in r:
                m.finish()
                count += 1
                if count == n:
                    break
        else:  # batches of at most 1000 (below max_in_flight: they fill, see consumer.aiter)
            async for batch in r.batches(1000, timeout=0.01):
                r.finish(batch)
                count += len(batch)
                if count >= n:
                    break
    dt = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    await r.aclose()
    return {"messages": count, "seconds": dt, "cpu_us_per_msg": 1e6 * cpu / max(1, count)}


def child_main(argv: list[str]) -> None:
    kind, addr, topic, channel, n = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    if kind == "pynsq":
        res = child_pynsq(addr, topic, channel, n)
    else:
        res = child_ours(kind, addr, topic, channel, n)
    res["msg_per_s"] = res["messages"] / res["seconds"] if res["seconds"] else 0.0
    res["maxrss_mb"] = _maxrss_mb()
    print(json.dumps(res), flush=True)


# ---------------------------------------------------------------------------------------
# parent


def _post(url: str, data: bytes = b"") -> None:
    with urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST"),
                                timeout=60) as resp:
        resp.read()


def publish(http: str, topic: str, n: int, chunk: int = 10000) -> None:
    payload_one = len(BODY).to_bytes(4, "big") + BODY
    full = chunk.to_bytes(4, "big") + payload_one * chunk
    sent = 0
    while sent < n:
        k = min(chunk, n - sent)
        data = full if k == chunk else k.to_bytes(4, "big") + payload_one * k
        _post(f"http://{http}/mpub?topic={topic}&binary=true", data)
        sent += k


def go_binary() -> str | None:
    if GO_BIN.exists():
        return str(GO_BIN)
    go = shutil.which("go")
    if go is None:
        return None
    GO_BIN.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([go, "build", "-o", str(GO_BIN), "."], cwd=GO_DIR, check=True)
    return str(GO_BIN)


def run_child(kind: str, addr: str, topic: str, channel: str, n: int) -> dict:
    if kind == "go-nsq":
        binary = go_binary()
        if binary is None:
            return {"error": "go toolchain not found"}
        cmd = [binary, "-nsqd", addr, "-topic", topic, "-channel", channel, "-n", str(n),
               "-max-in-flight", str(MAX_IN_FLIGHT)]
    else:
        cmd = [sys.executable, "-m", "bench.bench_consume", "--child", kind, addr, topic,
               channel, str(n)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr or out.stdout)[-500:]}
    return json.loads(lines[-1])


def _dedup_servers(kinds: list[str], stack: contextlib.ExitStack) -> None:
    """Start the redis-server / memcached the kinds need (stopped with ``stack``); their
    addresses go to the children through the environment."""
    from nsq_spark.testing import MemcachedServer, RedisServer

    if any(k.endswith("-dedup:redis") for k in kinds):
        os.environ[REDIS_ENV] = stack.enter_context(RedisServer()).url
    if any(k.endswith("-dedup:memcached") for k in kinds):
        mc = stack.enter_context(MemcachedServer(memory_mb=256))
        os.environ[MEMCACHED_ENV] = "%s:%d" % mc.address


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="messages per consumer")
    ap.add_argument("--kinds", default="pynsq,go-nsq,msg,batch,pull,blocks,aiter,abatches")
    ap.add_argument("--rss", action="store_true",
                    help="also run batch, pull and blocks on 10x the messages (peak RSS)")
    ap.add_argument("--child", nargs=5, metavar=("KIND", "ADDR", "TOPIC", "CHANNEL", "N"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args.child)
        return

    sys.path.insert(0, str(ROOT))
    from nsq_spark.testing import NSQCluster

    kinds = [k for k in args.kinds.split(",") if k]
    runs: list[tuple[str, int]] = [(k, args.n) for k in kinds]
    if args.rss:
        runs += [("batch", args.n * 10), ("pull", args.n * 10), ("blocks", args.n * 10)]
    results = []
    total = sum(n for _, n in runs)
    # everything in memory: no disk queue in the measurement
    with contextlib.ExitStack() as stack, \
            NSQCluster(nsqd=1, lookupd=0, mem_queue_size=max(total, 10000) + 10) as cluster:
        _dedup_servers(kinds, stack)
        http, addr = cluster.nsqd_http_addresses[0], cluster.nsqd_tcp_addresses[0]
        for i, (kind, n) in enumerate(runs):
            topic = f"bench{i}"
            _post(f"http://{http}/topic/create?topic={topic}")
            _post(f"http://{http}/channel/create?topic={topic}&channel=c")
            t0 = time.perf_counter()
            publish(http, topic, n)
            pub_s = time.perf_counter() - t0
            res = run_child(kind, addr, topic, "c", n)
            res.update(kind=kind, n=n, publish_s=round(pub_s, 2))
            # the channel must be empty: every message was consumed and finished
            stats = json.loads(urllib.request.urlopen(
                f"http://{http}/stats?format=json&topic={topic}", timeout=10).read())
            ch = stats["topics"][0]["channels"][0]
            res["left_in_channel"] = ch["depth"] + ch["in_flight_count"]
            results.append(res)
            print(json.dumps(res), flush=True)
            # free nsqd's memory before the next run
            _post(f"http://{http}/topic/delete?topic={topic}")

    print()
    w = max(10, *(len(r["kind"]) for r in results))
    print(f"{'consumer':<{w}} {'messages':>9} {'msg/s':>10} {'seconds':>8} {'peak RSS MB':>12} "
          f"{'CPU us/msg':>11}")
    for r in results:
        if "error" in r:
            print(f"{r['kind']:<{w}} error: {r['error'][:200]}")
            continue
        rss = f"{r['maxrss_mb']:.0f}" if "maxrss_mb" in r else "-"
        cpu = f"{r['cpu_us_per_msg']:.2f}" if "cpu_us_per_msg" in r else "-"
        print(f"{r['kind']:<{w}} {r['messages']:>9} {r['msg_per_s']:>10,.0f} "
              f"{r['seconds']:>8.2f} {rss:>12} {cpu:>11}")
    print(f"\n(python {sys.version.split()[0]}, {os.cpu_count()} CPUs, nsqd v1.3.0 loopback, "
          f"max_in_flight {MAX_IN_FLIGHT}, {len(BODY)}-byte bodies)")


if __name__ == "__main__":
    main()
