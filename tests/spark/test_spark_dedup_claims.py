"""The Spark source's ``dedup`` option as claim, then commit: fetch tasks run as Spark would
run them (``fetch_stream_partition`` / ``fetch_batch_partition``) over the stand-in Reader
of the unit tests, against a real redis-server. A copy another consumer holds a claim on
is requeued, never spooled nor FINished; what a task keeps is committed only once it is
durable and FINished; a task that fails before that leaves no commit behind, and its
claims end with their lease."""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid

import pytest

from nsq_spark.dedup import NEW, ClaimState, RedisDeduplicator
from nsq_spark.spark._fetch import fetch_batch_partition, fetch_stream_partition
from nsq_spark.spark._spool import Spool
from nsq_spark.testing import wait_until

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stand_in_reader import StandInReader  # noqa: E402
from test_spark_unit import bodies, make_messages, read_opts  # noqa: E402

pytestmark = pytest.mark.dedup

pytest.importorskip("redis")
pytest.importorskip("pyarrow")


def setup(tmp_path, redis_server, **kw):
    prefix = "spark-claims-" + uuid.uuid4().hex[:8]
    spec = f"{redis_server.url}?ttl=600&prefix={prefix}"
    o = read_opts(tmp_path, dedup=spec, **kw)
    other = RedisDeduplicator(redis_server.url, ttl=600, prefix=prefix)  # another consumer
    return o, other


def redelivered(n):
    msgs = make_messages(n)
    for m in msgs:
        m.attempts = 2  # with the id key, only redeliveries can be claimed elsewhere
    return msgs


def test_a_held_copy_is_requeued_not_spooled_and_the_rest_committed_after_the_fin(
        tmp_path, redis_server):
    o, other = setup(tmp_path, redis_server)
    queue, log = redelivered(4), []
    held_id = queue[1].id
    assert other.claim_many([held_id], 60_000) == [NEW]  # being handled elsewhere
    reader = StandInReader(queue, log)
    rows = list(fetch_stream_partition(o, Spool(str(tmp_path), "dc1"), 1, 0, None,
                                       lambda _: reader))
    assert sorted(bodies(rows)) == [b"body-0", b"body-2", b"body-3"]
    assert [m.id for m in reader.deferred] == [held_id]
    reqs = [ids for what, ids in log if what == "REQ"]
    fins = [i for what, ids in log if what == "FIN" for i in ids]
    assert reqs[0] == [held_id] and held_id not in fins  # back to nsqd, never FINished
    # the kept ones were committed (after their FIN); the held key is still the other's
    got = other.claim_many([m.id for m in make_messages(4)], 60_000)
    assert [c.state for c in got] == [ClaimState.DONE, ClaimState.HELD, ClaimState.DONE,
                                      ClaimState.DONE]


def test_a_committed_copy_is_finished_without_a_row(tmp_path, redis_server):
    o, other = setup(tmp_path, redis_server)
    queue, log = redelivered(3), []
    other.commit_many([queue[0].id])  # handled elsewhere already
    rows = list(fetch_batch_partition(o, 3, lambda _: StandInReader(queue, log)))
    assert bodies(rows) == [b"body-1", b"body-2"]
    fins = [i for what, ids in log if what == "FIN" for i in ids]
    assert sorted(fins) == sorted(m.id for m in make_messages(3))  # the duplicate too


def test_a_task_that_fails_before_its_fin_commits_nothing_and_its_claims_end(
        tmp_path, redis_server):
    o, other = setup(tmp_path, redis_server, msgTimeout="1000")  # a 1 s lease
    # a chunk of what the first get brings: its claims are taken, then the task dies at
    # its second get, while its writer thread may or may not have made the chunk durable
    # (and the task FINished it) first
    o = dataclasses.replace(o, spool_chunk_size=2)
    queue, log = redelivered(2), []
    reader = StandInReader(queue, log, fail_after_gets=1)  # dies right after the claim
    with pytest.raises(ConnectionError):
        list(fetch_stream_partition(o, Spool(str(tmp_path), "dc3"), 1, 0, 4,
                                    lambda _: reader))
    ids = [m.id for m in make_messages(2)]
    fins = {i for what, got in log if what == "FIN" for i in got}
    # the rule, whatever the threads' timing: committed exactly when FINished (after the
    # chunk was durable); claimed and still held otherwise
    states = [c.state for c in other.claim_many(ids, 60_000)]
    assert states == [ClaimState.DONE if i in fins else ClaimState.HELD for i in ids], \
        (states, fins)
    # what was not FINished is not committed: once the lease ends, the redelivery is
    # someone's to handle
    unfinished = [i for i in ids if i not in fins]
    wait_until(lambda: other.claim_many(unfinished, 60_000) == [NEW] * len(unfinished), 10,
               "the dead task's claims to end", interval=0.1)


def test_the_publish_id_key_is_the_id_inside_the_envelope_and_rows_hold_the_body(
        tmp_path, redis_server):
    """``key=publish_id``: copies of one publish (other nsqd ids, first deliveries) are
    claimed by their publish id, as a Reader's handler would see them."""
    from nsq_spark import envelope
    from nsq_spark.message import Message
    from stand_in_reader import Addr

    prefix = "spark-claims-" + uuid.uuid4().hex[:8]
    o = read_opts(tmp_path, dedup=f"{redis_server.url}?ttl=600&prefix={prefix}"
                                  "&key=publish_id")
    other = RedisDeduplicator(redis_server.url, ttl=600, prefix=prefix)
    pids = [bytes([i]) * 16 for i in range(3)]
    queue = [Message(b"%016d" % i, envelope.stamp(b"body-%d" % i, pids[i]),
                     1_700_000_000_000_000_000, 1, Addr()) for i in range(3)]
    other.commit_many([pids[0]])   # a copy of publish 0 was handled elsewhere
    assert other.claim_many([pids[1]], 60_000) == [NEW]  # publish 1 is being handled
    log: list = []
    held = queue[1].id
    reader = StandInReader(queue, log)
    rows = list(fetch_stream_partition(o, Spool(str(tmp_path), "dc4"), 1, 0, None,
                                       lambda _: reader))
    assert bodies(rows) == [b"body-2"]
    assert [r for rb in rows for r in rb.column("publish_id").to_pylist()] == [pids[2]]
    assert [m.id for m in reader.deferred] == [held]  # held: requeued
    assert [c.state for c in other.claim_many([pids[2]], 60_000)] == [ClaimState.DONE]
