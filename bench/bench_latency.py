"""Publish-to-handler latency of the Reader against go-nsq and pynsq, same nsqd, same run.

One nsqd (v1.3.0, loopback, its memory queue large enough for every run). Per rate (msg/s)
and per consumer, a fresh topic and channel (created first); the consumer starts in a
process of its own and subscribes; then this process publishes ``rate x (warmup +
seconds)`` messages at a fixed pace with ``nsq_spark.Producer`` over TCP (message ``i``
is due ``i / rate`` s after the start; what is due goes out in one MPUB), each body
carrying its sequence number and ``time.time()`` when it was sent. The consumer takes
the time first thing in its handler and keeps ``now - published`` for every message sent
after the warm-up; it stops at the last one and reports the p50, p99 and max
(nearest-rank) of those.

* ``ours``: ``nsq_spark.Reader`` with a per-message handler (the pynsq form);
* ``go-nsq``: bench/go_latency (go-nsq v1.1.0), built into bench/out/ with the Go
  toolchain from the module proxy (skipped, with the reason, when there is none);
* ``pynsq``: pynsq's Reader (the test extras), handler returning True.

Every consumer uses ``max_in_flight`` 2500 and, unless ``--output-buffer-timeout MS`` is
given, its defaults: nsqd then flushes what it buffered for a consumer every 250 ms (its
default ``output_buffer_timeout``) or when 16 KiB are buffered, which is most of the
latency at low rates for every client alike; with ``--output-buffer-timeout 25`` each
asks nsqd for 25 ms (nsqd's smallest by default). A consumer slower than the rate
(pynsq at 100,000/s) falls behind: its latency is its queue, reported as measured.

    flock /tmp/nsq-spark-bench.lock python -m bench.bench_latency \\
        [--rates 1000,10000,100000] [--seconds 5] [--warmup 1] [--output-buffer-timeout MS]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
GO_DIR = ROOT / "bench" / "go_latency"
GO_BIN = ROOT / "bench" / "out" / "go_latency"
MAX_IN_FLIGHT = 2500
KINDS = ("ours", "go-nsq", "pynsq")
DEFAULT_OBT = "each client's default: nsqd's 250"


def make_body(seq: int, published_at: float, size: int) -> bytes:
    head = b"%d %.6f " % (seq, published_at)
    return head + b"x" * max(0, size - len(head))


def parse_body(body: bytes) -> tuple[int, float]:
    seq, at, _ = bytes(body).split(b" ", 2)
    return int(seq), float(at)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest rank (as bench/go_latency computes it)."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(1, math.ceil(q / 100 * len(sorted_values))) - 1]


def summary(latencies: list[float], messages: int) -> dict[str, Any]:
    latencies.sort()
    return {"messages": messages, "measured": len(latencies),
            "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99),
            "max_s": latencies[-1] if latencies else math.nan}


def parse_rates(text: str) -> list[int]:
    try:
        rates = [int(r) for r in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"rates {text!r}: whole messages per second, comma-separated") from None
    if not rates or any(r < 1 for r in rates) or len(set(rates)) != len(rates):
        raise argparse.ArgumentTypeError(f"rates {text!r}: each rate once, at least 1")
    return rates


# -- consumers (children) ---------------------------------------------------------------


def _recorder(n: int, first: int, done: Callable[[], None]
              ) -> tuple[Callable[[bytes], None], list[float], list[int]]:
    latencies: list[float] = []
    count = [0]

    def record(body: bytes) -> None:
        now = time.time()
        seq, at = parse_body(body)
        if seq >= first:
            latencies.append(now - at)
        count[0] += 1
        if count[0] == n:
            done()
    return record, latencies, count


def child_ours(addr: str, topic: str, n: int, first: int, obt: int | None) -> dict[str, Any]:
    import asyncio

    from nsq_spark import Reader

    async def main() -> dict[str, Any]:
        finished = asyncio.Event()
        record, latencies, count = _recorder(n, first, finished.set)

        def handler(m: Any) -> bool:
            record(m.body)
            return True

        kw: dict[str, Any] = {} if obt is None else {"output_buffer_timeout": obt}
        reader = Reader(topic, "c", nsqd_tcp_addresses=[addr], max_in_flight=MAX_IN_FLIGHT,
                        message_handler=handler, **kw)
        try:
            await asyncio.wait_for(finished.wait(), 300)
        finally:
            await reader.aclose()
        return summary(latencies, count[0])

    return asyncio.run(main())


def child_pynsq(addr: str, topic: str, n: int, first: int, obt: int | None) -> dict[str, Any]:
    import nsq  # pynsq
    import tornado.ioloop

    loop = tornado.ioloop.IOLoop.current()
    record, latencies, count = _recorder(n, first, loop.stop)

    def handler(m: Any) -> bool:
        record(m.body)
        return True

    kw: dict[str, Any] = {} if obt is None else {"output_buffer_timeout": obt}
    nsq.Reader(topic=topic, channel="c", message_handler=handler, nsqd_tcp_addresses=[addr],
               max_in_flight=MAX_IN_FLIGHT, **kw)
    loop.call_later(300, loop.stop)
    nsq.run()
    return summary(latencies, count[0])


def go_binary() -> str | None:
    if GO_BIN.exists() and GO_BIN.stat().st_mtime >= (GO_DIR / "main.go").stat().st_mtime:
        return str(GO_BIN)
    go = shutil.which("go")
    if go is None:
        return None
    GO_BIN.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([go, "build", "-o", str(GO_BIN), "."], cwd=GO_DIR, check=True)
    return str(GO_BIN)


def start_consumer(kind: str, addr: str, topic: str, n: int, first: int,
                   obt: int | None) -> subprocess.Popen[str] | str:
    """The consumer's process, or why it cannot run."""
    if kind == "go-nsq":
        binary = go_binary()
        if binary is None:
            return "no Go toolchain (go) on PATH to build bench/go_latency"
        cmd = [binary, "-nsqd", addr, "-topic", topic, "-channel", "c", "-n", str(n),
               "-from", str(first), "-max-in-flight", str(MAX_IN_FLIGHT)]
        if obt is not None:
            cmd += ["-output-buffer-timeout", f"{obt}ms"]
    else:
        if kind == "pynsq":
            try:
                import nsq  # noqa: F401
            except ImportError:
                return "pynsq is not installed (pip install pynsq; it is in the test extras)"
        cmd = [sys.executable, "-m", "bench.bench_latency", "--child", kind, addr, topic,
               str(n), str(first), "" if obt is None else str(obt)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


# -- the run (parent) -------------------------------------------------------------------


def _post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"),
                                timeout=30) as resp:
        resp.read()


