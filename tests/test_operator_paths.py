"""The operator paths of issue 34, unit tier (the in-process stand-in for nsqd of
test_publish_spool.py, files in a temporary directory):

* a blocking ``on_error`` / ``on_rejected`` callback neither stops the spool's sending nor
  holds ``close(timeout)`` past its timeout (it used to make ``close(timeout=10)`` take
  67 s and stop the drain);
* ``spool redrive`` of a rejected file with a damaged record sends every intact record,
  those after the damage included, keeps the damaged bytes for inspection, says so, and
  exits non-zero;
* a spool directory renamed away (``mv`` + ``mkdir``) is noticed like a deleted one.
"""

from __future__ import annotations

import io
import os
import threading
import time

import pytest

from nsq_spark.cli import main as cli_main
from nsq_spark import Producer
from nsq_spark.spool import (MAGIC, SegmentStore, SpoolDirectoryError, encode_record,
                             read_segment, redrive)
from test_publish_spool import Sink

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


# -- callbacks -----------------------------------------------------------------------------


def test_a_blocking_on_error_stops_neither_the_sending_nor_close(tmp_path):
    sink = Sink()
    sink.down.set()
    release = threading.Event()
    called = threading.Event()

    def on_error(exc: BaseException) -> None:
        called.set()
        release.wait(60)   # an operator's pager call that hangs

    p = Producer(spool_dir=tmp_path, producer_factory=sink.factory, retry_max_wait=0.01,
                 on_error=on_error)
    try:
        p.mpublish("t", [b"m%d" % i for i in range(20)])
        assert called.wait(10)
        # nsqd comes back while the callback still blocks: the drain sends on
        sink.down.clear()
        assert p.flush(10) is True   # flush is not held by the blocked callback either
        assert len(sink.got) == 20
        p.mpublish("t", [b"late"])
        started = time.monotonic()
        p.close(timeout=1)
        took = time.monotonic() - started
    finally:
        release.set()
    assert took < 5, took   # before: close(timeout=10) took 67 s
    assert [b for _, b, _ in sink.got][-1] == b"late"


def test_callbacks_run_in_order_and_one_that_raises_stops_no_other(tmp_path, caplog):
    from nsq_spark import errors

    seen = []

    def on_rejected(topic: str, body: bytes, exc: BaseException) -> None:
        seen.append(body)
        if body == b"aPOISON":
            raise RuntimeError("the operator's callback broke")

    sink = Sink()
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory, retry_max_wait=0.01,
                  on_rejected=on_rejected) as p:
        p.mpublish("t", [b"aPOISON", b"ok", b"bPOISON"])
        assert p.flush(5) is False   # refused ones: reported once
    assert seen == [b"aPOISON", b"bPOISON"]
    assert any("on_rejected callback failed" in r.getMessage() for r in caplog.records)
    assert isinstance(errors.NSQError("x"), Exception)


# -- redrive -------------------------------------------------------------------------------


def _rejected_file(directory, records: list[bytes]) -> str:
    rdir = directory / "rejected"
    rdir.mkdir(parents=True, exist_ok=True)
    path = rdir / "00000000000000000001-1-1-aaaaaa.seg"
    path.write_bytes(MAGIC + b"".join(records))
    return str(path)


def test_redrive_sends_every_intact_record_and_keeps_the_damaged_bytes(tmp_path):
    good = [encode_record("t", b"r%d" % i) for i in range(6)]
    damaged = bytearray(encode_record("t", b"DAMAGED"))
    damaged[12] ^= 0xFF   # a flipped byte: its checksum fails
    _rejected_file(tmp_path, good[:2] + [bytes(damaged)] + good[2:])
    done = redrive(tmp_path)
    # before: the 4 records after the damage were kept back, and said to be sent
    assert (done.messages, done.files) == (6, 1)
    assert len(done.damaged) == 1 and "checksum mismatch" in done.damaged[0]
    assert done.kept_back_bytes == len(damaged)
    queued = [f for f in os.listdir(tmp_path) if f.endswith(".seg")]
    (seg,) = queued
    assert [r[1] for r in read_segment(tmp_path / seg).records] == \
        [b"r%d" % i for i in range(6)]
    kept = os.listdir(tmp_path / "corrupt")
    assert len(kept) == 1 and (tmp_path / "corrupt" / kept[0]).read_bytes() == \
        MAGIC + b"".join(good[:2]) + bytes(damaged) + b"".join(good[2:])
    # the queue sends them all
    sink = Sink()
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory) as p:
        assert p.flush(5)
    assert sorted(b for _, b, _ in sink.got) == [b"r%d" % i for i in range(6)]


