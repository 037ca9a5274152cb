"""The order of copies (nsq_spark.spark._copies) without Spark or sockets: the rule, the
tickets, and any interleaving of the file steps of 2-4 fetch tasks -- with crashes and
retries -- giving each publish id exactly one row, the same on every replay."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nsq_spark.spark._copies import (COPIES_DIR, CopyOrder, Ticket, decode_ticket,
                                    encode_ticket, keep_mask, parse_marker, parse_ticket)
from nsq_spark.spark._seen import PID_DTYPE, IdSet
from nsq_spark.spark._spool import SpoolFenced, _FS

pytestmark = pytest.mark.unit

TAG = 0x1234


def pid(i: int) -> bytes:
    # ids that share their first 8 bytes (one publisher's prefix) and differ in a zero
    # byte: equal only if every byte is
    return b"P" * 8 + i.to_bytes(8, "big")


def keys_of(ids: list[int | None]) -> tuple[np.ndarray, np.ndarray]:
    raw = b"".join(pid(i) if i is not None else bytes(16) for i in ids)
    keys = np.frombuffer(raw, PID_DTYPE, len(ids)).copy()
    return keys, np.array([i is not None for i in ids], bool)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


# -- the rule and the tickets -------------------------------------------------------------


def test_a_row_is_a_copy_when_a_lower_ticket_or_an_earlier_row_of_its_chunk_has_its_id():
    keys, valid = keys_of([1, 2, 2, None, None, 3, 4])
    lower = IdSet(keys_of([3])[0], PID_DTYPE)
    earlier = IdSet(keys_of([4])[0], PID_DTYPE)
    assert keep_mask(keys, valid, (earlier, lower)).tolist() == [
        True, True, False, True, True, False, False]


def test_ids_that_differ_in_one_byte_are_two_publishes():
    keys, valid = keys_of([0x100, 0x1])  # ...0100 and ...0001: same bytes but one
    assert keep_mask(keys, valid, (IdSet(keys[:1], PID_DTYPE),)).tolist() == [False, True]


def test_a_ticket_holds_its_ids_and_a_torn_or_foreign_one_is_none():
    keys, _ = keys_of([5, 1, 3])
    data = encode_ticket(2, 7, TAG, np.sort(keys))
    part, chunk, tag, ids = decode_ticket(data)
    assert (part, chunk, tag) == (2, 7, TAG)
    assert ids.tobytes() == np.sort(keys).tobytes()
    assert decode_ticket(data[:-1]) is None
    assert decode_ticket(data[:10]) is None
    assert decode_ticket(b"x" * len(data)) is None
    flipped = bytearray(data)
    flipped[40] ^= 1
    assert decode_ticket(bytes(flipped)) is None


def test_tickets_are_ordered_by_number_then_partition_then_chunk():
    names = ["t000000002-p00000-c000000-aa", "t000000001-p00003-c000005-bb",
             "t000000001-p00001-c000009-cc", "w-p00001-c000001-17-dd", ".tmp"]
    tickets = sorted(t for t in map(parse_ticket, names) if t is not None)
    assert [t.name for t in tickets] == [names[2], names[1], names[0]]
    assert parse_marker(names[3]).part == 1 and parse_ticket(names[3]) is None
    assert Ticket(1, 3, 5, "bb").name == names[1]


def batch_dir(root: str) -> str:
    d = os.path.join(root, "batch-000000000001")
    os.makedirs(d, exist_ok=True)
    return d


def test_two_tasks_one_after_the_other_keep_the_first_copy(tmp_path):
    fs, d = _FS(str(tmp_path)), batch_dir(str(tmp_path))
    a, b = CopyOrder(fs, d, 0, TAG), CopyOrder(fs, d, 1, TAG)
    assert a.claim(0, *keys_of([1, 2, None])).tolist() == [True, True, True]
    assert b.claim(0, *keys_of([2, 3, 1])).tolist() == [False, True, False]
    assert (a.dropped, b.dropped) == (0, 2)
    # a replay (a new attempt of each) decides the same
    assert CopyOrder(fs, d, 1, TAG).replay(0, *keys_of([2, 3, 1])).tolist() == [
        False, True, False]
    assert CopyOrder(fs, d, 0, TAG).replay(0, *keys_of([1, 2, None])).all()


def test_a_chunk_without_publish_ids_takes_no_ticket(tmp_path):
    fs, d = _FS(str(tmp_path)), batch_dir(str(tmp_path))
    assert CopyOrder(fs, d, 0, TAG).claim(0, *keys_of([None, None])).all()
    assert not os.path.exists(os.path.join(d, COPIES_DIR))


def test_tickets_of_another_topic_are_not_compared_with(tmp_path):
    fs, d = _FS(str(tmp_path)), batch_dir(str(tmp_path))
    CopyOrder(fs, d, 0, tag=1).claim(0, *keys_of([1]))
    assert CopyOrder(fs, d, 1, tag=2).claim(0, *keys_of([1])).all()


def test_a_torn_ticket_is_no_ticket_for_anyone_and_its_chunk_takes_another(tmp_path):
    fs, d = _FS(str(tmp_path)), batch_dir(str(tmp_path))
    CopyOrder(fs, d, 0, TAG).claim(0, *keys_of([1]))
    (name,) = [n for n in os.listdir(os.path.join(d, COPIES_DIR)) if n.startswith("t")]
    path = os.path.join(d, COPIES_DIR, name)
    with open(path, "r+b") as f:
        f.truncate(20)  # an OS crash took part of it (tickets are not fsynced)
    assert CopyOrder(fs, d, 1, TAG).claim(0, *keys_of([1])).all()  # the lowest now
    # partition 0's chunk, replayed, takes a new ticket above partition 1's: a copy
    assert CopyOrder(fs, d, 0, TAG).replay(0, *keys_of([1])).tolist() == [False]


def test_an_earlier_batch_s_ids_are_copies(tmp_path):
    fs, d = _FS(str(tmp_path)), batch_dir(str(tmp_path))
    earlier = IdSet(keys_of([7])[0], PID_DTYPE)
    order = CopyOrder(fs, d, 0, TAG, earlier)
    assert order.claim(0, *keys_of([7, 8])).tolist() == [False, True]


def test_a_committed_batch_gets_no_ticket(tmp_path):
    fs = _FS(str(tmp_path))
    d = os.path.join(str(tmp_path), "batch-000000000009")  # deleted by the driver

    def fenced() -> None:
        raise SpoolFenced("gone")

    with pytest.raises(SpoolFenced):
        CopyOrder(fs, d, 0, TAG, check_fence=fenced).claim(0, *keys_of([1]))
    with pytest.raises(SpoolFenced):  # no fence check given: the directory tells
        CopyOrder(fs, d, 0, TAG).claim(0, *keys_of([1]))
    assert not os.path.exists(d)


def test_a_marker_left_by_a_dead_task_is_waited_for_at_most_the_timeout(tmp_path):
    from nsq_spark.spark._copies import CHOOSING_TIMEOUT

    fs, d = _FS(str(tmp_path)), batch_dir(str(tmp_path))
    clock = Clock()
    dead = CopyOrder(fs, d, 0, TAG, wall=clock)
    steps = dead.claim_steps(0, *keys_of([1]))
    next(steps)  # its marker is written; then it dies
    slept = []

    def sleep(s: float) -> None:
        slept.append(s)
        clock.now += s

    order = CopyOrder(fs, d, 1, TAG, wall=clock, sleep=sleep)
    assert order.claim(0, *keys_of([1])).all()
    assert CHOOSING_TIMEOUT <= sum(slept) < CHOOSING_TIMEOUT + 0.1
    # the next claim of the same task does not wait for it again
    slept.clear()
    assert order.claim(1, *keys_of([1])).tolist() == [False]
    assert not slept
    # the dead task's partition, retried, removes it
    CopyOrder(fs, d, 0, TAG, wall=clock).replay(5, *keys_of([9]))
    assert not [n for n in os.listdir(os.path.join(d, COPIES_DIR)) if n.startswith("w-")]


def test_a_replayed_ticket_waits_for_a_task_still_choosing(tmp_path):
    """The schedule hypothesis found: partition 1 takes number 0 while partition 0 is
    choosing (its listing also gave 0, its ticket not written yet), then dies; its retry
    finds its ticket and must wait for partition 0's marker before it decides, since
    partition 0's ticket (0, p0) is lower than (0, p1)."""
    fs, d = _FS(str(tmp_path)), batch_dir(str(tmp_path))
    clock = Clock()
    first = CopyOrder(fs, d, 0, TAG, wall=clock).claim_steps(0, *keys_of([1]))
    next(first)   # marker written
    next(first)   # listed: number 0; ticket not written yet
    dying = CopyOrder(fs, d, 1, TAG, wall=clock).claim_steps(0, *keys_of([1]))
    for _ in range(3):   # marker, listing (number 0), ticket written; then it dies
        next(dying)
    retry = CopyOrder(fs, d, 1, TAG, wall=clock).replay_steps(0, *keys_of([1]))
    assert next(retry) == 0.0          # found its ticket
    assert next(retry) > 0             # and waits: partition 0 is choosing
    decided = {}
    for name, steps in (("p0", first), ("p1", retry)):
        try:
            while True:
                next(steps)
        except StopIteration as done:
            decided[name] = done.value.tolist()
    assert decided == {"p0": [True], "p1": [False]}


