"""The redelivery index (nsq_spark.spark._seen) without Spark or sockets: the id keys, the
set, the pruning rule, and a fetch task dropping what an earlier batch, another partition
of the same batch, or an earlier attempt of the same partition already spooled."""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark.spark._fetch import fetch_stream_partition
from nsq_spark.spark.options import NSQOptionError, parse_read_options
from nsq_spark.spark._seen import (IdSet, IndexFile, SeenIndex, first_copies, id_keys,
                                  parse_index_name, to_prune)
from nsq_spark.spark._spool import Spool

sys.path.insert(0, os.path.dirname(__file__))
from stand_in_reader import StandInReader  # noqa: E402
from test_spark_unit import bodies, make_messages, opts  # noqa: E402

u64 = st.integers(min_value=0, max_value=2**64 - 1)


# -- keys --------------------------------------------------------------------------------


@settings(deadline=None)  # a busy machine: the first call imports numpy's parts
@given(st.lists(u64, max_size=50), st.booleans())
def test_a_key_is_the_number_the_16_hex_digits_spell(values, upper):
    ids = [("%016X" if upper else "%016x") % v for v in values]
    keys, valid = id_keys(pa.array(ids, pa.string()))
    assert keys.tolist() == values and valid.all()


def test_ids_that_are_not_16_hex_digits_are_never_keys():
    keys, valid = id_keys(pa.array(["0123456789abcdeg", "short", None, "00000000000000ff"],
                                   pa.string()))
    assert valid.tolist() == [False, False, False, True]
    assert keys[3] == 255


def test_keys_of_a_slice_and_of_a_filtered_batch_are_those_rows():
    ids = pa.array(["%016x" % i for i in range(10)], pa.string())
    keys, _ = id_keys(ids.slice(3, 4))
    assert keys.tolist() == [3, 4, 5, 6]
    keys, _ = id_keys(ids.filter(pa.array([i % 3 == 0 for i in range(10)])))
    assert keys.tolist() == [0, 3, 6, 9]
    keys, _ = id_keys(pa.chunked_array([ids.slice(0, 2), ids.slice(8)]))
    assert keys.tolist() == [0, 1, 8, 9]


@settings(deadline=None)
@given(st.lists(st.text("0123456789abcdefABCDEF g\t", min_size=14, max_size=18), max_size=30))
def test_the_fast_decoding_of_a_chunk_s_ids_agrees_with_the_digit_by_digit_one(ids):
    """bytes.fromhex over the whole column, or the rows one by one: the same keys, and an
    id with a space or a letter past f is no key either way (fromhex skips spaces)."""
    from nsq_spark.spark._seen import _decode

    keys, valid = id_keys(pa.array(ids, pa.string()))
    for i, one in enumerate(ids):
        ok = len(one) == 16 and all(c in "0123456789abcdefABCDEF" for c in one)
        assert bool(valid[i]) is ok, one
        if ok:
            want, _ = _decode(np.frombuffer(one.encode(), np.uint8).reshape(1, 16))
            assert int(keys[i]) == int(want[0])


@given(st.lists(st.sampled_from(["127.0.0.1:4150", "127.0.0.1:4151", "", None]),
                min_size=1, max_size=20))
def test_a_column_of_one_nsqd_is_told_apart_from_one_of_several(addresses):
    """The nsqd tags of a chunk: one tag for a column of one address (no hash table),
    else a tag per row -- the same tags either way."""
    from nsq_spark.spark._seen import _address_tag, _one_value, nsqd_tags

    col = pa.array(addresses, pa.string())
    one = _one_value(col)
    assert one == (addresses[0] if len(set(addresses)) == 1 and None not in addresses
                   else None)
    if None not in addresses:  # (a row without an address: the dictionary path's rule)
        assert nsqd_tags(col).tolist() == [_address_tag(a) for a in addresses]
        assert nsqd_tags(col.slice(1)).tolist() == [_address_tag(a) for a in addresses[1:]]


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12)), max_size=40),
       st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12)), max_size=10))
