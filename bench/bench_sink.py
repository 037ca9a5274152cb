"""The Spark sink's rows/s against the Producer's ``mpublish``, side by side in one run.

One nsqd (memory queue large enough for everything), one Spark session (local[2]). Each
round, the same N bodies of 100 bytes (a DataFrame of 2 partitions, cached and counted
before it is timed) are published to a fresh topic by:

* ``Producer.mpublish`` (blocking, batches of 1,000, one thread): the floor of the work;
* the same with ``publish_ids=True`` and an idempotency key per body shaped like the
  sink's (query, batch, partition, row, topic, body): the cost of the ids without Spark;
* ``df.write.format("nsq")`` (2 tasks, each MPUB-pipelined by its Producer);
* the same with ``publishIds`` (ids derived from the write, the partition, the row...);
* the same with ``idempotencyKeyColumn`` (a string column).

Each case is checked: nsqd's ``message_count`` for the topic equals N. The sink's time is
the whole job (Spark's planning and task start included: what a micro-batch pays). The
best of ``--rounds`` is reported; the machine's load average is printed with the figures
(the machine may be shared: compare cases within one run).

Run from the repo root (one benchmark at a time on the machine)::

    flock /tmp/nsq-spark-bench.lock python -m bench.bench_sink [--messages 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nsq_spark._publish.producer import Producer  # noqa: E402
from nsq_spark.testing import NSQCluster  # noqa: E402


def _count(http_addr: str, topic: str) -> int:
    with urllib.request.urlopen(f"http://{http_addr}/stats?format=json&topic={topic}",
                                timeout=30) as resp:
        stats = json.loads(resp.read())
    return sum(t["message_count"] for t in stats["topics"] if t["topic_name"] == topic)


def _delete(http_addr: str, topic: str) -> None:
    req = urllib.request.Request(f"http://{http_addr}/topic/delete?topic={topic}", data=b"")
    urllib.request.urlopen(req, timeout=30).read()


def bodies(n: int) -> list[bytes]:
    return [b"%010d" % i + b"x" * 90 for i in range(n)]


def producer_case(addr: str, items: list[bytes], topic: str, ids: bool) -> Callable[[], None]:
    def run() -> None:
        with Producer(addr, publish_ids=ids) as p:
            for at in range(0, len(items), 1000):
                piece = items[at:at + 1000]
                if ids:  # keys shaped like the sink's: scope | row | topic | body
                    keys = [b"nsq-spark-sink\0q\0bench\00\0%d\0%d\0%s\0%s"
                            % (at // 500_000, at + i, topic.encode(), b)
                            for i, b in enumerate(piece)]
                    p.mpublish(topic, piece, idempotency_keys=keys)
                else:
                    p.mpublish(topic, piece)
    return run


def main(argv: list[str] | None = None, spark: Any = None) -> dict[str, list[float]]:
    """``spark``: a session to run in (the smoke test's), else one of its own, stopped at
    the end. Returns rows/s per case and round."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    n = args.messages

    own = spark is None
    if own:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").appName("bench-sink")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.python.worker.reuse", "true").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    import nsq_spark.spark

    nsq_spark.spark.register(spark)
    items = bodies(n)
    df = (spark.createDataFrame([(b, b[:10].decode()) for b in items], "body binary, key string")
          .repartition(2).cache())
    assert df.count() == n

    results: dict[str, list[float]] = {}
    loads = [os.getloadavg()[0]]
    with NSQCluster(nsqd=1, lookupd=0, mem_queue_size=10_000_000) as cluster:
        addr, http_addr = cluster.nsqd_tcp_addresses[0], cluster.nsqd_http_addresses[0]

        def sink_case(topic: str, **options: str) -> Callable[[], None]:
            def run() -> None:
                w = (df.select(*(["body", "key"] if "idempotencyKeyColumn" in options
                                 else ["body"]))
                     .write.format("nsq").option("topic", topic)
                     .option("nsqdTcpAddresses", addr))
                for k, v in options.items():
                    w = w.option(k, v)
                w.mode("append").save()
            return run

        # warm-up: the Python workers, the first connections
        sink_case("warm")()
        _delete(http_addr, "warm")
        for r in range(args.rounds):
            cases = {
                "Producer.mpublish (1 thread)": producer_case(addr, items, f"p{r}", False),
                "Producer.mpublish, publish ids + keys": producer_case(addr, items,
                                                                       f"pi{r}", True),
                "df.write.format('nsq') (2 tasks)": sink_case(f"s{r}"),
                "df.write, publishIds": sink_case(f"si{r}", publishIds="true"),
                "df.write, idempotencyKeyColumn": sink_case(f"sk{r}",
                                                            idempotencyKeyColumn="key"),
            }
            for name, run in cases.items():
                topic = {"Producer.mpublish (1 thread)": f"p{r}",
                         "Producer.mpublish, publish ids + keys": f"pi{r}",
                         "df.write.format('nsq') (2 tasks)": f"s{r}",
                         "df.write, publishIds": f"si{r}",
                         "df.write, idempotencyKeyColumn": f"sk{r}"}[name]
                t0 = time.perf_counter()
                run()
                seconds = time.perf_counter() - t0
                published = _count(http_addr, topic)
                assert published == n, (name, published, n)
                results.setdefault(name, []).append(n / seconds)
                _delete(http_addr, topic)
            loads.append(os.getloadavg()[0])
    df.unpersist()
    if own:
        spark.stop()

    base = max(results["Producer.mpublish (1 thread)"])
    print(f"{n:,} bodies of 100 bytes; load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'case':42s} {'best rows/s':>12s} {'/ mpublish':>10s}   all rounds")
    for name, rates in results.items():
        print(f"{name:42s} {max(rates):12,.0f} {max(rates) / base:10.2f}   "
              f"{', '.join(f'{x:,.0f}' for x in rates)}")
    return results


if __name__ == "__main__":
    main()
