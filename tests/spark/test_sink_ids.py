"""The sink's publish ids (:mod:`nsq_spark.spark.sink`): the keys a task derives, the same
for a re-run of the same rows in the same scope, different for anything else; the key
column; and, against real nsqds, that a re-run's copies (and the replicas) are one
message to a Reader deduplicating by publish id.

The key derivation is checked without Spark here (a fake Producer records what the sink
hands it); that Spark's tasks see the micro-batch's ids is checked in
``test_sink_pipeline.py``."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")

from nsq_spark.envelope import open_body, publish_id_for, stamp  # noqa: E402
from nsq_spark.spark.options import NSQOptionError, parse_write_options  # noqa: E402
from nsq_spark.spark.sink import (ENVELOPE_OVERHEAD, WriteScope, publish_batches,  # noqa: E402
                                  task_scope)
from sparkutil import read_deduplicated  # noqa: E402

BASE = {"topic": "out", "nsqdTcpAddresses": "127.0.0.1:4150"}


class Recorder:
    """Stands in for the Producer: records each call and its idempotency keys."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[bytes], Any]] = []
        self.closed = False

    def _done(self) -> "concurrent.futures.Future[Any]":
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        f.set_result(b"OK")
        return f

    def mpublish_async(self, topic: str, bodies: list[bytes],
                       idempotency_keys: Any = None) -> "concurrent.futures.Future[Any]":
        self.calls.append(("MPUB", topic, list(bodies), idempotency_keys))
        return self._done()

    def publish_async(self, topic: str, body: bytes, defer_ms: int | None = None,
                      idempotency_key: Any = None) -> "concurrent.futures.Future[Any]":
        self.calls.append(("DPUB", topic, [body], idempotency_key))
        return self._done()

    def close(self) -> None:
        self.closed = True

    def keys(self) -> list[bytes]:
        out: list[bytes] = []
        for what, _, _, keys in self.calls:
            out += keys if what == "MPUB" else [keys]
        return out


def batch(bodies: list[bytes], **columns: list[Any]) -> "pa.RecordBatch":
    return pa.RecordBatch.from_pydict({"body": bodies, **columns})


def publish(options: dict[str, str], batches: list["pa.RecordBatch"],
            scope: WriteScope) -> Recorder:
    rec = Recorder()
    publish_batches(parse_write_options({**BASE, **options}), iter(batches), lambda: rec,
                    scope)
    assert rec.closed
    return rec


ROWS = [b"a", b"b", b"a", b"c"]
SCOPE = WriteScope(3, query="5f1c-query", batch="7")


def test_a_rerun_of_the_same_rows_in_the_same_scope_has_the_same_keys():
    first = publish({"publishIds": "true"}, [batch(ROWS[:2]), batch(ROWS[2:])], SCOPE)
    again = publish({"publishIds": "true"}, [batch(ROWS)], SCOPE)  # other Arrow batches
    assert first.keys() == again.keys()
    assert len(set(first.keys())) == 4  # equal bodies in two rows are two messages


@pytest.mark.parametrize("other", [WriteScope(4, query="5f1c-query", batch="7"),
                                   WriteScope(3, query="5f1c-query", batch="8"),
                                   WriteScope(3, query="another", batch="7"),
                                   WriteScope(3, write_id="5f1c-query")])
def test_another_partition_batch_query_or_write_has_other_keys(other):
    mine = set(publish({"publishIds": "true"}, [batch(ROWS)], SCOPE).keys())
    theirs = set(publish({"publishIds": "true"}, [batch(ROWS)], other).keys())
    assert not mine & theirs


def test_another_row_at_the_same_place_has_another_key():
    """A re-run that is not deterministic (another row where one was) makes a copy, not a
    loss: the body is part of the key."""
    first = publish({"publishIds": "true"}, [batch([b"x", b"y"])], SCOPE).keys()
    swapped = publish({"publishIds": "true"}, [batch([b"y", b"x"])], SCOPE).keys()
    assert not set(first) & set(swapped)
    routed = publish({"publishIds": "true"},
                     [batch([b"x", b"y"], topic=["elsewhere", None])], SCOPE).keys()
    assert routed[1] == first[1] and routed[0] != first[0]  # the topic is part of it too