def test_one_sort_gives_the_first_copies_and_the_sorted_pairs_of_a_chunk(rows, seen):
    """The gate's one sort per chunk: the keep mask of first_copies_by and the (nsqd, id)
    pairs sorted, whether the chunk comes from one nsqd or several."""
    from nsq_spark.spark._seen import KeySet, _first_copies_sorted, sorted_pairs

    nsqds = np.array([t for t, _ in rows], np.uint64)
    keys = np.array([k for _, k in rows], np.uint64)
    known = KeySet()
    if seen:
        known.add(np.array([t for t, _ in seen], np.uint64),
                  np.array([k for _, k in seen], np.uint64))
    keep, t, k = _first_copies_sorted(nsqds, keys, np.ones(len(rows), bool), [known])
    met, expect = set(seen), []
    for row in rows:
        expect.append(row not in met)
        met.add(row)
    assert keep.tolist() == expect
    assert sorted(zip(t.tolist(), k.tolist())) == sorted(rows)
    assert list(zip(t.tolist(), k.tolist())) == sorted(rows)
    if keep.all():
        st_, sk = sorted_pairs(nsqds, keys)
        assert (t.tolist(), k.tolist()) == (st_.tolist(), sk.tolist())


# -- the set -----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(u64, max_size=20), max_size=20), st.lists(u64, max_size=30))
def test_the_set_answers_as_a_python_set(adds, queries):
    s, model = IdSet(), set()
    for keys in adds:  # more adds than _MAX_RUNS: the runs get merged on the way
        s.add(np.array(keys, np.uint64))
        model.update(keys)
    probe = queries + sorted(model)[:10]
    assert s.contains(np.array(probe, np.uint64)).tolist() == [k in model for k in probe]
    assert len(s) >= len(model) and s.sorted_keys().tolist() == sorted(model)


@settings(deadline=None)
@given(st.lists(st.integers(0, 20), max_size=40), st.lists(st.integers(0, 20), max_size=10))
def test_a_chunk_keeps_the_first_copy_of_each_id_not_seen_before(chunk, seen):
    keys = np.array(chunk, np.uint64)
    keep = first_copies(keys, np.ones(len(keys), bool), [IdSet(np.array(seen, np.uint64))])
    expect, met = [], set(seen)
    for k in chunk:
        expect.append(k not in met)
        met.add(k)
    assert keep.tolist() == expect


def test_a_row_without_a_valid_key_is_always_kept():
    keys = np.array([5, 5, 0], np.uint64)
    keep = first_copies(keys, np.array([True, True, False]), [IdSet(np.array([0], np.uint64))])
    assert keep.tolist() == [True, False, True]


# -- retention ---------------------------------------------------------------------------


def f(batch, ids, age_s, now_ms=10_000_000):
    t = now_ms - int(age_s * 1000)
    name = f"b{batch:012d}-p00000-n{ids}-d0-t{t}-abcd1234.arrow"
    got = parse_index_name(name)
    assert got == IndexFile(name, batch, 0, ids, 0, t)
    return got


def test_files_older_than_the_window_go_unless_their_batch_is_not_committed():
    files = [f(1, 10, 400), f(2, 10, 200), f(3, 10, 400)]
    gone = to_prune(files, committed=2, now_ms=10_000_000, window_s=300, max_ids=10**6)
    assert [g.batch for g in gone] == [1]  # batch 3 is not committed: a restart replays it


def test_beyond_the_cap_the_oldest_committed_batches_go_first():
    files = [f(3, 10, 1), f(1, 10, 1), f(2, 10, 1), f(4, 10, 1)]
    gone = to_prune(files, committed=3, now_ms=10_000_000, window_s=300, max_ids=15)
    assert sorted(g.batch for g in gone) == [1, 2, 3]  # batch 4 stays: not committed
    gone = to_prune(files, committed=4, now_ms=10_000_000, window_s=300, max_ids=25)
    assert sorted(g.batch for g in gone) == [1, 2]


def test_redelivery_window_option():
    def parse(**kw):
        return parse_read_options(opts(spoolPath="/tmp/x", **kw), streaming=True)

    assert parse().redelivery_window == 300 and parse().redelivery_window_max_ids == 5_000_000
    assert parse(redeliverywindow="0").redelivery_window == 0
    for bad in ("-1", "soon", "inf"):
        with pytest.raises(NSQOptionError, match="redeliveryWindow"):
            parse(redeliveryWindow=bad)
    with pytest.raises(NSQOptionError, match="redeliveryWindowMaxIds"):
        parse(redeliveryWindowMaxIds="0")