# -- any interleaving --------------------------------------------------------------------


class Task:
    """One partition's fetch task: its chunks in order, each claimed step by step; a
    crash drops the attempt (its files stay) and a new attempt replays the chunks the
    dead one made durable before continuing."""

    def __init__(self, fs: _FS, d: str, index: int, chunks: list[list[int | None]],
                 earlier: IdSet, clock: Clock) -> None:
        self.fs, self.d, self.index, self.chunks = fs, d, index, chunks
        self.earlier, self.clock = earlier, clock
        self.decided: dict[int, list[bool]] = {}
        self.history: list[dict[int, list[bool]]] = []
        self._attempt()

    def _attempt(self) -> None:
        self.order = CopyOrder(self.fs, self.d, self.index, TAG, self.earlier,
                               wall=self.clock)
        self.next_chunk = 0
        self.durable = getattr(self, "durable", 0)  # chunks spooled by any attempt
        self.steps = None
        self.replaying = False

    @property
    def done(self) -> bool:
        return self.steps is None and self.next_chunk >= len(self.chunks)

    def step(self) -> None:
        if self.steps is None:
            k = self.next_chunk
            keys, valid = keys_of(self.chunks[k])
            self.replaying = k < self.durable
            self.steps = (self.order.replay_steps(k, keys, valid) if self.replaying
                          else self.order.claim_steps(k, keys, valid))
            self.durable = max(self.durable, k + 1)  # the chunk is durable before its claim
        try:
            if next(self.steps):
                event("a task waited for another choosing")
        except StopIteration as done:
            self.decided[self.next_chunk] = done.value.tolist()
            self.steps = None
            self.next_chunk += 1

    def crash(self) -> None:
        self.history.append(dict(self.decided))
        self.decided = {}
        self._attempt()


