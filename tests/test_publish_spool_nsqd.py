"""The publisher spool against real nsqd: a publisher killed with SIGKILL mid-stream and
started again, a spool shared by two processes, nsqd stopped and started again, a full
spool, a damaged segment. Every check consumes the topic with the real ``nsq_tail`` and
compares contents. Duplicates are allowed only where the spool's semantics allow them
(at most one in-flight batch per crash or outage)."""

from __future__ import annotations

import collections
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from nsq_spark.publish_spool import (
    SegmentStore, SpoolFullError, by_envelope_digest, read_segment,
)
from nsq_spark import Producer
from nsq_spark.testing import find_binary, free_port

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]

TOPIC = "spooltest"
CHANNEL = "check"


def http_post(addr: str, path: str) -> None:
    req = urllib.request.Request(f"http://{addr}{path}", data=b"", method="POST")
    urllib.request.urlopen(req, timeout=5).read()


def make_channel(cluster, topic=TOPIC, channel=CHANNEL) -> None:
    """Create topic and channel first, so the channel keeps every message published."""
    addr = cluster.nsqd_http_addresses[0]
    http_post(addr, f"/topic/create?topic={topic}")
    http_post(addr, f"/channel/create?topic={topic}&channel={channel}")


def channel_count(cluster, topic=TOPIC, channel=CHANNEL, i=0) -> int:
    stats = cluster.nsqds[i].stats(topic)
    for t in stats.get("topics", []):
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return c["depth"] + c["in_flight_count"] + c["deferred_count"]
    return 0


def consume(cluster, n: int, topic=TOPIC, channel=CHANNEL, timeout=30.0) -> list[bytes]:
    """Read exactly ``n`` messages with the real nsq_tail."""
    if n == 0:
        return []
    out = subprocess.run(
        [find_binary("nsq_tail"), f"--nsqd-tcp-address={cluster.nsqd_tcp_addresses[0]}",
         f"--topic={topic}", f"--channel={channel}", f"-n={n}"],
        capture_output=True, timeout=timeout, check=True)
    lines = out.stdout.split(b"\n")
    assert lines[-1] == b""
    return lines[:-1]


def drain_channel(cluster, topic=TOPIC, channel=CHANNEL) -> list[bytes]:
    return consume(cluster, channel_count(cluster, topic, channel), topic, channel)


def unacked_in_spool(spool: Path) -> int:
    """Messages in the spool's segments beyond their acknowledged watermark."""
    n = 0
    for seg in spool.glob("*.seg"):
        ack = Path(str(seg) + ".ack")
        mark = struct.unpack("<Q", ack.read_bytes()[:8])[0] if ack.exists() else 0
        n += sum(1 for r in read_segment(seg).records if r[3] > mark)
    return n


def check_delivery(got: list[bytes], expected: set[bytes], max_dups: int) -> int:
    counts = collections.Counter(got)
    missing = expected - counts.keys()
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
    unexpected = counts.keys() - expected
    assert not unexpected, f"unexpected messages {sorted(unexpected)[:5]}"
    dups = sum(c - 1 for c in counts.values())
    dupd = sorted(k for k, c in counts.items() if c > 1)
    assert dups <= max_dups, (f"{dups} duplicates, the spool allows at most {max_dups}: "
                              f"{dupd[:3]}..{dupd[-3:]}")
    return dups


# A publisher child: publishes [start, end) in chunks of CHUNK, prints the last index
# spooled after each chunk (what the caller may count as accepted), then flushes.
CHILD = textwrap.dedent("""
    import json, sys, time
    from nsq_spark.producer import Producer
    spool, addr, topic, start, end, chunk, batch, slow_from, hold = sys.argv[1:10]
    start, end, chunk, batch = int(start), int(end), int(chunk), int(batch)
    slow_from = int(slow_from)
    p = Producer(addr, spool_dir=spool, batch_size=batch, retry_max_wait=0.2,
                 rescan_interval=0.2)
    for i in range(start, end, chunk):
        p.mpublish(topic, [b"m%06d" % j for j in range(i, min(i + chunk, end))])
        print(min(i + chunk, end) - 1, flush=True)
        if 0 <= slow_from <= i:
            time.sleep(0.05)  # still publishing when the parent's SIGKILL comes
    ok = p.flush(60)
    print("done", json.dumps({"ok": ok, "claimed": p.spool_stats.orphans_claimed}), flush=True)
    if hold == "hold":
        time.sleep(600)   # hold the spool (and its locks) until killed
    p.close()
""")