# -- fetch tasks -------------------------------------------------------------------------


def read_opts(tmp_path, **kw):
    return parse_read_options(opts(spoolPath=str(tmp_path), maxInFlight="4",
                                   idleTimeout="0.05", **kw), streaming=True)


def fetch(o, spool, batch, index, queue, log, share=None, **kw):
    return bodies(fetch_stream_partition(
        o, spool, batch, index, share,
        lambda ro: StandInReader(queue, log, max_in_flight=ro.max_in_flight, **kw)))


def fins(log):
    return sorted(i for what, ids in log if what == "FIN" for i in ids)


def test_a_redelivery_of_an_earlier_batch_is_finished_not_a_row(tmp_path):
    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q")
    log: list = []
    assert fetch(o, spool, 1, 0, make_messages(5), log) == [b"body-%d" % i for i in range(5)]
    # nsqd sends 1..3 again (same ids: a lost FIN, a rewound disk queue), then 5..6
    log.clear()
    again = make_messages(3, 1) + make_messages(2, 5)
    sent = sorted(m.id for m in again)
    assert fetch(o, spool, 2, 0, again, log) == [b"body-5", b"body-6"]
    assert fins(log) == sent  # the duplicates were FINished too
    # the spool of batch 1 is gone after commit; its ids are still remembered
    spool.delete_upto(1)
    log.clear()
    assert fetch(o, spool, 3, 0, make_messages(1, 2) + make_messages(1, 9), log) == \
        [b"body-9"]
    files = SeenIndex(spool).files()
    assert sorted((x.batch, x.ids, x.dropped) for x in files) == \
        [(1, 5, 0), (2, 2, 3), (3, 1, 1)]


def test_a_redelivery_of_another_partition_of_the_same_batch_is_dropped(tmp_path):
    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q")
    log: list = []
    assert fetch(o, spool, 4, 0, make_messages(4), log) == [b"body-%d" % i for i in range(4)]
    # partition 1 of the same batch gets 2 again and repeats 7 within its own stream
    queue = make_messages(1, 2) + make_messages(1, 7) + make_messages(1, 7)
    assert fetch(o, spool, 4, 1, queue, log) == [b"body-7"]


def test_a_retried_partition_drops_redeliveries_of_what_its_dead_attempt_spooled(tmp_path):
    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q")
    queue, log = make_messages(6), []
    with pytest.raises(ConnectionError):  # dies after two chunks of 2, before their FIN...
        fetch(o, spool, 2, 0, queue, log, fail_after_gets=2)
    # ... (here they were FINished; were they not, nsqd would send them again:)
    queue[:0] = make_messages(4)
    got = fetch(o, spool, 2, 0, queue, log)
    assert sorted(got) == sorted(b"body-%d" % i for i in range(6)) and len(got) == 6
    # the completed partition replays the same rows, and the next batch knows them all
    assert fetch(o, spool, 2, 0, [], log) == got
    assert fetch(o, spool, 3, 0, make_messages(6), log) == []


def test_with_a_window_of_0_nothing_is_remembered(tmp_path):
    o = read_opts(tmp_path, redeliveryWindow="0")
    spool = Spool(str(tmp_path), "q")
    log: list = []
    fetch(o, spool, 1, 0, make_messages(3), log)
    assert fetch(o, spool, 2, 0, make_messages(3), log) == [b"body-%d" % i for i in range(3)]
    assert SeenIndex(spool).files() == []


