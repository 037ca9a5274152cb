"""Replicated publishing against real nsqds (three, unless a test says otherwise),
counted by publish id in what each nsqd holds (read raw, tests/replica_helpers.py):
each message on exactly N nsqds and the copies spread evenly, a down nsqd substituted or
the quorum still met, a ReplicationError when fewer than W are reachable, the spool
keeping every message until every replica has it (across a SIGKILL of the publisher
too), HTTP publishing, and ``nsq-spark publish`` sending every line to every address."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from pathlib import Path

import pytest

from nsq_spark.envelope import open_body
from nsq_spark.errors import ReplicationError
from nsq_spark._publish.producer import Producer
from nsq_spark.testing import NSQCluster, wait_until
from replica_helpers import depth, drain, ids_of, make_channel, unacked_in_spool

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]

THREE = pytest.mark.nsq_cluster(nsqd=3, lookupd=0)
TWO = pytest.mark.nsq_cluster(nsqd=2, lookupd=0)
REPO = Path(__file__).resolve().parent.parent


def new_topic(cluster: NSQCluster, prefix: str = "rep") -> str:
    t = prefix + uuid.uuid4().hex[:10]
    for node in cluster.nsqds:
        if node.running:
            make_channel(node.http_address, t)
    return t


def held(cluster: NSQCluster, topic: str) -> list[Counter[bytes]]:
    """Per running nsqd: publish id -> copies it holds."""
    return [ids_of(drain(cluster, i, topic)) if node.running else Counter()
            for i, node in enumerate(cluster.nsqds)]


def copies(per_nsqd: list[Counter[bytes]]) -> Counter[bytes]:
    """Publish id -> on how many nsqds."""
    out: Counter[bytes] = Counter()
    for c in per_nsqd:
        out.update(set(c))
    return out


@THREE
def test_two_replicas_of_three_put_each_message_on_exactly_two_nsqds_spread_evenly(
        nsq_cluster: NSQCluster) -> None:
    t = new_topic(nsq_cluster)
    addrs = nsq_cluster.nsqd_tcp_addresses
    with Producer(addrs, replicas=2) as p:
        assert p.write_quorum == 2
        for i in range(300):
            p.publish(t, b"m%d" % i)
        for f in [p.publish_async(t, b"f%d" % i) for i in range(60)]:
            f.result(30)
        p.mpublish(t, [b"b%d" % i for i in range(30)])   # one MPUB: on 2 nsqds as a unit
        assert p.stats()["under_replicated"] == 0

    async def on_a_loop() -> None:
        async with Producer(addrs, replicas=2) as q:
            await asyncio.gather(*(q.publish_nowait(t, b"n%d" % i) for i in range(30)))
            await q.apublish(t, b"a")
            await q.apublish(t, b"a")
            await q.apublish(t, b"a")
    asyncio.run(on_a_loop())
    per = held(nsq_cluster, t)
    assert set(copies(per).values()) == {2}            # every publish on exactly two
    assert len(copies(per)) == 300 + 60 + 30 + 30 + 3
    assert all(set(c.values()) == {1} for c in per)     # and once on each of them
    # the first replica rotates over the three: each nsqd holds 2/3 of the single
    # publishes (200 + 40 + 22), and the MPUB of 30 is one placement, on two of them
    assert sorted(sum(c.values()) for c in per) == [262, 292, 292]


@THREE
def test_http_publishing_replicates_too(nsq_cluster: NSQCluster) -> None:
    t = new_topic(nsq_cluster)
    with Producer(nsqd_http_addresses=nsq_cluster.nsqd_http_addresses, replicas=2,
                  write_quorum=1) as p:
        for i in range(9):
            p.publish(t, b"h%d" % i)
        p.mpublish(t, [b"x", b"y"])
        p.publish_async(t, b"z").result(10)
        per = held(nsq_cluster, t)
        assert len(copies(per)) == 12 and set(copies(per).values()) == {2}
        assert sorted(sum(c.values()) for c in per) == [7, 8, 9]   # 11 placements rotated
        nsq_cluster.kill(2)                # its copies are replaced by the other two
        for i in range(6):
            p.publish(t, b"k%d" % i)
        p.publish_async(t, b"k-async").result(10)
        assert p.stats()["under_replicated"] == 0
    per = held(nsq_cluster, t)
    assert len(copies(per)) == 7 and set(copies(per).values()) == {2}


@THREE
def test_with_one_nsqd_down_another_takes_its_copies_or_the_quorum_is_still_met(
        nsq_cluster: NSQCluster) -> None:
    t = new_topic(nsq_cluster)
    addrs = nsq_cluster.nsqd_tcp_addresses
    nsq_cluster.kill(0)
    with Producer(addrs, replicas=2) as p:                 # 2 of 3, W=2: substituted
        for i in range(30):
            p.publish(t, b"s%d" % i)
        p.publish_async(t, b"async").result(30)
        assert p.stats()["under_replicated"] == 0 and p.stats()["errors"] == 0
    with Producer(addrs[:2], replicas=2, write_quorum=1) as q:   # nobody to take over
        for i in range(10):
            q.publish(t, b"w%d" % i)
        assert q.stats()["under_replicated"] == 10
    per = held(nsq_cluster, t)
    assert per[0] == Counter()
    both = copies(per)
    assert len(both) == 41
    assert sorted(Counter(both.values()).items()) == [(1, 10), (2, 31)]
    assert sum(per[1].values()) == 41 and sum(per[2].values()) == 31


@THREE
def test_fewer_than_the_quorum_reachable_raises_a_replication_error_naming_them(
        nsq_cluster: NSQCluster) -> None:
    t = new_topic(nsq_cluster)
    addrs = nsq_cluster.nsqd_tcp_addresses
    nsq_cluster.kill(0)
    nsq_cluster.kill(1)
    with Producer(addrs, replicas=2, retry_deadline=0.5, retry_wait=0.01) as p:
        with pytest.raises(ReplicationError) as blocking:
            p.publish(t, b"x")
        with pytest.raises(ReplicationError) as future:
            p.publish_async(t, b"y").result(30)
        for exc in (blocking.value, future.value):
            assert exc.acked == (addrs[2],) and set(exc.failed) == {addrs[0], addrs[1]}
            text = str(exc)
            assert "acknowledged by 1 of 2 replicas" in text and "write_quorum=2" in text
            assert addrs[0] in text and addrs[1] in text and "lower write_quorum" in text
        assert p.stats()["errors"] == 2
    # every retry went only to the nsqds missing it: the one that took it, took it once
    assert sorted(open_body(b).body for b in drain(nsq_cluster, 2, t)) == [b"x", b"y"]


@TWO
def test_the_spool_keeps_each_message_until_both_replicas_have_it(
        nsq_cluster: NSQCluster, tmp_path: Path) -> None:
    t = new_topic(nsq_cluster)
    nsq_cluster.kill(1)
    with Producer(nsq_cluster.nsqd_tcp_addresses, replicas=2, write_quorum=1,
                  spool_dir=tmp_path, retry_max_wait=0.2) as p:
        for i in range(100):
            p.publish(t, b"p%d" % i)
        p.mpublish(t, [b"m%d" % i for i in range(100)])
        # the stream flows to the replica that is up (the write quorum) ...
        wait_until(lambda: depth(nsq_cluster, 0, t) == 200, 30, "nsqd0 has all 200")
        # ... and nothing leaves the disk before the other one has it too
        assert not p.flush(0.5)
        stats = p.stats()
        assert stats["spool_pending"] == 200 and stats["awaiting_replicas"] == 200
        assert unacked_in_spool(tmp_path) == 200
        nsq_cluster.restart(1)
        assert p.flush(30)
        stats = p.stats()
        assert (stats["spool_pending"], stats["awaiting_replicas"], stats["acked"]) == \
            (0, 0, 200)
    per = held(nsq_cluster, t)
    assert set(per[0]) == set(per[1]) and len(per[0]) == 200        # 0 lost on either
    assert set(per[0].values()) == set(per[1].values()) == {1}
    assert not list(tmp_path.glob("*.seg"))


_KILLED_PUBLISHER = textwrap.dedent("""
    import sys, time
    from nsq_spark._publish.producer import Producer
    addrs, spool, topic = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    p = Producer(addrs, replicas=2, write_quorum=1, spool_dir=spool)
    for i in range(4):
        p.mpublish(topic, [b"k%d-%d" % (i, j) for j in range(50)])
    print("spooled", flush=True)
    time.sleep(600)