def _clients(http: str, topic: str) -> int:
    with urllib.request.urlopen(f"http://{http}/stats?format=json&topic={topic}",
                                timeout=30) as resp:
        stats = json.loads(resp.read())
    return sum(len(c.get("clients") or []) for t in stats.get("topics", [])
               if t["topic_name"] == topic for c in t["channels"])


def publish_paced(producer: Any, topic: str, rate: int, n: int, size: int) -> float:
    """``n`` messages at ``rate``/s: message i due i/rate s after the start, what is due
    sent in one MPUB stamped with the time it is sent. Returns the rate achieved."""
    t0 = time.monotonic()
    sent = 0
    while sent < n:
        due = min(n, int((time.monotonic() - t0) * rate) + 1)
        if due <= sent:
            time.sleep(max(0.0002, min(0.002, t0 + sent / rate - time.monotonic())))
            continue
        now = time.time()
        bodies = [make_body(i, now, size) for i in range(sent, due)]
        if len(bodies) == 1:
            producer.publish(topic, bodies[0])
        else:
            producer.mpublish(topic, bodies)
        sent = due
    return n / max(1e-9, time.monotonic() - t0)


def run_one(cluster: Any, producer: Any, kind: str, rate: int, args: Any, index: int
            ) -> dict[str, Any]:
    http, addr = cluster.nsqd_http_addresses[0], cluster.nsqd_tcp_addresses[0]
    topic = f"lat{index}"
    _post(f"http://{http}/topic/create?topic={topic}")
    _post(f"http://{http}/channel/create?topic={topic}&channel=c")
    n = max(1, round(rate * (args.warmup + args.seconds)))
    first = round(rate * args.warmup)
    proc = start_consumer(kind, addr, topic, n, first, args.output_buffer_timeout)
    result: dict[str, Any] = {"consumer": kind, "rate": rate, "published": n}
    if isinstance(proc, str):
        return {**result, "skipped": proc}
    try:
        deadline = time.monotonic() + 60
        while _clients(http, topic) < 1:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} did not subscribe: {proc.stderr.read()[-2000:]}"
                                   if proc.stderr else f"{kind} did not subscribe")
            time.sleep(0.02)
        result["published_per_s"] = round(publish_paced(producer, topic, rate, n, args.size))
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} at {rate}/s failed: {(err or out)[-2000:]}")
    result.update(json.loads(lines[-1]))
    result.pop("consumer", None)
    result["consumer"] = kind
    _post(f"http://{http}/topic/delete?topic={topic}")
    return result


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| rate | consumer | p50 ms | p99 ms | max ms | measured / received |",
             "|---|---|---|---|---|---|"]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['rate']:,}/s | {r['consumer']} | skipped: {r['skipped']} "
                         "| | | |")
            continue
        lines.append(f"| {r['rate']:,}/s | {r['consumer']} | {1000 * r['p50_s']:.1f} "
                     f"| {1000 * r['p99_s']:.1f} | {1000 * r['max_s']:.1f} "
                     f"| {r['measured']:,} / {r['messages']:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=parse_rates, default=[1000, 10000, 100000])
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"consumers, comma-separated (default {','.join(KINDS)})")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds not measured first")
    ap.add_argument("--size", type=int, default=100, help="body bytes (at least 32)")
    ap.add_argument("--output-buffer-timeout", type=int, default=None, metavar="MS",
                    help="asked of nsqd by every consumer (default: each one's default)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures here")
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, addr, topic, n, first, obt = args.child
        child = child_ours if kind == "ours" else child_pynsq
        print(json.dumps(child(addr, topic, int(n), int(first), int(obt) if obt else None)),
              flush=True)
        return 0
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or any(k not in KINDS for k in kinds):
        ap.error(f"--kinds: a comma-separated choice of {', '.join(KINDS)}")
    if args.seconds <= 0 or args.warmup < 0 or args.size < 32:
        ap.error("--seconds must be positive, --warmup at least 0, --size at least 32")

    from nsq_spark import Producer
    from nsq_spark.testing import NSQCluster

    total = sum(round(r * (args.warmup + args.seconds)) for r in args.rates) * len(kinds)
    results: list[dict[str, Any]] = []
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at start: {load}", flush=True)
    with NSQCluster(nsqd=1, lookupd=0, mem_queue_size=total + 10_000) as cluster, \
            Producer(cluster.nsqd_tcp_addresses[0]) as producer:
        for rate in args.rates:
            for kind in kinds:  # the consumers of one rate next to each other
                r = run_one(cluster, producer, kind, rate, args, len(results))
                r["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
                results.append(r)
                print(json.dumps(r), flush=True)
    print()
    print(markdown(results))
    print(f"\n(python {sys.version.split()[0]}, {os.cpu_count()} CPUs, nsqd v1.3.0 loopback, "
          f"max_in_flight {MAX_IN_FLIGHT}, output_buffer_timeout "
          f"{args.output_buffer_timeout or DEFAULT_OBT} ms, "
          f"{args.size}-byte bodies; load average at the end: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    bad = [r for r in results if "skipped" not in r and r["messages"] != r["published"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
