"""Unit tests of the publisher spool: framing, segment store, locking, bounds, corruption,
and the spooling publisher's drain logic against an in-process stand-in for the Producer
(the real-nsqd tests are in test_publish_spool_nsqd.py). No sockets, no processes."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Sequence

import pytest

from nsq_spark import Producer, publish_spool as ps
from nsq_spark.errors import InvalidBodyError, InvalidNameError, NSQServerError
from nsq_spark.publish_spool import (
    SegmentStore, SpoolDirectoryError, SpoolError, SpoolFullError, SpoolingProducer,
    decode_records, encode_record, open_envelope, read_segment, wrap_envelope,
)
from nsq_spark.spool import Sender

pytestmark = pytest.mark.unit


def segs(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.name.endswith(".seg"))


def drain(store: SegmentStore, limit: int = 1000) -> list[tuple[str, bytes, int | None]]:
    """Everything the store owns, acknowledged batch by batch."""
    out: list[tuple[str, bytes, int | None]] = []
    for _ in range(limit):
        b = store.next_batch(max_messages=7, max_bytes=4096)
        if b is None:
            return out
        out.extend((b.topic, body, b.defer_ms) for body in b.bodies)
        store.ack(b)
    raise AssertionError("drain did not finish")


# ---------------------------------------------------------------------------------------
# framing


def test_record_roundtrip_and_bulk_decode():
    recs = [("t1", b"a" * n, None) for n in (1, 100, 5000)] + [("t.2", b"x", 1500)]
    buf = b"".join(encode_record(*r) for r in recs)
    dec = decode_records(buf, base=8, eof=True)
    assert dec.error is None and dec.need == 0
    assert [(t, b, d) for t, b, d, _ in dec.records] == recs
    assert dec.end == 8 + len(buf)
    assert dec.records[0][3] == 8 + len(encode_record(*recs[0]))


def test_decode_reports_partial_record_or_truncated_tail():
    full = encode_record("t", b"hello world")
    buf = encode_record("t", b"first") + full[:-3]
    dec = decode_records(buf)
    assert [r[1] for r in dec.records] == [b"first"]
    assert dec.need == len(full) and dec.error is None
    dec = decode_records(buf, eof=True)
    assert [r[1] for r in dec.records] == [b"first"]
    assert dec.error and "truncated" in dec.error
    assert dec.end == len(encode_record("t", b"first"))
    # a cut header
    dec = decode_records(buf[: len(encode_record("t", b"first")) + 3], eof=True)
    assert dec.error and "header" in dec.error


def test_decode_detects_checksum_mismatch_and_limit():
    a, b = encode_record("t", b"one"), bytearray(encode_record("t", b"two"))
    b[-1] ^= 0xFF
    dec = decode_records(a + bytes(b) + a, eof=True)
    assert [r[1] for r in dec.records] == [b"one"]
    assert dec.error == "checksum mismatch" and dec.end == len(a)
    dec = decode_records(a * 5, limit=2)
    assert len(dec.records) == 2 and dec.end == 2 * len(a)


def test_envelope_digest_matches_dedup_body_digest():
    body = b'{"event": 1}'
    wrapped = wrap_envelope(body)
    digest, inner = open_envelope(wrapped)
    assert inner == body
    assert digest == hashlib.blake2b(body, digest_size=16).digest()
    assert open_envelope(body) == (None, body)

    class M:
        def __init__(self, b):
            self.body = b

    assert ps.by_envelope_digest(M(wrapped)) == ps.by_envelope_digest(M(body)) == digest
    try:
        from nsq_spark.dedup.base import by_body_digest
    except ImportError:
        return
    assert by_body_digest(M(body)) == digest


# ---------------------------------------------------------------------------------------
# the store


def test_append_read_ack_deletes_segment_only_when_all_acked(tmp_path):
    st = SegmentStore(tmp_path, segment_bytes=400)
    st.append([("t", b"m%d" % i, None) for i in range(3)])
    st.append([("t", b"x" * 400, None)])        # exceeds segment_bytes: seals the segment
    st.append([("u", b"later", None)])
    assert len(segs(tmp_path)) == 2
    b = st.next_batch(max_messages=2)
    assert b.bodies == [b"m0", b"m1"] and b.topic == "t"
    st.ack(b)
    assert len(segs(tmp_path)) == 2            # one message of the first segment left
    ack_file = Path(str(b.segment.path) + ".ack")
    assert ack_file.exists()
    rest = drain(st)
    assert rest == [("t", b"m2", None), ("t", b"x" * 400, None), ("u", b"later", None)]
    assert segs(tmp_path) == [Path(st._active.path)]  # the first one is gone
    assert not ack_file.exists()
    st.close()
    assert segs(tmp_path) == []                 # fully acked current segment removed on close
    assert st.stats.appended == st.stats.acked == 5


def test_batches_split_on_topic_change_and_deferred_records(tmp_path):
    st = SegmentStore(tmp_path)
    st.append([("a", b"1", None), ("a", b"2", None), ("b", b"3", None), ("b", b"4", 250),
               ("b", b"5", None)])
    got = []
    while (bt := st.next_batch()) is not None:
        got.append((bt.topic, bt.bodies, bt.defer_ms))
        st.ack(bt)
    assert got == [("a", [b"1", b"2"], None), ("b", [b"3"], None), ("b", [b"4"], 250),
                   ("b", [b"5"], None)]
    st.close()


def test_unacked_messages_survive_close_and_are_claimed_from_the_watermark(tmp_path):
    st = SegmentStore(tmp_path)
    st.append([("t", b"%d" % i, None) for i in range(10)])
    b = st.next_batch(max_messages=4)
    st.ack(b)
    st.close()                                  # like a crash: 6 messages unacknowledged
    assert len(segs(tmp_path)) == 1
    st2 = SegmentStore(tmp_path)
    assert st2.claim_orphans() == 1
    assert [m[1] for m in drain(st2)] == [b"%d" % i for i in range(4, 10)]
    assert segs(tmp_path) == [] and st2.stats.orphans_claimed == 1
    st2.close()


def test_a_locked_segment_is_not_claimed_and_each_orphan_goes_to_one_claimer(tmp_path):
    owner = SegmentStore(tmp_path)
    owner.append([("t", b"live", None)])
    other = SegmentStore(tmp_path)
    assert other.claim_orphans() == 0           # the owner holds the flock
    assert other.next_batch() is None
    # leftovers of three "crashed" writers
    for i in range(3):
        s = SegmentStore(tmp_path)
        s.append([("t", b"orphan%d" % i, None)])
        s.close()
    a, b = SegmentStore(tmp_path, max_claimed=2), SegmentStore(tmp_path, max_claimed=2)
    results = []
    ts = [threading.Thread(target=lambda s=s: results.append(s.claim_orphans())) for s in (a, b)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert sum(results) == 3
    got = sorted(m[1] for s in (a, b) for m in drain(s))
    assert got == [b"orphan0", b"orphan1", b"orphan2"]
    assert [m[1] for m in drain(owner)] == [b"live"]
    for s in (owner, other, a, b):
        s.close()
    assert segs(tmp_path) == []


def test_a_segment_deleted_by_its_owner_after_open_is_not_claimed(tmp_path):
    st = SegmentStore(tmp_path)
    st.append([("t", b"x", None)])
    st.close()
    (path,) = segs(tmp_path)
    claimer = SegmentStore(tmp_path)
    orig_stat = os.stat

    # between the claimer's open and its lock, the file is replaced by a new inode
    def racing_stat(p, *a, **kw):
        if str(p) == str(path):
            os.rename(path, str(path) + ".old")
            Path(path).write_bytes(ps.MAGIC)
            return orig_stat(p, *a, **kw)
        return orig_stat(p, *a, **kw)

    os.stat = racing_stat
    try:
        assert claimer._try_claim(path.name) is None
    finally:
        os.stat = orig_stat
    claimer.close()


def test_interrupted_creation_leaves_no_claimable_empty_segment(tmp_path):
    st = SegmentStore(tmp_path)
    st.append([("t", b"a", None)])
    # no temporary files linger and the only segment is locked by its writer
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert SegmentStore(tmp_path).claim_orphans() == 0
    st.close()


def test_fsync_policies(tmp_path):
    st = SegmentStore(tmp_path / "a", fsync="always")
    for i in range(3):
        st.append([("t", b"x", None), ("t", b"y", None)])
    assert st.stats.fsyncs == 3                 # one per call, not per message
    st.close()
    st = SegmentStore(tmp_path / "b", fsync=20)
    st.append([("t", b"x", None)])
    assert st.stats.fsyncs == 0
    deadline = time.monotonic() + 5
    while st.stats.fsyncs == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert st.stats.fsyncs >= 1
    st.close()
    st = SegmentStore(tmp_path / "c", fsync="never")
    st.append([("t", b"x", None)])
    st.close()
    assert st.stats.fsyncs == 0
    for bad in ("sometimes", 0, -5, 1.5, True):
        with pytest.raises(ValueError, match="spool_fsync"):
            SegmentStore(tmp_path / "d", fsync=bad)


def test_full_spool_raises(tmp_path):
    st = SegmentStore(tmp_path, max_bytes=4096, full="raise")
    st.append([("t", b"x" * 1200, None)] * 3)
    with pytest.raises(SpoolFullError, match="full"):
        st.append([("t", b"x" * 1200, None)])
    with pytest.raises(SpoolFullError, match="never fit"):
        st.append([("t", b"x" * 5000, None)])
    # what was accepted is intact and deliverable
    assert len(drain(st)) == 3
    st.append([("t", b"x" * 1200, None)])        # room again once delivered
    st.close()


def test_full_spool_blocks_until_drained_or_times_out(tmp_path):
    st = SegmentStore(tmp_path, max_bytes=4096, full="block", block_timeout=0.3)
    st.append([("t", b"x" * 1200, None)] * 3)
    t0 = time.monotonic()
    with pytest.raises(SpoolFullError, match="spool_block_timeout"):
        st.append([("t", b"y" * 1200, None)])
    assert time.monotonic() - t0 >= 0.3
    st.block_timeout = 10
    # a drain in another thread frees the space: the blocked append goes through
    done = threading.Event()

    def later():
        time.sleep(0.2)
        n = 0
        while n < 3:
            b = st.next_batch(max_messages=3 - n)
            n += len(b.bodies)
            st.ack(b)
        done.set()

    threading.Thread(target=later).start()
    st.append([("t", b"z" * 1200, None)])
    assert done.wait(5)
    assert [m[1] for m in drain(st)] == [b"z" * 1200]
    st.close()


def test_unusable_directory_is_rejected_with_a_clear_error(tmp_path):
    regular = tmp_path / "file"
    regular.write_text("not a directory")
    # fails for root too: a path below a regular file
    with pytest.raises(SpoolDirectoryError, match="spool directory.*writable"):
        SegmentStore(regular / "spool")
    with pytest.raises(SpoolDirectoryError, match="not a directory"):
        SegmentStore(regular)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions; the "
                    "path-below-a-file case covers the error for root")
def test_read_only_directory_is_rejected(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        with pytest.raises(SpoolDirectoryError, match="not usable"):
            SegmentStore(d)
    finally:
        d.chmod(0o755)


def _truncated_leftover(d: Path, n: int = 5, cut: int = 3) -> Path:
    st = SegmentStore(d)
    st.append([("t", b"msg-%d" % i, None) for i in range(n)])
    st.close()
    (path,) = segs(d)
    os.truncate(path, path.stat().st_size - cut)
    return path


def test_truncated_tail_is_reported_and_the_intact_prefix_delivered(tmp_path):
    path = _truncated_leftover(tmp_path)
    reports = []
    st = SegmentStore(tmp_path, on_corrupt=reports.append)
    assert st.claim_orphans() == 1
    got = [m[1] for m in drain(st)]
    assert got == [b"msg-%d" % i for i in range(4)]
    assert len(reports) == 1 and "truncated" in reports[0].reason
    assert reports[0].lost_bytes == len(encode_record("t", b"msg-4")) - 3
    assert "damaged" in str(reports[0]) and str(path) in str(reports[0])
    assert st.stats.corrupt_segments == reports
    assert not path.exists() and (tmp_path / "corrupt" / path.name).exists()
    assert read_segment(tmp_path / "corrupt" / path.name).records[-1][1] == b"msg-3"
    st.close()


def test_corrupt_middle_record_stops_there(tmp_path):
    st = SegmentStore(tmp_path)
    st.append([("t", b"AAAA", None), ("t", b"BBBB", None), ("t", b"CCCC", None)])
    st.close()
    (path,) = segs(tmp_path)
    data = bytearray(path.read_bytes())
    data[data.index(b"BBBB")] = ord("b")
    path.write_bytes(bytes(data))
    st = SegmentStore(tmp_path)
    st.claim_orphans()
    assert [m[1] for m in drain(st)] == [b"AAAA"]
    assert st.stats.corrupt_segments[0].reason == "checksum mismatch"
    st.close()


def test_foreign_file_with_seg_name_is_quarantined(tmp_path):
    (tmp_path / "0001-x.seg").write_bytes(b"hello, not a segment")
    st = SegmentStore(tmp_path)
    st.claim_orphans()
    assert drain(st) == []
    assert st.stats.corrupt_segments[0].reason.startswith("not a spool segment")
    assert (tmp_path / "corrupt" / "0001-x.seg").exists()
    st.close()


def test_damaged_ack_file_means_resend_not_loss(tmp_path):
    st = SegmentStore(tmp_path)
    st.append([("t", b"%d" % i, None) for i in range(4)])
    st.ack(st.next_batch(max_messages=2))
    st.close()
    (path,) = segs(tmp_path)
    Path(str(path) + ".ack").write_bytes(b"\xff" * 12)
    st = SegmentStore(tmp_path)
    st.claim_orphans()
    assert [m[1] for m in drain(st)] == [b"0", b"1", b"2", b"3"]
    st.close()


# ---------------------------------------------------------------------------------------
# the spooling publisher, against an in-process stand-in for nsq_spark.Producer


class FakeProducer:
    """Records what would go to nsqd; fails while `down` is set, refuses `poison`. Typed
    against the drain's port (:class:`nsq_spark.spool._drain.Sender`): mypy checks it."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def _check(self, bodies: Sequence[bytes]) -> None:
        if self.sink.down.is_set():
            raise ConnectionRefusedError("nsqd down")
        if any(b.endswith(b"POISON") for b in bodies):
            raise NSQServerError("E_BAD_MESSAGE", "message too big")

    def publish(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:
        self._check([body])
        self.sink.got.append((topic, body, defer_ms))

    def mpublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        self._check(bodies)
        self.sink.got.extend((topic, b, None) for b in bodies)
        self.sink.mpubs += 1

    def close(self) -> None:
        self.sink.closed += 1


class AsyncFakeProducer(FakeProducer):
    """With the Producer's ``mpublish_async`` (a concurrent.futures.Future)."""

    def mpublish_async(self, topic: str, bodies: Sequence[bytes]
                       ) -> concurrent.futures.Future[bytes]:
        fut: concurrent.futures.Future[bytes] = concurrent.futures.Future()

        def later() -> None:
            time.sleep(0.001)
            try:
                self.mpublish(topic, bodies)
            except Exception as exc:
                fut.set_exception(exc)
            else:
                fut.set_result(b"OK")

        threading.Thread(target=later).start()
        return fut


class Sink:
    def __init__(self, cls: type[FakeProducer] = FakeProducer) -> None:
        self.cls = cls
        self.got: list[tuple[str, bytes, int | None]] = []
        self.down = threading.Event()
        self.mpubs = 0
        self.closed = 0

    def factory(self) -> Sender:
        return self.cls(self)


@pytest.fixture(params=[FakeProducer, AsyncFakeProducer], ids=["sync", "async"])
def sink(request):
    return Sink(request.param)


def test_spooling_producer_delivers_in_order_and_empties_the_spool(tmp_path, sink):
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory,
                  batch_size=50) as p:
        for i in range(120):
            p.publish("t", b"m%d" % i)
        p.mpublish("t", [b"b%d" % i for i in range(200)])
        p.publish("t", b"deferred", defer_ms=100)
        assert p.flush(5)
        assert p.pending_bytes() == 0
    bodies = [b for _, b, _ in sink.got]
    assert bodies == [b"m%d" % i for i in range(120)] + [b"b%d" % i for i in range(200)] + \
        [b"deferred"]
    assert sink.got[-1] == ("t", b"deferred", 100)
    assert segs(tmp_path) == []