""")


@TWO
def test_a_spooling_publisher_killed_before_every_replica_has_its_messages_loses_none(
        nsq_cluster: NSQCluster, tmp_path: Path) -> None:
    t = new_topic(nsq_cluster)
    addrs = nsq_cluster.nsqd_tcp_addresses
    spool = tmp_path / "spool"
    nsq_cluster.kill(1)
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_PUBLISHER, ",".join(addrs), str(spool), t],
        stdout=subprocess.PIPE, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert child.stdout is not None and child.stdout.readline() == b"spooled\n"
        wait_until(lambda: depth(nsq_cluster, 0, t) == 200, 30, "nsqd0 has all 200")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    # on one replica of two: every record is still on disk, past the watermark
    assert unacked_in_spool(spool) == 200
    nsq_cluster.restart(1)
    with Producer(addrs, replicas=2, write_quorum=1, spool_dir=spool) as p:
        assert p.flush(30)
    per = held(nsq_cluster, t)
    assert len(per[1]) == 200 and set(per[1].values()) == {1}      # the missing replica
    # the resend after the crash carries the same publish ids: nsqd0's copies are the
    # same 200 publishes, twice each, which a consumer keyed by publish id drops
    assert set(per[0]) == set(per[1]) and set(per[0].values()) == {2}


@TWO
def test_nsq_spark_publish_sends_every_line_to_every_address_as_to_nsq(
        nsq_cluster: NSQCluster) -> None:
    t = new_topic(nsq_cluster, "cli")
    a, b = nsq_cluster.nsqd_tcp_addresses
    lines = b"".join(b"line-%d\n" % i for i in range(10))
    args = [sys.executable, "-m", "nsq_spark", "publish", "--topic", t,
            "--nsqd-tcp-address", a, "--nsqd-tcp-address", b, "--nsqd-tcp-address", a]
    r = subprocess.run(args, input=lines, capture_output=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    for i in range(2):                                   # 10 + 10, the lines as they are
        assert sorted(drain(nsq_cluster, i, t)) == sorted(lines.splitlines())
    r = subprocess.run(args + ["--replicas", "1", "--publish-ids"], input=lines,
                       capture_output=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    per = held(nsq_cluster, t)                           # one each: 10 in all
    assert sum(sum(c.values()) for c in per) == 10 and set(copies(per).values()) == {1}


@THREE
def test_a_frozen_nsqd_holds_up_no_quorum_and_one_short_of_it_ends_at_publish_timeout(
        nsq_cluster: NSQCluster) -> None:
    t = new_topic(nsq_cluster)
    addrs = nsq_cluster.nsqd_tcp_addresses
    # answers may take 30 s: only the quorum (or publish_timeout) can end a call sooner
    with Producer(addrs, replicas=3, write_quorum=2, response_timeout=30.0) as p, \
            Producer(addrs[:2], replicas=2, publish_timeout=1.0,
                     response_timeout=30.0) as short:
        p.publish_async(t, b"warm").result(10)           # every connection open
        nsq_cluster.stop(0)                               # SIGSTOP: open, never answers
        try:
            # settled as soon as two answered, while the third copy waits on nsqd0
            for f in [p.publish_async(t, b"q%d" % i) for i in range(20)]:
                f.result(10)
            # one short of the quorum: at publish_timeout, not response_timeout. The
            # blocking call sends one copy after the other: the frozen nsqd may take its
            # whole time; the future sends both at once: the other one has acknowledged
            with pytest.raises(ReplicationError) as blocking:
                short.publish(t, b"late")
            assert set(blocking.value.acked) <= {addrs[1]}
            assert "publish_timeout" in str(blocking.value)
            with pytest.raises(ReplicationError) as future:
                short.publish_async(t, b"late").result(10)
            assert future.value.acked == (addrs[1],)
            assert "publish_timeout=1.0" in str(future.value.failed[addrs[0]])
        finally:
            nsq_cluster.resume(0)
    ids = copies(held(nsq_cluster, t))
    # warm and the 20 on all three (nsqd0's copies answered once it was resumed); the
    # failed ones where they landed (a failed publish may still be stored: at-least-once)
    assert Counter(ids.values())[3] == 21 and len(ids) in (22, 23)


@TWO
def test_copies_go_on_after_an_nsqd_restart_breaks_the_open_connections(
        nsq_cluster: NSQCluster) -> None:
    t = new_topic(nsq_cluster)
    with Producer(nsq_cluster.nsqd_tcp_addresses, replicas=2) as p:
        p.publish(t, b"a")
        p.publish_async(t, b"b").result(10)
        nsq_cluster.restart(1)                            # SIGTERM: nsqd keeps its queue
        p.publish(t, b"c")
        p.publish_async(t, b"d").result(30)
        assert p.stats()["errors"] == 0
    per = held(nsq_cluster, t)
    assert set(copies(per).values()) == {2} and len(copies(per)) == 4