def test_commit_prunes_index_files_past_the_window(tmp_path):
    from nsq_spark.spark.datasource import NSQStreamReader
    from nsq_spark.spark._offset import BatchOffset

    spool = Spool(str(tmp_path), "q")
    log: list = []
    o = read_opts(tmp_path)
    fetch(o, spool, 1, 0, make_messages(3), log)
    fetch(o, spool, 2, 0, make_messages(3) + make_messages(3, 3), log)
    index = SeenIndex(spool)
    old = next(x for x in index.files() if x.batch == 1)
    os.rename(f"{index.dir}/{old.name}", f"{index.dir}/" + old.name.replace(
        f"-t{old.written_ms}-", f"-t{old.written_ms - 301_000}-"))
    reader = NSQStreamReader(opts(spoolPath=str(tmp_path), redeliveryWindow="300"))
    reader.commit({"query": "q", "batch": 2, "size": 0})
    assert [x.batch for x in index.files()] == [2]
    assert reader.reportLatestOffset() is None  # nothing planned yet by this driver
    reader._latest = BatchOffset.from_json({"query": "q", "batch": 2, "size": 0})
    report = reader.reportLatestOffset()
    assert report["redeliveriesDropped"] == 3 and report["topic"] == "t"
    assert "topic='t'" in repr(reader) and "channel='c'" in repr(reader)


def test_a_peer_chunk_being_written_is_read_at_a_later_cut(tmp_path):
    from nsq_spark.spark._schema import messages_to_batch
    from nsq_spark.spark._seen import Redeliveries

    spool = Spool(str(tmp_path), "q")
    peer = spool.partition(7, 1)
    peer._ensure_dir()
    with open(peer.chunk_path(0), "wb") as f:  # half written: not readable yet
        f.write(b"ARROW1\0\0")
    gate = Redeliveries(spool, 7, 0)
    first = messages_to_batch(make_messages(2), "t", "c")
    assert gate.keep(first).num_rows == 2  # nothing of the peer's could be FINished yet
    os.unlink(peer.chunk_path(0))
    peer.write_chunk(0, messages_to_batch(make_messages(2, 10), "t", "c"))
    again = messages_to_batch(make_messages(1, 11) + make_messages(1, 12), "t", "c")
    assert gate.keep(again).column("id").to_pylist() == ["%016d" % 12]
    assert gate.dropped == 1


def test_peers_read_the_keys_file_and_fall_back_to_the_chunk(tmp_path):
    from nsq_spark.spark._schema import messages_to_batch
    from nsq_spark.spark._seen import Redeliveries

    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q")
    log: list = []
    fetch(o, spool, 8, 1, make_messages(6), log)  # chunks of 2, each with its keys file
    peer = spool.partition(8, 1)
    nsqds, keys = peer.read_chunk_keys(1)
    assert keys.tolist() == [2, 3] and len(set(nsqds.tolist())) == 1
    with open(f"{peer.path}/c000002.nkeys", "wb") as f:
        f.write(b"\x05\0\0")  # short: the chunk itself is read instead
    assert peer.read_chunk_keys(2) is None
    gate = Redeliveries(spool, 8, 0)
    got = gate.keep(messages_to_batch(make_messages(7), "t", "c"))
    assert got.column("id").to_pylist() == ["%016d" % 6] and gate.dropped == 6
    # a retry discarding chunks from 1 on takes their keys files with them
    assert peer.discard_from(1) == 2
    assert peer.read_chunk_keys(1) is None and peer.chunk_count() == 1


def test_ids_are_compared_within_one_topic_only(tmp_path):
    """nsqd numbers each topic's messages itself, so two topics of one query hold the
    same ids: neither an earlier batch of another topic nor a peer partition of another
    topic makes a row a 'redelivery'; the same topic still does."""
    from nsq_spark.spark._schema import messages_to_batch
    from nsq_spark.spark._seen import Redeliveries, SeenIndex, topic_tag

    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q")
    fetch(o, spool, 1, 0, make_messages(4), [])  # topic "t", ids 0..3
    assert {f.topic_tag for f in SeenIndex(spool).files()} == {topic_tag("t")}
    b = dataclasses.replace(o, topic="b")
    log: list = []
    assert fetch(b, spool, 2, 0, make_messages(4), log) == [b"body-%d" % i for i in range(4)]
    assert fetch(o, spool, 2, 1, make_messages(1, 3) + make_messages(1, 8), []) == \
        [b"body-8"]  # topic t: id 3 is a redelivery of batch 1
    # peers of batch 3: partition 1 of topic "b" holds ids 30..33 (a chunk with its
    # tagged keys file, one without: read itself); partition 0 of topic "t" sees neither
    fetch(b, spool, 3, 1, make_messages(4, 30), [])
    peer = spool.partition(3, 1)
    assert peer.read_chunk_keys_tagged(0)[1] == topic_tag("b")
    os.unlink(f"{peer.path}/c000001.nkeys")
    gate = Redeliveries(spool, 3, 0, "t")
    fresh = messages_to_batch(make_messages(3, 30) + make_messages(1, 3), "t", "c")
    assert gate.keep(fresh).column("id").to_pylist() == ["%016d" % i for i in (30, 31, 32)]
    gate_b = Redeliveries(spool, 3, 0, "b")  # the same ids in topic "b": redeliveries
    assert gate_b.keep(messages_to_batch(make_messages(2, 31), "b", "c")).num_rows == 0
    assert gate_b.dropped == 2


