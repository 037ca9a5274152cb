"""The spool's promise, unit tier: what ``publish()`` accepted is delivered or stays on
disk and is retried, unless nsqd refused that very message (then it is in ``rejected/``,
counted apart, and can be re-driven). Also: a deleted spool directory, private file
modes, the one validation path. Against the in-process stand-in for the Producer of
test_publish_spool.py; the real-nsqd, Toxiproxy and full-disk cases are in
tests/chaos/test_chaos_spool.py and test_publish_spool_disk.py."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import ssl
import stat
import threading
import time

import pytest

from nsq_spark import Producer, errors
from nsq_spark.cli import main as cli_main
from nsq_spark.spool import (SegmentStore, SpoolDirectoryError, SpoolError, read_segment,
                             redrive, refused)
from test_publish_spool import FakeProducer, Sink, segs

pytestmark = pytest.mark.unit


class ScriptedProducer(FakeProducer):
    """Fails each send with the next exception of ``sink.script`` while any is left."""

    def _check(self, bodies):
        if self.sink.script:
            raise self.sink.script.pop(0)
        super()._check(bodies)


def scripted(script):
    sink = Sink(ScriptedProducer)
    sink.script = list(script)
    return sink


# the failures that happen to the connection, not to the message: kept and retried
CONNECTION_FAILURES = [
    errors.AuthFailedError("E_AUTH_FAILED", "AUTH failed"),
    errors.AuthFailedError("E_AUTH_FIRST", "AUTH required before PUB"),
    errors.UnauthorizedError("E_UNAUTHORIZED", "AUTH failed for PUB on \"t\" \"\""),
    errors.AuthError("the auth server is down"),
    errors.TLSError("TLS upgrade failed"),
    ssl.SSLCertVerificationError(1, "certificate verify failed"),
    errors.ProtocolError("frame size 1213486160 is not possible (wrong port?)"),
    errors.InvalidError("E_INVALID", "cannot PUB in current state (TLS required)"),
    errors.BadBodyError("E_BAD_BODY", "IDENTIFY failed to decode JSON body"),
    errors.InvalidError("E_INVALID", "AUTH invalid body size 0"),
    errors.PubFailedError("E_PUB_FAILED", "exiting"),
    errors.ConnectError("connection refused"),
    errors.ConnectionClosedError("closed"),
    errors.NSQTimeoutError("no answer"),
    errors.ConfigError("some inner setting"),
    RuntimeError("a bug somewhere in the sender"),
]
# nsqd refusing the message itself: no retry changes the answer
REFUSALS = [
    errors.BadTopicError("E_BAD_TOPIC", "PUB topic name \"x y\" is not valid"),
    errors.BadMessageError("E_BAD_MESSAGE", "PUB message too big 2000 > 1024"),
    errors.BadBodyError("E_BAD_BODY", "MPUB body too big"),
    errors.InvalidError("E_INVALID", "DPUB timeout 7200000 out of range 0-3600000"),
    errors.BadMessageError("E_BAD_MESSAGE", "HTTP 400 from nsqd h:4151: MSG_TOO_BIG"),
    errors.InvalidError("E_INVALID", "invalid command DPUB"),   # an nsqd without DPUB
    errors.InvalidBodyError("body over max_msg_size"),
]


def test_the_spool_rule_refuses_only_what_nsqd_refused_of_the_message():
    assert not any(refused(e) for e in CONNECTION_FAILURES)
    assert all(refused(e) for e in REFUSALS)
    # and the direct path keeps failing fast on AUTH and TLS (a caller waits there)
    assert not errors.is_transient(CONNECTION_FAILURES[0])
    assert not errors.is_transient(CONNECTION_FAILURES[4])


@pytest.mark.parametrize("exc", CONNECTION_FAILURES, ids=lambda e: type(e).__name__)
def test_a_connection_failure_is_retried_never_rejected(tmp_path, exc):
    sink = scripted([exc, exc, exc])
    rejected = []
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory, retry_max_wait=0.01,
                  on_rejected=lambda *a: rejected.append(a)) as p:
        p.mpublish("t", [b"a", b"b"])
        p.publish("t", b"c")
        assert p.flush(5)
        st = p.stats()
    assert [b for _, b, _ in sink.got] == [b"a", b"b", b"c"]
    assert (st["rejected"], st["acked"], st["messages"], rejected) == (0, 3, 3, [])
    assert st["health"] == "ok" and st["consecutive_failures"] == 0
    assert not (tmp_path / "rejected").exists()


@pytest.mark.parametrize("exc", REFUSALS, ids=lambda e: getattr(e, "code", type(e).__name__))
def test_a_refusal_of_the_message_goes_to_rejected_and_is_counted_apart(tmp_path, exc):
    sink = scripted([exc, exc])   # the MPUB, then the first message sent alone
    rejected = []
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory, retry_max_wait=0.01,
                  on_rejected=lambda t, b, e: rejected.append((b, e))) as p:
        p.mpublish("t", [b"bad", b"good"])
        assert not p.flush(5), "flush() reported delivered a message nsqd refused"
        st = p.stats()
        assert p.flush(5)   # reported once
    assert [b for _, b, _ in sink.got] == [b"good"]
    assert rejected == [(b"bad", exc)]
    assert (st["rejected"], st["acked"], st["errors"], st["appended"]) == (1, 1, 1, 2)
    (kept,) = (tmp_path / "rejected").iterdir()
    assert [r[1] for r in read_segment(kept).records] == [b"bad"]


def test_while_sending_fails_flush_says_so_health_shows_the_cause_on_error_is_rate_limited(
        tmp_path, caplog):
    sink = Sink()
    sink.down.set()
    calls = []
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory, retry_max_wait=0.01,
                  on_error=calls.append) as p:
        started = time.time()
        p.mpublish("t", [b"m%d" % i for i in range(50)])
        assert not p.flush(0.5), "flush() said delivered while nsqd was down"
        st = p.stats()
        assert st["health"] == "failing" and st["consecutive_failures"] >= 5
        assert "ConnectionRefusedError: nsqd down" == st["last_error"]
        assert started <= st["failing_since"] <= time.time() and st["rejected"] == 0
        assert st["spool_pending"] == 50 and st["acked"] == 0
        # one ERROR and one on_error call for many failed attempts (rate-limited)
        assert len(calls) == 1 and isinstance(calls[0], ConnectionRefusedError)
        errs = [r for r in caplog.records if r.levelname == "ERROR"]
        assert len(errs) == 1 and "nsqd down" in errs[0].getMessage()
        sink.down.clear()
        assert p.flush(5)
        st = p.stats()
        assert st["health"] == "ok" and st["last_error"] is None
        assert st["failing_since"] is None and st["consecutive_failures"] == 0
        assert (st["acked"], st["rejected"], len(sink.got)) == (50, 0, 50)
        # a second outage soon after: shown in the health, not logged again (flapping)
        sink.down.set()
        p.publish("t", b"again")
        assert not p.flush(0.3) and p.stats()["health"] == "failing"
        assert len(calls) == 1
        assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1
        sink.down.clear()
        assert p.flush(5) and p.stats()["health"] == "ok"


def test_redrive_puts_rejected_messages_back_in_the_queue(tmp_path, monkeypatch):
    sink = Sink()
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory,
                  retry_max_wait=0.01) as p:
        p.mpublish("t", [b"aPOISON", b"ok", b"bPOISON"])
        assert not p.flush(5)
        assert p.stats()["rejected"] == 2 and [g[1] for g in sink.got] == [b"ok"]
        monkeypatch.setattr(FakeProducer, "_check", lambda self, bodies: None)   # fixed
        assert p.redrive() == 2
        assert p.flush(5)
        st = p.stats()
    assert sorted(g[1] for g in sink.got) == [b"aPOISON", b"bPOISON", b"ok"]
    assert (st["redriven"], st["acked"], st["rejected"]) == (2, 3, 2)
    assert not list((tmp_path / "rejected").iterdir()) and not segs(tmp_path)


def test_redrive_from_the_command_line_leaves_a_file_still_being_written(tmp_path, capsys):
    st = SegmentStore(tmp_path)
    st.append([("t", b"x", None), ("t", b"y", None)])
    b = st.next_batch()
    st.reject(b, 0, RuntimeError("refused"))   # this store keeps its rejected file open
    st.ack(b, rejected=1)
    rdir = tmp_path / "rejected"
    closed = rdir / "00000000000000000001-1-abcdef.seg"
    shutil.copy(next(rdir.iterdir()), closed)  # one a dead process left behind
    assert cli_main(["spool", "redrive", str(tmp_path)]) == 0
    out = capsys.readouterr().err
    assert "moved 1 message in 1 file" in out and "1 file is still being written" in out
    assert [p.name for p in rdir.iterdir()] != [closed.name]
    moved = [p for p in segs(tmp_path) if p.name.endswith("-redriven.seg")]
    assert [r[1] for r in read_segment(moved[0]).records] == [b"x"]
    assert st.redrive().messages == 1 and not list(rdir.iterdir())   # its own file too
    st.claim_orphans()
    got = []
    while (bt := st.next_batch()) is not None:
        got += bt.bodies
        st.ack(bt)
    assert sorted(got) == [b"x", b"x"] and st.stats.redriven == 1
    st.close()
    assert redrive(tmp_path).messages == 0
    assert cli_main(["spool", "redrive", str(tmp_path / "nowhere")]) != 0


# ---------------------------------------------------------------------------------------
# the directory


def test_a_deleted_spool_directory_makes_publish_raise_at_once(tmp_path):
    d = tmp_path / "spool"
    sink = Sink()
    sink.down.set()       # nothing delivered: the files hold the only copies
    p = Producer(spool_dir=d, producer_factory=sink.factory, retry_max_wait=0.01)
    try:
        for i in range(20):
            p.publish("t", b"m%d" % i)
        shutil.rmtree(d)
        with pytest.raises(SpoolDirectoryError, match=f"{d}.*deleted or replaced.*new one"):
            p.publish("t", b"after")
        d.mkdir()          # replaced: still refused, the old files are gone for good
        with pytest.raises(SpoolDirectoryError):
            p.mpublish("t", [b"again"])
        assert p.stats()["appended"] == 20
        sink.down.clear()  # what was spooled before is still sent from the open files
        assert p.flush(5) and [g[1] for g in sink.got] == [b"m%d" % i for i in range(20)]
    finally:
        p.close()


@pytest.mark.parametrize("fsync", ["never", 10])
def test_without_fsync_always_a_deleted_directory_raises_within_a_millisecond(tmp_path,
                                                                              fsync):
    d = tmp_path / "spool"
    st = SegmentStore(d, fsync=fsync)
    st.append([("t", b"one", None)])
    shutil.rmtree(d)
    time.sleep(0.002)   # the check runs at most once per ms off the "always" policy
    with pytest.raises(SpoolDirectoryError, match="deleted or replaced"):
        st.append([("t", b"two", None)])
    assert st.stats.appended == 1
    st.close()


def test_a_directory_moved_away_is_noticed_by_the_next_rescan(tmp_path):
    d = tmp_path / "spool"
    st = SegmentStore(d)
    st.append([("t", b"one", None)])
    os.rename(d, tmp_path / "elsewhere")
    d.mkdir()
    st.claim_orphans()    # the drain's periodic rescan
    with pytest.raises(SpoolDirectoryError, match="deleted or replaced"):
        st.append([("t", b"two", None)])
    st.close()


def test_spool_files_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        d = tmp_path / "new" / "spool"
        st = SegmentStore(d)
        st.append([("t", b"secret body", None), ("t", b"other", None)])
        b = st.next_batch(max_messages=1)
        st.reject(b, 0, RuntimeError("refused"))
        st.ack(b, rejected=1)
        files = [*segs(d), *d.glob("*.ack"), *(d / "rejected").iterdir()]
        assert len(files) == 3
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in files}
        assert set(modes.values()) == {0o600}, modes
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        assert stat.S_IMODE((d / "rejected").stat().st_mode) == 0o700
        st.close()
        # a directory that already existed keeps its owner's mode; the files are 0600
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o750)
        os.umask(0o277)   # even a umask that takes the owner's write bit away
        st = SegmentStore(shared)
        st.append([("t", b"x", None)])
        assert stat.S_IMODE(shared.stat().st_mode) == 0o750
        assert [stat.S_IMODE(p.stat().st_mode) for p in segs(shared)] == [0o600]
        st.close()
    finally:
        os.umask(old)


# ---------------------------------------------------------------------------------------
# one validation path


TOPICS = ["t", b"t", bytearray(b"t"), "t#ephemeral", "bad topic", b"\xff", "", "x" * 65,
          5, None]
BODIES = [b"x", bytearray(b"x"), memoryview(b"x"), "x", b"", None, 7]


def _outcome(call):
    try:
        call()
    except Exception as exc:   # noqa: BLE001 - the class is the outcome
        return type(exc).__name__
    return "ok"


def test_the_spooling_producer_accepts_exactly_what_the_direct_one_does(tmp_path):
    sink = Sink()
    direct = Producer("127.0.0.1:1")   # no connection is made to encode
    with Producer(spool_dir=tmp_path, producer_factory=sink.factory) as p:
        for topic in TOPICS:
            for body in BODIES:
                want = _outcome(lambda: direct._transport.encode_pub(topic, body, None))
                got = _outcome(lambda: p.publish(topic, body))
                assert got == want, (topic, body)
                want = _outcome(lambda: direct._transport.encode_mpub(topic, [b"a", body]))
                got = _outcome(lambda: p.mpublish(topic, [b"a", body]))
                assert got == want, (topic, body, "mpublish")
        assert p.flush(5)
        accepted = p.stats()["appended"]
    direct.close()
    assert accepted == 4 * 3 + 4 * 3 * 2   # 4 good topics, 3 good bodies
    assert {g[0] for g in sink.got} == {"t", "t#ephemeral"}   # bytes topics as str


def test_the_publish_summary_says_how_to_send_the_refused_messages_again():
    from nsq_spark import cli
    from nsq_spark.cli import publish

    args = cli.build_parser().parse_args(
        ["publish", "--topic", "t", "--nsqd-tcp-address", "h:1", "--spool-dir", "/sp"])
    text = publish._spool_summary(args, 3, {"acked": 2, "rejected": 1, "pending_bytes": 0},
                              False)
    assert "nsqd acknowledged 2; nsqd refused 1 for good" in text
    assert "nsq-spark spool redrive /sp" in text