def test_spooling_producer_keeps_messages_while_nsqd_is_down(tmp_path, sink):
    sink.down.set()
    p = Producer(spool_dir=tmp_path, producer_factory=sink.factory, retry_max_wait=0.05)
    p.mpublish("t", [b"%d" % i for i in range(100)])
    assert not p.flush(0.3)
    assert sink.got == [] and p.pending_bytes() > 0
    sink.down.clear()
    assert p.flush(5)
    assert [b for _, b, _ in sink.got] == [b"%d" % i for i in range(100)]
    p.close()


def test_close_leaves_unsent_messages_for_the_next_start(tmp_path):
    sink = Sink()
    sink.down.set()
    p = Producer(spool_dir=tmp_path, producer_factory=sink.factory, retry_max_wait=0.05)
    p.mpublish("t", [b"a", b"b"])
    p.close(timeout=0.2)
    assert sink.got == [] and len(segs(tmp_path)) == 1
    with pytest.raises(SpoolError, match="closed"):
        p.publish("t", b"c")
    sink.down.clear()
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory) as p2:
        assert p2.flush(5)
        assert p2.spool_stats.orphans_claimed == 1
    assert [b for _, b, _ in sink.got] == [b"a", b"b"]
    assert segs(tmp_path) == []


def test_refused_message_goes_to_rejected_and_the_rest_is_delivered(tmp_path, sink):
    rejected = []
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory,
                  on_rejected=lambda t, b, e: rejected.append((t, b, e.code))) as p:
        p.mpublish("t", [b"ok1", b"badPOISON", b"ok2"])
        p.publish("t", b"alsoPOISON")
        p.publish("t", b"ok3")
        assert not p.flush(5), "flush() said delivered while nsqd refused two messages"
        st = p.stats()
        assert (st["rejected"], st["acked"], st["messages"], st["appended"]) == (2, 3, 3, 5)
        assert p.flush(5), "the refusals are reported by one flush, not by every later one"
    assert [b for _, b, _ in sink.got] == [b"ok1", b"ok2", b"ok3"]
    assert rejected == [("t", b"badPOISON", "E_BAD_MESSAGE"), ("t", b"alsoPOISON",
                                                                "E_BAD_MESSAGE")]
    (dead,) = (tmp_path / "rejected").iterdir()
    assert [r[1] for r in read_segment(dead).records] == [b"badPOISON", b"alsoPOISON"]


