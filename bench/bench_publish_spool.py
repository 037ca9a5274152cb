"""Publisher spool benchmark: what the durable spool costs against plain publishing.

One nsqd v1.3.0 on 127.0.0.1 (large ``--mem-queue-size``); 100-byte messages; each case
publishes to its own topic with a fresh spool directory under ``--dir`` (default /tmp,
so the spool's disk is the machine's disk).

Cases:

* ``Producer.mpublish`` (no spool): batches of 1000, blocking -- the baseline.
* ``Producer(spool_dir=...).mpublish`` batches of 1000 with ``spool_fsync`` = ``always`` / ``10``
  ms / ``never``.
* ``Producer(spool_dir=...).publish`` one message per call with ``always`` and ``10`` ms.

Two figures per case: *accept* = messages per second until the last ``publish`` call
returned (the caller's view: the message is in the spool, synced per the policy);
*delivered* = messages per second until ``flush()`` returned (nsqd acknowledged all).

    flock /tmp/nsq-spark-bench.lock python -m bench.bench_publish_spool [--messages 200000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nsq_spark.producer import Producer  # noqa: E402
from nsq_spark.producer import Producer  # noqa: E402
from nsq_spark.testing import NSQCluster  # noqa: E402

BODY = b"x" * 100


def topic_count(cluster: NSQCluster, topic: str) -> int:
    for t in cluster.nsqds[0].stats(topic).get("topics", []):
        if t["topic_name"] == topic:
            return t["message_count"]
    return 0


def case_plain(cluster, topic, n, base):
    t0 = time.perf_counter()
    with Producer(cluster.nsqd_tcp_addresses[0]) as p:
        for _ in range(n // 1000):
            p.mpublish(topic, [BODY] * 1000)
    dt = time.perf_counter() - t0
    return dt, dt


def case_spool(cluster, topic, n, base, fsync, per_call):
    with tempfile.TemporaryDirectory(dir=base, prefix="spoolbench-") as d:
        p = Producer(cluster.nsqd_tcp_addresses[0], spool_dir=d, spool_fsync=fsync)
        try:
            t0 = time.perf_counter()
            if per_call == 1:
                for _ in range(n):
                    p.publish(topic, BODY)
            else:
                for _ in range(n // per_call):
                    p.mpublish(topic, [BODY] * per_call)
            accept = time.perf_counter() - t0
            assert p.flush(600)
            delivered = time.perf_counter() - t0
        finally:
            p.close()
    return accept, delivered


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--single-messages", type=int, default=20_000,
                    help="messages for the one-per-call cases")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    n, n1 = args.messages, args.single_messages
    cases = [
        ("Producer.mpublish x1000 (no spool)", n, lambda c, t: case_plain(c, t, n, args.dir)),
        ("spool mpublish x1000, fsync always", n,
         lambda c, t: case_spool(c, t, n, args.dir, "always", 1000)),
        ("spool mpublish x1000, fsync 10 ms", n,
         lambda c, t: case_spool(c, t, n, args.dir, 10, 1000)),
        ("spool mpublish x1000, fsync never", n,
         lambda c, t: case_spool(c, t, n, args.dir, "never", 1000)),
        ("spool publish x1, fsync always", n1,
         lambda c, t: case_spool(c, t, n1, args.dir, "always", 1)),
        ("spool publish x1, fsync 10 ms", n1,
         lambda c, t: case_spool(c, t, n1, args.dir, 10, 1)),
    ]
    print(f"| case | messages | accept msg/s | delivered msg/s |")
    print("|---|---|---|---|")
    with NSQCluster(nsqd=1, lookupd=0, mem_queue_size=10_000_000) as cluster:
        for i, (name, count, fn) in enumerate(cases):
            topic = f"spoolbench{i}"
            accept, delivered = fn(cluster, topic)
            got = topic_count(cluster, topic)
            assert got >= count, f"{name}: nsqd has {got} of {count}"
            print(f"| {name} | {count:,} | {count / accept:,.0f} | {count / delivered:,.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()
