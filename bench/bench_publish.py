"""Publishing benchmark: nsq_spark's Producer against pynsq 0.9.1's Writer, same nsqd,
same run.

One nsqd v1.3.0 on 127.0.0.1 (``--mem-queue-size`` large so nothing touches disk; each
case publishes to its own topic, deleted afterwards). Messages are 100 bytes.

Cases (msg/s = messages acknowledged by nsqd per second of wall time):

* ``pynsq Writer.mpub``: batches of 1000, every mpub issued at once with a callback
  (pynsq's natural pipelined use), in a subprocess with its own tornado loop.
* ``pynsq Writer.pub``: one message per PUB, all issued at once with callbacks.
* ``ours mpublish (blocking)``: ``Producer.mpublish`` in a loop, each call waiting for its OK.
* ``ours mpublish_async (pipelined)``: ``mpublish_async`` futures, a window of 16 in flight.
* ``ours ampublish (asyncio)``: ``await producer.ampublish`` in a loop (no thread).
* ``ours publish (blocking, 1 thread)``: ``publish`` in a loop: round-trip bound.
* ``ours publish (blocking, 16 threads)``: 16 threads calling ``publish``; the IO thread
  pipelines them on one connection.
* ``ours publish_async (1 thread)``: ``publish_async`` futures, windows of 10,000.
* ``ours publish_nowait (asyncio)``: ``publish_nowait`` futures on the producer's own loop,
  windows of 10,000, each future awaited.

Run from the repo root (one benchmark at a time on the machine)::

    flock /tmp/nsq-spark-bench.lock python -m bench.bench_publish [--messages 500000]

``--replication`` runs the replication table instead, against three nsqd: the same
Producer with publish ids off and on (no replicas), and with ``replicas=1``, ``2`` and
``3`` (ids implied, the default write quorum), side by side in one run. Three ways of
publishing each: ``publish`` in a loop (1 thread, round-trip bound), ``mpublish`` of 1000
bodies, and ``publish_async`` in windows of 10,000. msg/s counts *publishes* (a message
on three nsqds is one); CPU is this process's (all its threads) per publish, in
microseconds; nsqd's own CPU is not in it. Every case checks that the nsqd together hold
messages x replicas copies::

    flock /tmp/nsq-spark-bench.lock python -m bench.bench_publish --replication
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nsq_spark.producer import Producer  # noqa: E402
from nsq_spark.testing import NSQCluster  # noqa: E402

BODY = b"x" * 100


def _http(addr: str, path: str) -> bytes:
    req = urllib.request.Request(f"http://{addr}{path}", data=b"" if "delete" in path else None)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


def _count(http_addr: str, topic: str) -> int:
    stats = json.loads(_http(http_addr, f"/stats?format=json&topic={topic}"))
    return sum(t["message_count"] for t in stats["topics"] if t["topic_name"] == topic)


_PYNSQ = textwrap.dedent("""
    import json, sys, time
    import nsq, tornado.ioloop
    addr, topic, mode, n, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    body = b"x" * 100
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([addr])
    state = {"pending": 0, "fail": 0, "t0": 0.0}
    def done(conn, data):
        if isinstance(data, Exception):
            state["fail"] += 1
        state["pending"] -= 1
        if state["pending"] == 0:
            state["t1"] = time.perf_counter()
            loop.add_callback(loop.stop)
    def go():
        if not writer.conns:
            loop.call_later(0.05, go)
            return
        state["t0"] = time.perf_counter()
        if mode == "mpub":
            bodies = [body] * batch
            state["pending"] = n // batch
            for _ in range(n // batch):
                writer.mpub(topic, bodies, callback=done)
        else:
            state["pending"] = n
            for _ in range(n):
                writer.pub(topic, body, callback=done)
    loop.add_callback(go)
    loop.call_later(600, loop.stop)
    loop.start()
    print(json.dumps({"seconds": state.get("t1", time.perf_counter()) - state["t0"],
                      "failures": state["fail"], "pending": state["pending"]}))
""")


def pynsq_case(addr: str, http_addr: str, topic: str, mode: str, n: int, batch: int) -> float:
    proc = subprocess.run([sys.executable, "-c", _PYNSQ, addr, topic, mode, str(n), str(batch)],
                          capture_output=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.decode(errors="replace"))
    res = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    if res["failures"] or res["pending"]:
        raise RuntimeError(f"pynsq {mode}: {res}")
    count = _count(http_addr, topic)
    assert count == n, (count, n)
    return n / res["seconds"]


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def ours_cases(addr: str, http_addr: str, n_mpub: int, n_pub: int, n_serial: int,
               topic_prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    bodies = [BODY] * 1000

    def check(topic: str, n: int) -> None:
        count = _count(http_addr, topic)
        assert count == n, (topic, count, n)
        _http(http_addr, f"/topic/delete?topic={topic}")

    with Producer([addr]) as p:
        p.publish(topic_prefix + "warm", BODY)  # connect outside the timings

        t = topic_prefix + "mpubblk"
        out["ours mpublish (blocking)"] = n_mpub / timed(
            lambda: [p.mpublish(t, bodies) for _ in range(n_mpub // 1000)])
        check(t, n_mpub)

        t = topic_prefix + "mpubasync"

        def mpub_async() -> None:
            window: list = []
            for _ in range(n_mpub // 1000):
                window.append(p.mpublish_async(t, bodies))
                if len(window) >= 16:
                    window.pop(0).result()
            for f in window:
                f.result()
        out["ours mpublish_async (pipelined)"] = n_mpub / timed(mpub_async)
        check(t, n_mpub)

        t = topic_prefix + "pubblk"
        out["ours publish (blocking, 1 thread)"] = n_serial / timed(
            lambda: [p.publish(t, BODY) for _ in range(n_serial)])
        check(t, n_serial)

        t = topic_prefix + "pubthreads"
        per = n_pub // 16

        def threads() -> None:
            ths = [threading.Thread(target=lambda: [p.publish(t, BODY) for _ in range(per)])
                   for _ in range(16)]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
        out["ours publish (blocking, 16 threads)"] = per * 16 / timed(threads)
        check(t, per * 16)

        t = topic_prefix + "pubasync"

        def pub_async() -> None:
            for _ in range(n_pub // 10000):
                futs = [p.publish_async(t, BODY) for _ in range(10000)]
                for f in futs:
                    f.result()
        out["ours publish_async (1 thread)"] = n_pub / timed(pub_async)
        check(t, n_pub)

    async def asyncio_cases() -> None:
        async with Producer([addr]) as p:
            await p.apublish(topic_prefix + "warm", BODY)
            t = topic_prefix + "ampub"
            t0 = time.perf_counter()
            for _ in range(n_mpub // 1000):
                await p.ampublish(t, bodies)
            out["ours ampublish (asyncio)"] = n_mpub / (time.perf_counter() - t0)
            check(t, n_mpub)

            t = topic_prefix + "nowait"
            t0 = time.perf_counter()
            for _ in range(n_pub // 10000):
                futs = [p.publish_nowait(t, BODY) for _ in range(10000)]
                for f in futs:
                    await f
            out["ours publish_nowait (asyncio)"] = n_pub / (time.perf_counter() - t0)
            check(t, n_pub)

    asyncio.run(asyncio_cases())
    return out


def _copies(http_addrs: list[str], topic: str) -> int:
    total = 0
    for h in http_addrs:
        total += _count(h, topic)
        _http(h, f"/topic/delete?topic={topic}")
    return total


def replication_cases(tcp: list[str], http: list[str], n_serial: int, n_mpub: int,
                      n_async: int, prefix: str) -> dict[str, tuple[float, float]]:
    """``{case: (publishes per second, CPU microseconds per publish)}``."""
    configs: list[tuple[str, dict[str, object]]] = [
        ("ids off, no replicas", {}),
        ("ids on, no replicas", {"publish_ids": True}),
        ("replicas=1", {"replicas": 1}),
        ("replicas=2 (W=2)", {"replicas": 2}),
        ("replicas=3 (W=2)", {"replicas": 3}),
    ]
    bodies = [BODY] * 1000
    out: dict[str, tuple[float, float]] = {}
    for name, kwargs in configs:
        copies = int(kwargs.get("replicas", 1))   # type: ignore[call-overload]
        with Producer(tcp, **kwargs) as p:        # type: ignore[arg-type]
            for a in range(len(tcp)):              # every connection open first
                p.publish(prefix + "warm", BODY)
                p.publish_async(prefix + "warm", BODY).result()

            def measure(case: str, n: int, run: Callable[[str], None]) -> None:
                t = f"{prefix}{len(out)}"
                c0, w0 = time.process_time(), time.perf_counter()
                run(t)
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                got = _copies(http, t)
                assert got == n * copies, (name, case, got, n * copies)
                out[f"{name}: {case}"] = (n / wall, cpu / n * 1e6)

            measure("publish (blocking)", n_serial,
                    lambda t: [p.publish(t, BODY) for _ in range(n_serial)])
            measure("mpublish 1000 (blocking)", n_mpub,
                    lambda t: [p.mpublish(t, bodies) for _ in range(n_mpub // 1000)])

            def windows(t: str) -> None:
                for _ in range(n_async // 10000):
                    futs = [p.publish_async(t, BODY) for _ in range(10000)]
                    for f in futs:
                        f.result()
            measure("publish_async (windows of 10,000)", n_async, windows)
        for h in http:
            _http(h, f"/topic/delete?topic={prefix}warm")
    return out


def replication_main(args: argparse.Namespace) -> None:
    results: dict[str, list[tuple[float, float]]] = {}
    with NSQCluster(nsqd=3, lookupd=0, mem_queue_size=10_000_000) as cluster:
        for r in range(args.rounds):
            for k, v in replication_cases(cluster.nsqd_tcp_addresses,
                                          cluster.nsqd_http_addresses, args.serial_messages,
                                          args.messages, args.pub_messages, f"rep{r}x").items():
                results.setdefault(k, []).append(v)
    print(f"{'case':62s} {'best msg/s':>11s} {'CPU us/msg':>10s}   all rounds (msg/s)")
    for k, v in results.items():
        rate, cpu = max(v)
        print(f"{k:62s} {rate:11,.0f} {cpu:10.1f}   {', '.join(f'{x:,.0f}' for x, _ in v)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=500_000, help="messages per MPUB case")
    ap.add_argument("--pub-messages", type=int, default=200_000, help="messages per PUB case")
    ap.add_argument("--serial-messages", type=int, default=20_000,
                    help="messages for the round-trip-bound blocking publish loop")
    ap.add_argument("--rounds", type=int, default=2, help="runs of every case; best is reported")
    ap.add_argument("--replication", action="store_true",
                    help="the replication table (three nsqd) instead of the comparison")
    args = ap.parse_args()
    if args.replication:
        replication_main(args)
        return

    results: dict[str, list[float]] = {}
    with NSQCluster(nsqd=1, lookupd=0, mem_queue_size=10_000_000) as cluster:
        addr, http_addr = cluster.nsqd_tcp_addresses[0], cluster.nsqd_http_addresses[0]
        for r in range(args.rounds):
            t = f"pynsqmpub{r}"
            results.setdefault("pynsq Writer.mpub (batches of 1000)", []).append(
                pynsq_case(addr, http_addr, t, "mpub", args.messages, 1000))
            _http(http_addr, f"/topic/delete?topic={t}")
            t = f"pynsqpub{r}"
            results.setdefault("pynsq Writer.pub", []).append(
                pynsq_case(addr, http_addr, t, "pub", args.pub_messages, 1))
            _http(http_addr, f"/topic/delete?topic={t}")
            for k, v in ours_cases(addr, http_addr, args.messages, args.pub_messages,
                                   args.serial_messages, f"r{r}").items():
                results.setdefault(k, []).append(v)

    best = {k: max(v) for k, v in results.items()}
    print(f"{'case':45s} {'best msg/s':>12s}   all rounds")
    for k, v in results.items():
        print(f"{k:45s} {best[k]:12,.0f}   {', '.join(f'{x:,.0f}' for x in v)}")
    mpub_base = best["pynsq Writer.mpub (batches of 1000)"]
    pub_base = best["pynsq Writer.pub"]
    print()
    for k in ("ours mpublish (blocking)", "ours mpublish_async (pipelined)", "ours ampublish (asyncio)"):
        print(f"{k} / pynsq mpub = {best[k] / mpub_base:.2f}x")
    for k in ("ours publish (blocking, 1 thread)", "ours publish (blocking, 16 threads)",
              "ours publish_async (1 thread)", "ours publish_nowait (asyncio)"):
        print(f"{k} / pynsq pub = {best[k] / pub_base:.2f}x")


if __name__ == "__main__":
    main()