def test_message_id_digest_envelope_on_the_wire(tmp_path, sink):
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory,
                  message_id_digest=True) as p:
        p.mpublish("t", [b"x", b"y"])
        assert p.flush(5)
    for (_, wire, _), body in zip(sink.got, [b"x", b"y"]):
        assert open_envelope(wire) == (hashlib.blake2b(body, digest_size=16).digest(), body)


def test_bad_input_is_refused_before_spooling(tmp_path):
    sink = Sink()
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory) as p:
        with pytest.raises(InvalidNameError):
            p.publish("bad topic!", b"x")
        with pytest.raises(InvalidBodyError):
            p.publish("t", b"")
        with pytest.raises(InvalidBodyError):
            p.mpublish("t", [])
        with pytest.raises(InvalidBodyError):
            p.publish("t", 12)
        with pytest.raises(ValueError, match="defer_ms"):
            p.publish("t", b"x", defer_ms=-1)
        assert p.spool_stats.appended == 0
    with pytest.raises(ValueError, match="nsqd_tcp_addresses"):
        Producer(spool_dir=tmp_path)


def test_spool_full_raise_through_the_producer(tmp_path):
    sink = Sink()
    sink.down.set()
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory,
                  spool_max_bytes=8192, spool_full="raise", retry_max_wait=0.05) as p:
        n = 0
        with pytest.raises(SpoolFullError):
            for n in range(100):
                p.publish("t", b"x" * 500)
        assert 5 <= n < 100
        sink.down.clear()
        assert p.flush(5)
        assert len(sink.got) == n