chunk_ids = st.lists(st.one_of(st.none(), st.integers(0, 11)), min_size=0, max_size=6)


@settings(deadline=None, max_examples=200,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plan=st.lists(st.lists(chunk_ids, min_size=1, max_size=3), min_size=2, max_size=4),
       earlier_ids=st.sets(st.integers(0, 11), max_size=3), data=st.data())
def test_any_interleaving_of_tasks_and_crashes_gives_each_id_one_row_on_every_replay(
        plan, earlier_ids, data):
    with tempfile.TemporaryDirectory(prefix="nsq-copies-") as root:
        fs, d = _FS(root), batch_dir(root)
        clock = Clock()  # constant: no marker is ever given up on
        earlier = IdSet(keys_of(sorted(earlier_ids))[0], PID_DTYPE) if earlier_ids \
            else IdSet(dtype=PID_DTYPE)
        tasks = [Task(fs, d, i, chunks, earlier, clock) for i, chunks in enumerate(plan)]
        crashes = 0
        for _ in range(data.draw(st.integers(0, 120), label="scheduled steps")):
            live = [t for t in tasks if not t.done]
            if not live:
                break
            t = live[data.draw(st.integers(0, len(live) - 1), label="who")]
            if crashes < 3 and data.draw(st.integers(0, 15), label="crash?") == 0:
                t.crash()
                crashes += 1
            else:
                t.step()
        event(f"crashes: {crashes}")
        rounds = 0
        while any(not t.done for t in tasks):  # then round-robin to the end
            for t in tasks:
                if not t.done:
                    t.step()
            rounds += 1
            assert rounds < 10_000, "a task waits for ever"

        # what Spark keeps: each partition's last attempt's rows
        counts: dict[int, int] = {}
        nulls = 0
        for t in tasks:
            assert sorted(t.decided) == list(range(len(t.chunks)))
            for k, ids in enumerate(t.chunks):
                for i, kept in zip(ids, t.decided[k]):
                    if i is None:
                        assert kept
                        nulls += 1
                    elif kept:
                        counts[i] = counts.get(i, 0) + 1
            # an earlier attempt decided each chunk it decided as the last one did
            for old in t.history:
                for k, keep in old.items():
                    assert keep == t.decided[k], (t.index, k)
        published = {i for chunks in plan for ids in chunks for i in ids if i is not None}
        assert counts == {i: 1 for i in published - earlier_ids}
        # a replay of everything, by new attempts, decides the same
        for t in tasks:
            order = CopyOrder(fs, d, t.index, TAG, earlier, wall=clock)
            for k, ids in enumerate(t.chunks):
                assert order.replay(k, *keys_of(ids)).tolist() == t.decided[k]