def test_redrive_of_a_truncated_tail_keeps_back_only_the_tail(tmp_path):
    good = [encode_record("t", b"r%d" % i) for i in range(3)]
    _rejected_file(tmp_path, good + [encode_record("t", b"cut")[:7]])
    done = redrive(tmp_path)
    assert done.messages == 3 and done.kept_back_bytes == 7
    assert "truncated" in done.damaged[0]


def test_the_redrive_command_exits_non_zero_when_it_kept_bytes_back(tmp_path):
    damaged = bytearray(encode_record("t", b"x"))
    damaged[10] ^= 1
    _rejected_file(tmp_path, [encode_record("t", b"a"), bytes(damaged),
                              encode_record("t", b"b")])
    err = io.StringIO()
    rc = cli_main(["spool", "redrive", str(tmp_path)], stderr=err)
    assert rc == 1
    text = err.getvalue()
    assert "moved 2 messages in 1 file" in text
    assert "kept back" in text and f"{len(damaged)} damaged bytes" in text
    assert "corrupt/" in text and "intact records are sent" not in text
    # clean: 0
    (tmp_path / "rejected").mkdir(exist_ok=True)
    err = io.StringIO()
    assert cli_main(["spool", "redrive", str(tmp_path)], stderr=err) == 0


# -- the directory renamed away ----------------------------------------------------------


@pytest.mark.parametrize("fsync", ["always", "never"])
def test_a_spool_directory_renamed_away_is_noticed_like_a_deleted_one(tmp_path, fsync):
    d = tmp_path / "spool"
    store = SegmentStore(d, fsync=fsync)
    try:
        store.append([("t", b"before", None)])
        os.rename(d, tmp_path / "spool.old")
        d.mkdir()
        time.sleep(0.01)   # past the link check's rate limit (fsync="never")
        with pytest.raises(SpoolDirectoryError, match="deleted or replaced while in use"):
            store.append([("t", b"after", None)])
        # nothing was written where nobody looks: the new directory is empty
        assert os.listdir(d) == []
    finally:
        store.close()


# -- telemetry ---------------------------------------------------------------------------


def test_a_publish_refused_before_sending_is_not_counted_as_sent():
    pytest.importorskip("opentelemetry.sdk")
    from nsq_spark.errors import InvalidBodyError, InvalidNameError, NSQServerError
    from nsq_spark._publish.instrument import TracedTransport
    from test_telemetry_unit import FakeTransport, Otel, _port

    otel = Otel()
    p = Producer(["127.0.0.1:1"], telemetry=otel.telemetry)   # never connected
    try:
        with pytest.raises(InvalidNameError):
            p.publish("bad topic!", b"x")
        with pytest.raises(InvalidBodyError):
            p.mpublish("t", [b"a", b""])
    finally:
        p.close()
    # before: 3 messages counted as sent, though nothing left the process
    data = otel.metrics.get_metrics_data()
    sent = [pt for rm in data.resource_metrics for sm in rm.scope_metrics
            for m in sm.metrics if m.name == "messaging.client.sent.messages"
            for pt in m.data.data_points]
    assert sent == []
    durations = otel.points("messaging.client.operation.duration")
    assert sorted(d.attributes["error.type"] for d in durations) == [
        "nsq_spark.errors.InvalidBodyError", "nsq_spark.errors.InvalidNameError"]
    # nsqd's refusal is an attempt: counted, with nsqd's code (as before)
    otel = Otel()
    traced = TracedTransport(
        otel.telemetry, _port(FakeTransport(NSQServerError("E_BAD_TOPIC", "bad"))), None)
    with pytest.raises(NSQServerError):
        traced.publish("t", b"x", None)
    (point,) = otel.points("messaging.client.sent.messages")
    assert point.value == 1 and point.attributes["error.type"] == "E_BAD_TOPIC"