def test_flush_wakes_up_when_a_damaged_tail_is_dropped(tmp_path):
    _truncated_leftover(tmp_path)
    sink = Sink()
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory) as p:
        t = threading.Thread(target=p.flush)      # no timeout: must be woken, not time out
        t.start()
        t.join(10)
        assert not t.is_alive()
    assert [b for _, b, _ in sink.got] == [b"msg-%d" % i for i in range(4)]


def test_segment_cut_under_its_writer_is_reported_not_looped_on(tmp_path):
    reports = []
    st = SegmentStore(tmp_path, on_corrupt=reports.append)
    st.append([("t", b"a" * 10, None), ("t", b"b" * 10, None)])
    (path,) = segs(tmp_path)
    os.truncate(path, len(ps.MAGIC))          # someone empties the file behind our back
    assert drain(st) == []
    assert len(reports) == 1 and "short" in reports[0].reason
    st.append([("t", b"c", None)])            # a new segment takes the next appends
    assert [m[1] for m in drain(st)] == [b"c"]
    st.close()


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as hst  # noqa: E402

_ops = hst.lists(hst.one_of(
    hst.tuples(hst.just("append"), hst.integers(1, 30), hst.sampled_from(["a", "b"])),
    hst.tuples(hst.just("send"), hst.integers(1, 4), hst.integers(1, 50)),
    hst.tuples(hst.just("restart"), hst.just(0), hst.just("")),
), max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, seg_kib=hst.sampled_from([1, 4, 64]))
def test_any_sequence_of_appends_sends_and_restarts_delivers_each_message_once(
        tmp_path_factory, ops, seg_kib):
    d = tmp_path_factory.mktemp("prop")
    st = SegmentStore(d, segment_bytes=seg_kib << 10, fsync="never")
    appended, delivered, n = [], [], 0
    for op, x, y in ops:
        if op == "append":
            bodies = [b"%s-%d" % (y.encode(), n + i) + b"." * (n % 97) for i in range(x)]
            n += x
            st.append([(y, b, None) for b in bodies])
            appended += bodies
        elif op == "send":
            for _ in range(x):
                b = st.next_batch(max_messages=y, max_bytes=2048)
                if b is None:
                    break
                delivered += b.bodies
                st.ack(b)
        else:
            st.close()                       # a restart: the next store claims the rest
            st = SegmentStore(d, segment_bytes=seg_kib << 10, fsync="never")
            st.claim_orphans()
    st.close()
    st = SegmentStore(d, max_claimed=1000)
    st.claim_orphans()
    delivered += [m[1] for m in drain(st, limit=100_000)]
    st.close()
    assert sorted(delivered) == sorted(appended)     # none lost, none twice
    assert not list(d.glob("*.seg")) and not list(d.glob("*.ack"))


