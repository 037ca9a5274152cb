"""The caller's CPU time per spooled publish call: ``time.thread_time()`` of the publishing
thread (what the caller spends, not what it waits for), which moves far less than
wall-clock rates on a shared machine. ``Producer(spool_dir=...)`` against one real nsqd,
20,000 single publishes (fsync ``never`` and 10 ms) and 200 ``mpublish`` of 1000 bodies,
best of 3 runs each. Give the tree whose library to measure (compare two revisions by
running it from each, alternately)::

    python bench/cpu_publish_spool.py /path/to/tree [publishes per case]
"""

from __future__ import annotations

import sys
import tempfile
import time

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")

from nsq_spark.producer import Producer  # noqa: E402
from nsq_spark.testing import NSQCluster  # noqa: E402

# publishes per case (a second argument sets it: the smoke test's small form)
N = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
BODY = b"x" * 100


def main() -> None:
    out = {}
    with NSQCluster(nsqd=1, lookupd=0, mem_queue_size=10_000_000) as cluster:
        for fsync, per in (("never", 1), (10, 1), ("never", 1000)):
            calls = N if per == 1 else N // 100
            best = float("inf")
            for _ in range(3 if N >= 1000 else 1):
                with tempfile.TemporaryDirectory() as d:
                    p = Producer(cluster.nsqd_tcp_addresses[0], spool_dir=d,
                                 spool_fsync=fsync)
                    t0 = time.thread_time()
                    for _ in range(calls):
                        if per == 1:
                            p.publish("t", BODY)
                        else:
                            p.mpublish("t", [BODY] * per)
                    best = min(best, (time.thread_time() - t0) / calls * 1e6)
                    assert p.flush(60)
                    p.close()
            name = "publish" if per == 1 else f"mpublish x{per}"
            out[f"{name}, fsync {fsync}"] = round(best, 2)
    print(sys.argv[1:] or ".", out, "us CPU per call, best of 3")


if __name__ == "__main__":
    main()