# -- through the fetch task (a stand-in Reader, a real spool) --------------------------------


def published(n: int, nsqd: int, start: int = 0) -> list:
    """Copies of publishes ``start .. start+n-1`` as nsqd ``nsqd`` delivers them: their
    own nsqd ids, the same publish ids."""
    import sys

    from nsq_spark import envelope
    from nsq_spark.message import Message

    sys.path.insert(0, os.path.dirname(__file__))
    from stand_in_reader import Addr

    return [Message(b"%016x" % (nsqd << 40 | i), envelope.stamp(b"body-%d" % i, pid(i)),
                    1_700_000_000_000_000_000 + i, 1, Addr())
            for i in range(start, start + n)]


def run(o, spool, batch, index, queue, log, share=None, fail_after_gets=None):
    import sys

    from nsq_spark.spark._fetch import fetch_stream_partition

    sys.path.insert(0, os.path.dirname(__file__))
    from stand_in_reader import StandInReader

    rows = []
    for rb in fetch_stream_partition(
            o, spool, batch, index, share,
            lambda ro: StandInReader(queue, log, fail_after_gets=fail_after_gets,
                                     max_in_flight=ro.max_in_flight)):
        rows += zip(rb.column("body").to_pylist(), rb.column("publish_id").to_pylist())
    return rows


def fetch_opts(tmp_path, **kw):
    from nsq_spark.spark.options import parse_read_options

    return parse_read_options({"topic": "t", "channel": "c",
                               "nsqdTcpAddresses": "127.0.0.1:4150",
                               "spoolPath": str(tmp_path), "maxInFlight": "4",
                               "idleTimeout": "0.05", **kw}, streaming=True)