def start_child(spool, addr, start, end, chunk=20, batch=100, hold=False, slow_from=-1):
    argv = [sys.executable, "-c", CHILD, str(spool), addr, TOPIC, str(start), str(end),
            str(chunk), str(batch), str(slow_from), "hold" if hold else "-"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def read_until(proc, pred, timeout=60.0) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            raise AssertionError(f"child exited early ({proc.poll()}): "
                                 f"{proc.stderr.read().decode()[-2000:]}")
        lines.append(line.strip())
        if pred(lines[-1]):
            return lines
    raise AssertionError("child too slow")


@pytest.mark.slow
@pytest.mark.nsq_cluster(lookupd=0)
def test_publisher_killed_mid_stream_and_restarted_loses_nothing(nsq_cluster, tmp_path):
    make_channel(nsq_cluster)
    addr = nsq_cluster.nsqd_tcp_addresses[0]
    spool = tmp_path / "spool"
    total, chunk, batch = 3000, 20, 100
    # from a third on the child slows down (50 ms per chunk), so that nsqd is frozen and
    # the kill lands mid-stream, with messages in the spool, even on a loaded machine
    child = start_child(spool, addr, 0, total, chunk, batch, slow_from=total // 3)
    try:
        read_until(child, lambda s: s.isdigit() and int(s) >= total // 3)
        # freeze nsqd: the child keeps spooling, its drain waits on an unanswered MPUB
        nsq_cluster.stop(0)
        seen = read_until(child, lambda s: s.isdigit() and int(s) >= total // 2)
        child.send_signal(signal.SIGKILL)
        seen += child.stdout.read().decode().split()
    finally:
        child.kill()
        child.wait()
        nsq_cluster.resume(0)
    accepted = max(int(s) for s in seen if s.isdigit())   # the last confirmed message
    assert accepted < total - 1, "killed too late to be mid-stream"
    assert unacked_in_spool(spool) > 0, "nothing left in the spool: the kill tested nothing"
    # every message whose mpublish returned is in the spool or already in nsqd
    # start again from the first message not confirmed
    child = start_child(spool, addr, accepted + 1, total, chunk, batch)
    try:
        lines = read_until(child, lambda s: s.startswith("done"))
        assert child.wait(30) == 0
    finally:
        child.kill()
        child.wait()
    assert json.loads(lines[-1][5:])["ok"]
    got = drain_channel(nsq_cluster)
    expected = {b"m%06d" % i for i in range(total)}
    # one MPUB batch acknowledged but not marked, plus the chunk in progress at the kill
    check_delivery(got, expected, max_dups=batch + chunk)
    assert [p for p in spool.iterdir() if p.name.endswith(".seg")] == []


@pytest.mark.slow
@pytest.mark.nsq_cluster(lookupd=0)
def test_shared_spool_dir_segments_of_a_killed_process_go_to_the_survivor(nsq_cluster,
                                                                          tmp_path):
    make_channel(nsq_cluster)
    spool = tmp_path / "spool"
    dead_addr = f"127.0.0.1:{free_port()}"   # nothing listens: A only fills the spool
    a = start_child(spool, dead_addr, 0, 1000, chunk=100, batch=100, hold=True)
    try:
        read_until(a, lambda s: s == "999")
        with Producer(nsq_cluster.nsqd_tcp_addresses[0], spool_dir=spool,
                      rescan_interval=0.1) as b:
            b.mpublish(TOPIC, [b"b%06d" % i for i in range(500)])
            assert b.flush(20)
            time.sleep(0.5)            # several rescans while A is alive and holds its locks
            assert b.spool_stats.orphans_claimed == 0
            assert channel_count(nsq_cluster) == 500
            a.send_signal(signal.SIGKILL)
            a.wait(10)
            deadline = time.monotonic() + 20
            while channel_count(nsq_cluster) < 1500 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert b.flush(20)
            assert b.spool_stats.orphans_claimed >= 1
    finally:
        a.kill()
        a.wait()
    got = drain_channel(nsq_cluster)
    expected = {b"m%06d" % i for i in range(1000)} | {b"b%06d" % i for i in range(500)}
    # A never reached nsqd and B alone sent A's segments: no duplicates at all
    assert check_delivery(got, expected, max_dups=0) == 0
    assert [p for p in spool.iterdir() if p.name.endswith(".seg")] == []


@pytest.mark.slow
@pytest.mark.nsq_cluster(lookupd=0)
def test_nsqd_outage_spools_then_drains_and_full_spool_raises(nsq_cluster, tmp_path):
    make_channel(nsq_cluster)
    node = nsq_cluster.nsqds[0]
    batch = 50
    p = Producer(nsq_cluster.nsqd_tcp_addresses[0], spool_dir=tmp_path / "spool",
                 spool_max_bytes=64 << 10, spool_full="raise", batch_size=batch,
                 retry_max_wait=0.2)
    try:
        accepted = [b"before-%04d" % i for i in range(300)]
        p.mpublish(TOPIC, accepted)
        assert p.flush(20)
        node.terminate()                     # nsqd is gone (SIGTERM: it keeps its data)
        during = []
        with pytest.raises(SpoolFullError, match="full"):
            for i in range(100_000):          # bounded: 64 KiB of spool fills far sooner
                body = b"during-%05d-" % i + b"x" * 200
                p.publish(TOPIC, body)
                during.append(body)
        assert 100 < len(during) < 400
        accepted += during
        assert not p.flush(0.5)             # nothing can be acknowledged now
        node.start()
        assert p.flush(30), f"spool did not drain: {p.pending_bytes()} bytes left"
        p.mpublish(TOPIC, [b"after-%04d" % i for i in range(100)])
        accepted += [b"after-%04d" % i for i in range(100)]
        assert p.flush(20)
    finally:
        p.close()
    got = drain_channel(nsq_cluster)
    check_delivery(got, set(accepted), max_dups=batch)


@pytest.mark.nsq_cluster(lookupd=0)
def test_truncated_segment_intact_part_is_delivered(nsq_cluster, tmp_path):
    make_channel(nsq_cluster)
    spool = tmp_path / "spool"
    st = SegmentStore(spool)
    st.append([(TOPIC, b"intact-%02d" % i, None) for i in range(10)])
    st.close()
    (seg,) = [p for p in spool.iterdir() if p.name.endswith(".seg")]
    os.truncate(seg, seg.stat().st_size - 4)    # the last record loses its end
    reports = []
    with Producer(nsq_cluster.nsqd_tcp_addresses[0], spool_dir=spool,
                  on_corrupt=reports.append) as p:
        assert p.flush(20)
    assert len(reports) == 1 and "truncated" in reports[0].reason
    assert (spool / "corrupt" / seg.name).exists()
    got = drain_channel(nsq_cluster)
    check_delivery(got, {b"intact-%02d" % i for i in range(9)}, max_dups=0)


@pytest.mark.nsq_cluster(lookupd=0)
def test_message_id_envelope_reaches_the_consumer(nsq_cluster, tmp_path):
    make_channel(nsq_cluster)
    with Producer(nsq_cluster.nsqd_tcp_addresses[0], spool_dir=tmp_path / "s",
                  message_id_digest=True) as p:
        p.mpublish(TOPIC, [b"same", b"same", b"other"])
        assert p.flush(20)
    Reader = pytest.importorskip("nsq_spark.reader").Reader
    with Reader(TOPIC, CHANNEL, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                max_in_flight=10) as r:
        msgs = []
        deadline = time.monotonic() + 20
        while len(msgs) < 3 and time.monotonic() < deadline:
            msgs += r.get_batch(timeout=0.5)
        r.finish(msgs)
    keys = [by_envelope_digest(m) for m in msgs]
    assert len(msgs) == 3 and len(set(keys)) == 2
    import hashlib

    assert hashlib.blake2b(b"same", digest_size=16).digest() in keys


@pytest.mark.slow
@pytest.mark.nsq_cluster(lookupd=0)
def test_full_spool_blocks_during_an_outage_and_resumes_when_nsqd_returns(nsq_cluster,
                                                                          tmp_path):
    import threading

    make_channel(nsq_cluster)
    node = nsq_cluster.nsqds[0]
    bodies = [b"blocked-%04d-" % i + b"y" * 200 for i in range(400)]   # ~3x the bound
    p = Producer(nsq_cluster.nsqd_tcp_addresses[0], spool_dir=tmp_path / "spool",
                 spool_max_bytes=32 << 10, spool_full="block", retry_max_wait=0.2)
    errors = []

    def publisher():
        try:
            for b in bodies:
                p.publish(TOPIC, b)
        except Exception as exc:  # reported below
            errors.append(exc)

    try:
        node.terminate()
        t = threading.Thread(target=publisher)
        t.start()
        t.join(1.0)
        assert t.is_alive(), "publish did not block on a full spool"
        assert p.spool_stats.appended < len(bodies)
        assert p.spool_stats.bytes_on_disk <= 32 << 10
        node.start()
        t.join(30)
        assert not t.is_alive() and not errors
        assert p.flush(30)
    finally:
        p.close()
    check_delivery(drain_channel(nsq_cluster), set(bodies), max_dups=p.batch_size)


@pytest.mark.nsq_cluster(lookupd=0)
def test_spool_over_nsqd_http_api(nsq_cluster, tmp_path):
    make_channel(nsq_cluster)
    with Producer(spool_dir=tmp_path / "spool",
                  nsqd_http_addresses=nsq_cluster.nsqd_http_addresses) as p:
        p.mpublish(TOPIC, [b"http-%03d" % i for i in range(50)])
        p.publish(TOPIC, b"http-single")
        assert p.flush(20)
    check_delivery(drain_channel(nsq_cluster), {b"http-%03d" % i for i in range(50)} |
                   {b"http-single"}, max_dups=0)


@pytest.mark.nsq_cluster(lookupd=0, max_msg_size=1024)
def test_a_message_nsqd_refuses_goes_to_rejected_and_comes_back_by_redrive(nsq_cluster,
                                                                           tmp_path):
    """nsqd's own answer (E_BAD_MESSAGE, over --max-msg-size) is the one kind of failure
    that leaves the queue: counted in rejected, not acked; flush() says False once."""
    make_channel(nsq_cluster)
    spool = tmp_path / "spool"
    small = [b"small-%03d" % i for i in range(50)]
    big = b"B" * 2000
    with Producer(nsq_cluster.nsqd_tcp_addresses[0], spool_dir=spool,
                  retry_max_wait=0.2) as p:
        p.mpublish(TOPIC, small[:25] + [big] + small[25:])
        assert not p.flush(20), "flush() said delivered while nsqd refused a message"
        st = p.stats()
        assert (st["rejected"], st["acked"], st["health"]) == (1, 50, "ok")
        assert p.redrive() == 1        # nsqd still refuses it: back to rejected/
        assert not p.flush(20)
        assert p.stats()["rejected"] == 2 and p.stats()["redriven"] == 1
    (kept,) = (spool / "rejected").iterdir()
    assert [r[1] for r in read_segment(kept).records] == [big]
    check_delivery(drain_channel(nsq_cluster), set(small), max_dups=0)


@pytest.mark.nsq_cluster(lookupd=0)
def test_flush_covers_every_leftover_segment_not_only_those_claimed_so_far(nsq_cluster,
                                                                         tmp_path):
    """A store holds at most max_claimed (4) leftover segments at a time; flush() is True
    only once the seven left by closed stores are all delivered, not the first four."""
    make_channel(nsq_cluster)
    spool = tmp_path / "spool"
    sent = set()
    for k in range(7):   # seven producers that closed with nsqd out of reach
        store = SegmentStore(spool)
        bodies = [b"left-%d-%02d" % (k, i) for i in range(10)]
        store.append([(TOPIC, b, None) for b in bodies])
        store.close()
        sent |= set(bodies)
    with Producer(nsq_cluster.nsqd_tcp_addresses[0], spool_dir=spool) as p:
        assert p.flush(30)
        assert not [f for f in os.listdir(spool) if f.endswith(".seg")], \
            "flush() said True with segments still waiting in the spool"
    check_delivery(drain_channel(nsq_cluster), sent, max_dups=0)