def test_stats_dict_like_the_producer(tmp_path, sink):
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory) as p:
        p.mpublish("t", [b"a", b"b", b"c"])
        assert p.flush(5)
        st = p.stats()
        assert st["appended"] == st["acked"] == 3 and st["pending_bytes"] == 0
        assert st["spool_dir"] == str(tmp_path) and st["last_error"] is None


def test_on_corrupt_callback_may_publish(tmp_path, sink):
    _truncated_leftover(tmp_path)
    holder = {}
    ready = threading.Event()

    def report(info):   # e.g. publish an alert about it through the same producer
        assert ready.wait(10)
        holder["p"].publish("alerts", f"damaged: {info.reason}".encode())

    p = Producer(spool_dir=tmp_path, producer_factory=sink.factory,
                 on_corrupt=report, rescan_interval=0.05)
    holder["p"] = p
    ready.set()
    try:
        deadline = time.monotonic() + 10
        while not any(t == "alerts" for t, _, _ in sink.got) and time.monotonic() < deadline:
            p.flush(0.1)
        assert p.flush(5)
    finally:
        p.close()
    (alert,) = [b for t, b, _ in sink.got if t == "alerts"]
    assert alert.startswith(b"damaged: truncated record")


def test_spool_dir_makes_a_producer_with_the_spool_options(tmp_path):
    sp = Producer("127.0.0.1:4150", spool_dir=tmp_path, spool_fsync=25, spool_full="raise",
                  message_id_digest=True)
    try:
        assert type(sp) is Producer
        store = sp._transport.store
        assert store._sync_ms == 25 and store.full == "raise" and sp.message_id_digest
    finally:
        sp.close(timeout=0)
    plain = Producer("127.0.0.1:4150", max_tries=2)      # no connection until a publish
    try:
        assert type(plain) is Producer and plain.max_tries == 2 and plain.spool_dir is None
    finally:
        plain.close()
    plain = Producer("127.0.0.1:4150", spool_dir=None)
    plain.close()
    with pytest.raises(ValueError, match="spool_fsync only applies to a spooling producer: also give spool_dir"):
        Producer("127.0.0.1:4150", spool_fsync=10)       # spool options need spool_dir


def test_deprecated_spooling_producer_is_a_producer(tmp_path, sink):
    with pytest.warns(DeprecationWarning, match="Producer\\(..., spool_dir=...\\)"):
        p = SpoolingProducer(spool_dir=tmp_path, producer_factory=sink.factory)
    with p:
        assert isinstance(p, Producer)
        p.publish("t", b"old")
        assert p.flush(5)
        assert not hasattr(p, "pub")   # pynsq's pub() answers through a callback: not this
    assert sink.got == [("t", b"old", None)]