def test_index_files_without_a_topic_tag_are_taken_for_no_topic(tmp_path):
    import numpy as np

    from nsq_spark.spark._seen import SeenIndex, parse_index_name, topic_tag

    spool = Spool(str(tmp_path), "q")
    index = SeenIndex(spool)
    n = np.array([9, 9], np.uint64)
    old = os.path.basename(index.write(1, 0, n, np.array([5, 6], np.uint64), 0))
    new = os.path.basename(index.write(1, 1, n[:1], np.array([7], np.uint64), 0,
                                       topic_tag("t")))
    assert parse_index_name(old).topic_tag is None
    assert parse_index_name(new).topic_tag == topic_tag("t")
    assert index.load_before(2, topic_tag("t")).pairs()[1].tolist() == [7]
    assert index.load_before(2).pairs()[1].tolist() == [5, 6, 7]  # no topic: all


def test_ids_are_compared_within_one_nsqd_only(tmp_path):
    """nsqd makes ids from the time, its node id and a sequence: two nsqds with the same
    node id (every nsqd of a host, by default) give messages of the same millisecond the
    same ids. Only the nsqd that delivered a message redelivers it."""
    import pyarrow as pa

    from nsq_spark.message import Message
    from nsq_spark.spark._schema import messages_to_batch
    from nsq_spark.spark._seen import Redeliveries, SeenIndex
    from nsq_spark.spark._spool import _ipc_bytes

    class At:
        def __init__(self, address):
            self.address = address

    def rows(*parts):
        return messages_to_batch([Message(b"%016d" % i, b"%s-%d" % (a.encode(), i),
                                          1_700_000_000_000_000_000, 1, At(a))
                                  for a, ids in parts for i in ids], "t", "c")

    def kept(gate, rb):
        return gate.keep(rb).column("body").to_pylist()

    spool = Spool(str(tmp_path), "q")
    a, b = "10.0.0.1:4150", "10.0.0.2:4150"
    gate = Redeliveries(spool, 1, 0, "t")  # batch 1, partition 0: ids 0..3 of nsqd a
    assert len(kept(gate, rows((a, range(4))))) == 4
    gate.finish()
    # partition 1 of batch 1: the same ids from nsqd b are other messages; a's 2 is not
    peer = spool.partition(1, 0)
    peer.write_chunk(0, rows((a, range(4))))
    peer.write_chunk_keys(0, gate.last_keys, gate.tag)
    other = Redeliveries(spool, 1, 1, "t")
    assert kept(other, rows((b, range(4)), (a, [2]), (b, [1]))) == [
        b"%s-%d" % (b.encode(), i) for i in range(4)]
    assert other.dropped == 2  # a's 2 (a peer's), b's 1 (twice in one chunk)
    other.finish()
    # batch 2: a's 0 and b's 1 are redeliveries; a's 8 and b's 9 are not
    later = Redeliveries(spool, 2, 0, "t")
    assert kept(later, rows((a, [0, 8]), (b, [1, 9]))) == [b"10.0.0.1:4150-8",
                                                          b"10.0.0.2:4150-9"]
    # an index file of before the nsqd was kept (the ids alone) is not read: what it
    # names may pass as a row, never the other way round
    index = SeenIndex(spool)
    f = index.files()[0]
    old = pa.RecordBatch.from_arrays([pa.array([8, 9], pa.uint64())], names=["id64"])
    spool.fs.create_exclusive(f"{index.dir}/" + f.name.replace("-p0000", "-p0009"),
                              _ipc_bytes(old))
    assert len(index.load_before(2, f.topic_tag)) == 8
