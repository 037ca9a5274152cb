"""No loss and no duplicate, with no dedup in the query: the Spark driver SIGKILLed
mid-stream and restarted on the same checkpoint, and an nsqd SIGKILLed and restarted,
with a real nsqd cluster and real Spark drivers in child processes
(tests/spark/crash_driver.py, NSQ -> Parquet with a checkpoint).

100,000 messages are queued before the query starts, 30,000 more while it runs. The
sink must end up with every published body exactly once: the redeliveries both kills
cause (FINs lost with the driver; nsqd rewinding its disk queue past messages it had
sent) are dropped by the source's redelivery index (``redeliveryWindow``).

On the nsqd kill: nsqd itself forgets the messages it holds *in flight* when it is
SIGKILLed (they live only in its memory until FIN or timeout) -- no client can bring those
back. The test therefore runs nsqd with ``--mem-queue-size=0`` (queued messages on disk)
and kills it between two micro-batches, when no client of the channel is connected, so
that what is tested is the connector: the query goes on with one nsqd gone, and picks up
that nsqd's queue when it is back.
"""

from __future__ import annotations

import collections
import glob
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import ChildDriver, channel_counts, discovery_problem, http_mpub  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.nsqd, pytest.mark.slow]

TOPIC, CHANNEL = "crash", "parquet"


class Driver(ChildDriver):
    """``crash_driver.py`` as a child driver; ``rows``: its latest ``ROWS n`` line."""

    def __init__(self, cfg: dict) -> None:
        self.rows = 0
        super().__init__("crash_driver.py", cfg)

    def on_line(self, line: str) -> None:
        if line.startswith("ROWS "):
            self.rows = int(line.split()[1])

    def wait_rows(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.rows < n:
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, f"only {self.rows} rows: {self.output()}"
            time.sleep(0.05)


def total_counts(cluster) -> dict[str, int]:
    out = collections.Counter()
    for node in cluster.nsqds:
        if node.running:
            out.update(channel_counts(node, TOPIC, CHANNEL))
    return out


@pytest.mark.timeout(420)
# msg_timeout 10 s (nsqd's default is 60 s): what the killed driver's tasks held comes back
# sooner (the test waits for nsqd 1 to have nothing in flight before killing it)
@pytest.mark.nsq_cluster(nsqd=2, lookupd=1, mem_queue_size=0, msg_timeout="10s")
def test_driver_and_nsqd_killed_mid_stream(spark, nsq_cluster, tmp_path):
    problem = discovery_problem()  # the child drivers find the source by discovery
    if problem:
        pytest.fail(problem)
    cluster = nsq_cluster
    http = cluster.nsqd_http_addresses
    published: list[bytes] = []

    def publish(node: int, tag: str, n: int) -> None:
        bodies = [b"%s-%07d" % (tag.encode(), i) for i in range(n)]
        http_mpub(http[node], TOPIC, bodies)
        published.extend(bodies)

    publish(0, "a0", 50_000)
    publish(1, "a1", 50_000)
    cfg = {"checkpoint": str(tmp_path / "ckpt"), "output": str(tmp_path / "out"),
           "spool": str(tmp_path / "spool"), "workdir": str(tmp_path),
           "lookupd": ",".join(cluster.lookupd_http_addresses),
           "topic": TOPIC, "channel": CHANNEL, "mode": "run", "max_per_trigger": 10_000}
    drivers: list[Driver] = []
    try:
        # 1. the driver runs, more is published, then SIGKILL in the middle of the stream
        d1 = Driver(cfg)
        drivers.append(d1)
        d1.wait_rows(5_000, timeout=120)
        publish(0, "b0", 10_000)
        d1.wait_rows(30_000, timeout=120)
        d1.kill()

        # 2. restart on the same checkpoint; kill and restart nsqd 1 between two batches
        # (a 3 s trigger interval leaves a gap of a second or more between batches)
        d2 = Driver({**cfg, "interval": "3 seconds", "max_per_trigger": 20_000})
        drivers.append(d2)
        d2.wait_rows(10_000, timeout=120)
        deadline = time.monotonic() + 60
        quiet = 0
        while quiet < 2:  # twice in a row, 20 ms apart: no client, nothing in flight
            c = channel_counts(cluster.nsqds[1], TOPIC, CHANNEL)
            quiet = quiet + 1 if c["clients"] == 0 and c["in_flight"] == 0 else 0
            assert time.monotonic() < deadline, "no gap between batches"
            time.sleep(0.02)
        cluster.kill(1)
        publish(0, "c0", 10_000)  # the query goes on with nsqd 1 gone
        rows_at_kill = d2.rows
        d2.wait_rows(rows_at_kill + 5_000, timeout=120)
        cluster.restart(1)
        publish(1, "c1", 10_000)
        # wait until both nsqds are drained, then kill the driver once more
        deadline = time.monotonic() + 180
        while True:
            c = total_counts(cluster)
            if c["depth"] + c["in_flight"] + c["deferred"] + c["topic_depth"] == 0:
                break
            assert time.monotonic() < deadline, f"not drained: {c}; {d2.output()}"
            assert d2.proc.poll() is None, d2.output()
            time.sleep(0.2)
        d2.kill()

        # 3. a last run with Trigger.AvailableNow finishes whatever is left and exits
        d3 = Driver({**cfg, "mode": "drain"})
        drivers.append(d3)
        assert d3.wait_exit(180) == 0, d3.output()
    finally:
        for d in drivers:
            d.kill()

    out = spark.read.parquet(str(tmp_path / "out"))
    rows = out.select("id", "body").collect()
    bodies = collections.Counter(bytes(r["body"]) for r in rows)
    assert len(published) == 130_000
    missing = set(published) - set(bodies)
    assert not missing, f"{len(missing)} bodies lost, e.g. {sorted(missing)[:5]}"
    twice = {b: n for b, n in bodies.items() if n > 1}
    assert not twice, f"{len(twice)} bodies more than once, e.g. {sorted(twice)[:5]}"
    assert len({r["id"] for r in rows}) == len(rows) == 130_000
    from nsq_spark.spark._seen import parse_index_name

    kept = [parse_index_name(os.path.basename(n))
            for n in glob.glob(str(tmp_path / "spool" / "*" / "_seen" / "*"))]
    dropped = sum(f.dropped for f in kept if f is not None)
    print(f"rows in sink {len(rows)}; redeliveries dropped by the source, per the index "
          f"files still kept (younger than redeliveryWindow): {dropped}")