def test_copies_in_two_partitions_and_two_batches_are_one_row_and_all_finished(tmp_path):
    from nsq_spark.spark._spool import Spool

    o, spool = fetch_opts(tmp_path), Spool(str(tmp_path), "q")
    spool.write_marker(1)
    log0, log1 = [], []
    # partition 0 gets publishes 0..5 from nsqd 1, partition 1 gets 3..8 from nsqd 2
    rows0 = run(o, spool, 1, 0, published(6, 1), log0)
    rows1 = run(o, spool, 1, 1, published(6, 2, 3), log1)
    assert [b for b, _ in rows0] == [b"body-%d" % i for i in range(6)]
    assert [b for b, _ in rows1] == [b"body-%d" % i for i in range(6, 9)]
    assert {p for _, p in rows0 + rows1} == {pid(i) for i in range(9)}
    # every copy was FINished: none comes back
    assert sum(len(ids) for what, ids in log0 + log1 if what == "FIN") == 12
    done = spool.partition(1, 1).completion()
    assert (done.rows, done.copies_dropped) == (3, 3)
    assert spool.batch_summary(1).copies_dropped == 3
    # replays (a re-executed batch) give the same rows, in another order too
    assert run(o, spool, 1, 1, [], []) == rows1
    assert run(o, spool, 1, 0, [], []) == rows0
    # the next batch: copies of batch 1's publishes (nsqd 3 held them) are not rows
    spool.write_marker(2)
    rows = run(o, spool, 2, 0, published(2, 3, 7) + published(2, 3, 20), [])
    assert [b for b, _ in rows] == [b"body-20", b"body-21"]


def test_a_task_that_dies_after_spooling_copies_is_resumed_with_the_same_rows(tmp_path):
    from nsq_spark.spark._spool import Spool

    o, spool = fetch_opts(tmp_path), Spool(str(tmp_path), "q")
    spool.write_marker(1)
    queue0, log0 = published(8, 1), []
    with pytest.raises(ConnectionError):  # dies after two chunks (tickets taken)
        run(o, spool, 1, 0, queue0, log0, fail_after_gets=3)
    spooled = spool.partition(1, 0).chunk_count()
    assert spooled >= 1
    # meanwhile partition 1 takes copies of all 8, and more
    rows1 = run(o, spool, 1, 1, published(10, 2), [])
    # the retry of partition 0: nsqd sends back what was not FINished (same nsqd ids)
    fin0 = {i for what, ids in log0 if what == "FIN" for i in ids}
    back = [m for m in published(8, 1) if m.id not in fin0]
    rows0 = run(o, spool, 1, 0, back, [])
    ids = [p for _, p in rows0 + rows1]
    assert sorted(ids) == sorted(pid(i) for i in range(10))  # each once
    assert run(o, spool, 1, 0, [], []) == rows0 and run(o, spool, 1, 1, [], []) == rows1


def test_with_drop_copies_off_every_copy_is_a_row(tmp_path):
    from nsq_spark.spark._spool import Spool

    o, spool = fetch_opts(tmp_path, dropCopies="false"), Spool(str(tmp_path), "q")
    spool.write_marker(1)
    rows = run(o, spool, 1, 0, published(3, 1), []) + run(o, spool, 1, 1, published(3, 2), [])
    assert sorted(p for _, p in rows) == sorted([pid(i) for i in range(3)] * 2)
    assert not os.path.exists(os.path.join(spool.batch_dir(1), COPIES_DIR))


def test_drop_copies_is_on_for_streams_and_refused_for_batch_reads():
    from nsq_spark.spark.options import NSQOptionError, parse_read_options

    base = {"topic": "t", "channel": "c", "nsqdTcpAddresses": "127.0.0.1:4150",
            "spoolPath": "/tmp/x"}
    assert parse_read_options(base, streaming=True).drop_copies
    assert not parse_read_options({**base, "dropcopies": "false"}, streaming=True).drop_copies
    assert not parse_read_options(base, streaming=False).drop_copies
    with pytest.raises(NSQOptionError, match="dropCopies.*streaming.*dropDuplicates"):
        parse_read_options({**base, "dropCopies": "true"}, streaming=False)
    with pytest.raises(NSQOptionError, match="true or false"):
        parse_read_options({**base, "dropCopies": "maybe"}, streaming=True)