def test_the_key_column_names_each_row_and_nulls_are_refused():
    rows = batch([b"a", b"b", b"c"], order=["o-1", "o-2", "o-1"])
    rec = publish({"idempotencyKeyColumn": "order"}, [rows], SCOPE)
    assert rec.keys() == [b"o-1", b"o-2", b"o-1"]  # equal keys: one message
    other_task = publish({"idempotencyKeyColumn": "order"}, [rows], WriteScope(9, write_id="w"))
    assert other_task.keys() == rec.keys()  # wherever it is written
    with pytest.raises(ValueError, match="idempotencyKeyColumn 'order' is null in row 1"):
        publish({"idempotencyKeyColumn": "order"}, [batch([b"a", b"b"], order=["x", None])],
                SCOPE)
    with pytest.raises(NSQOptionError, match="no column 'missing'"):
        publish({"idempotencyKeyColumn": "missing"}, [rows], SCOPE)


def test_without_publish_ids_nothing_is_keyed_and_deferred_rows_are_keyed_with_them():
    rows = batch([b"now", b"later"], defer_ms=[None, 500])
    plain = publish({}, [rows], SCOPE)
    assert [c[3] for c in plain.calls] == [None, None]
    keyed = publish({"publishIds": "true"}, [rows], SCOPE)
    kinds = {c[0]: c[3] for c in keyed.calls}
    assert kinds["DPUB"] and len(kinds["MPUB"]) == 1 and kinds["DPUB"] not in kinds["MPUB"]


def test_mpub_slices_leave_room_for_the_envelope():
    """27 bytes more per body with publish ids: slices stay within maxBatchBytes."""
    assert len(stamp(b"x", publish_id_for(b"k"))) - 1 == ENVELOPE_OVERHEAD
    rec = publish({"publishIds": "true", "maxBatchBytes": str(10 * (20 + 4 + 27))},
                  [batch([b"y" * 20] * 25)], SCOPE)
    assert [len(c[2]) for c in rec.calls] == [10, 10, 5]


def test_publish_id_options():
    on = parse_write_options({**BASE, "nsqdTcpAddresses": "127.0.0.1:1,127.0.0.1:2",
                              "replicas": "2"})
    assert on.publish_ids and on.replicas == 2 and on.write_quorum is None
    assert parse_write_options({**BASE, "idempotencyKeyColumn": "k"}).publish_ids
    assert not parse_write_options(BASE).publish_ids
    raw = parse_write_options({**BASE, "nsqdTcpAddresses": "127.0.0.1:1,127.0.0.1:2",
                               "replicas": "2", "publishIds": "false"})
    assert raw.replicas == 2 and not raw.publish_ids  # raw copies, as the Producer allows
    for bad, said in [({"replicas": "2"}, "more than the 1 nsqds"),
                      ({"writeQuorum": "1"}, "only takes effect with 'replicas'"),
                      ({"replicas": "1", "writeQuorum": "2"}, "more than 'replicas'"),
                      ({"publishIds": "false", "idempotencyKeyColumn": "k"},
                       "needs publish ids")]:
        with pytest.raises(NSQOptionError, match=said):
            parse_write_options({**BASE, **bad})


def test_outside_a_spark_task_the_scope_is_the_write_id():
    assert task_scope("w1") == WriteScope(0, write_id="w1")
    assert task_scope(None).write_id  # a fresh one


# -- against real nsqds ------------------------------------------------------------------


@pytest.mark.nsqd
@pytest.mark.nsq_cluster(nsqd=2, lookupd=0)
def test_a_rerun_and_the_replicas_are_one_message_downstream(nsq_cluster, running_reader,
                                                           redis_server):
    addrs = ",".join(nsq_cluster.nsqd_tcp_addresses)
    opts = parse_write_options({"topic": "ids_out", "nsqdTcpAddresses": addrs,
                                "replicas": "2"})
    rows = [b"r-%d" % i for i in range(300)] + [b"same"] * 2
    for _ in range(2):  # the task, and its re-run after a crash
        publish_batches(opts, iter([batch(rows)]), scope=SCOPE)
    published = sum(n.stats("ids_out")["topics"][0]["message_count"]
                    for n in nsq_cluster.nsqds)
    assert published == 2 * 2 * len(rows)  # two runs, two replicas each
    handled, dropped = read_deduplicated(running_reader, nsq_cluster, "ids_out",
                                         redis_server.url, len(rows), channel="check")
    assert sorted(handled) == sorted(rows)  # "same" twice: two rows, two messages
    assert dropped == 3 * len(rows)
    # the body a consumer sees is the row's: the envelope is opened, not in the body
    assert all(open_body(b).version == 0 for b in handled)
