"""The Reader's claim-then-commit gate with fake connections and a stand-in store: no nsqd,
no sockets (tests/test_reader_dedup_faults.py runs the same rules on real processes).

The real Reader, intake gate, answers ledger and strategies run on a real event loop; the
connections are tests/fake_nsqd.py's fakes and the deduplicator is tests/dedup_fakes.py's
:class:`~dedup_fakes.ScriptedClaims` (both checked by mypy against their ports), which
answers what the test sets and records every call -- in the same log as the fake
connection's writes, so that the order of commits and FINs shows."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dedup_fakes import OneStep, ScriptedClaims
from nsq_spark.dedup import DONE, OppositeBloomFilter, held
from nsq_spark.dedup.base import HELD_MARGIN_MS
from test_consumer_reader import run, started

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def shared_log(store: ScriptedClaims, conn) -> list:
    store.calls = conn.log  # one log: the store's calls and the connection's writes
    return conn.log


def test_committed_copies_are_finished_unhandled_held_ones_requeued_new_ones_handled():
    store = ScriptedClaims()
    handled = []

    async def main():
        r, [c] = await started(lambda m: handled.append(m.id), max_in_flight=10, dedup=store)
        log = shared_log(store, c)
        done, later, new = c.upcoming_ids(3)
        store.answers = {done: DONE, later: held(4000)}
        c.deliver(3)
        assert handled == [new]
        assert ("claim", [done, later, new], 60_000) in log  # the connection's msg_timeout
        # the held copy: back after the holder's lease, not finished, no backoff
        assert c.reqs() == [(later, 4000 + HELD_MARGIN_MS)]
        assert sorted(c.fins()) == sorted([done, new])
        # the handled one is committed before its FIN is written
        commit = log.index(("commit", [new], None))
        assert commit < next(i for i, e in enumerate(log) if e[0] == "FIN" and new in e[1])
        st = r.stats()
        assert (st["duplicates"], st["held"], st["in_flight"]) == (1, 1, 0)
        assert st["backoff"]["level"] == 0
        assert store.keys_of("release") == []
        await r.aclose()
    run(main())


def test_a_held_copy_waits_at_most_the_longest_requeue_delay():
    store = ScriptedClaims()

    async def main():
        r, [c] = await started(lambda m: True, max_in_flight=10, dedup=store,
                               max_requeue_delay=2)
        [mid] = c.upcoming_ids(1)
        store.answers = {mid: held(3_600_000)}
        c.deliver(1)
        assert c.reqs() == [(mid, 2000)]
        await r.aclose()
    run(main())


def test_failure_releases_touch_renews_success_commits():
    store = ScriptedClaims()

    def handler(m):
        if m.id.endswith(b"1"):
            return False
        m.touch()
        return True

    async def main():
        r, [c] = await started(handler, max_in_flight=10, dedup=store, max_backoff_duration=0)
        first, second = c.upcoming_ids(2)
        c.deliver(2)
        await asyncio.sleep(0.05)  # the touch's renewal goes out with a later flush
        assert store.keys_of("release") == [first]
        assert store.keys_of("commit") == [second]
        assert ("renew", [second], 60_000) in store.calls
        await r.aclose()
    run(main())


def test_copies_held_by_this_gate_do_not_count_toward_max_tries():
    store = ScriptedClaims()
    handled = []

    async def main():
        r, [c] = await started(lambda m: handled.append(m.attempts), max_in_flight=10,
                               dedup=store, max_tries=2)
        [mid] = c.upcoming_ids(1)
        store.answers = {mid: held(100)}
        c.deliver(1, attempts=1)
        c.rewind()
        c.deliver(1, attempts=2)  # held twice: nsqd counts two deliveries
        c.rewind()
        store.answers = {}  # the holder's lease ended
        c.deliver(1, attempts=3)  # 3 > max_tries, but two were waits, not tries
        assert handled == [3] and r.given_up == 0
        c.rewind()
        c.deliver(1, attempts=4)  # 4 deliveries, one try handled: 2 waits forgotten now
        assert r.given_up == 1
        await r.aclose()
    run(main())


def test_a_handler_that_succeeds_after_its_connection_dropped_still_commits():
    store = ScriptedClaims()
    held_msgs = []

    def handler(m):
        m.enable_async()
        held_msgs.append(m)

    async def main():
        r, [c] = await started(handler, max_in_flight=10, dedup=store, reconnect_initial=60)
        c.deliver(2)
        await c.close()  # the connection is gone; the handlers still have the messages
        await asyncio.sleep(0)
        assert store.keys_of("release") == []  # their claims stay (they end with the lease)
        held_msgs[0].finish()  # handled: committed, though its FIN can no longer be sent
        held_msgs[1].requeue()  # failed: released
        await asyncio.sleep(0.05)
        assert store.keys_of("commit") == [held_msgs[0].id]
        assert store.keys_of("release") == [held_msgs[1].id]
        assert r.dropped_responses == 2
        await r.aclose()
    run(main())


def test_pulled_messages_commit_on_finish_and_release_on_requeue_and_close():
    store = ScriptedClaims()

    async def main():
        from fake_nsqd import FakeConnections
        from nsq_spark._consumer import Reader
        nsqd = FakeConnections()
        r = Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], connection_factory=nsqd,
                   max_in_flight=10, dedup=store, max_backoff_duration=0)
        batches = r.batches(3, timeout=0.5)
        await asyncio.sleep(0)
        task = asyncio.ensure_future(batches.__anext__())
        for _ in range(100):
            await asyncio.sleep(0)
            if nsqd.made and nsqd.made[0].state.name == "SUBSCRIBED":
                break
        c = nsqd.made[0]
        msgs = c.deliver(3)
        got = await task
        assert got == msgs
        r.finish(got[:1])
        r.requeue(got[1:2])
        await asyncio.sleep(0.05)
        assert store.keys_of("commit") == [msgs[0].id]
        assert store.keys_of("release") == [msgs[1].id]
        await r.aclose()  # the unanswered one is requeued on close: released
        assert store.keys_of("release") == [msgs[1].id, msgs[2].id]
    run(main())


def test_a_failing_store_lets_every_message_through_and_logs(caplog):
    store = ScriptedClaims()
    store.failing = {"claim", "commit"}
    handled = []

    async def main():
        r, [c] = await started(lambda m: handled.append(m.id), max_in_flight=10, dedup=store)
        msgs = c.deliver(2)
        assert handled == [m.id for m in msgs] and c.fins() == handled  # FINs all the same
        await r.aclose()
    with caplog.at_level(logging.ERROR):
        run(main())
    assert "dedup claim failed" in caplog.text and "dedup commit failed" in caplog.text


def test_a_one_step_deduplicator_is_adapted_and_a_failed_message_comes_back():
    inner = OneStep()
    handled = []

    def handler(m):
        handled.append(m.id)
        return len(handled) != 1  # the first one fails

    async def main():
        r, [c] = await started(handler, max_in_flight=10, dedup=inner, max_backoff_duration=0)
        first = c.deliver(2)
        c.rewind()
        c.deliver(2)  # the failed one is handled again, the other is a duplicate
        assert handled == [first[0].id, first[1].id, first[0].id]
        assert inner.seen == {m.id for m in first}  # committed through check_and_set
        assert r.duplicates == 1
        await r.aclose()
    run(main())


def test_the_key_claimed_is_the_key_committed_whatever_the_handler_does():
    f = OppositeBloomFilter(1 << 16)

    def handler(m):
        m.body = b"changed by the handler"
        return True

    async def main():
        r, [c] = await started(handler, max_in_flight=10, dedup=f, dedup_key="body")
        msgs = c.deliver(1)
        assert msgs[0].dedup_key != b"changed by the handler"
        c.rewind()
        c.deliver(1)  # same body: a duplicate (the claimed key was committed)
        assert r.duplicates == 1 and f.claims == 0
        await r.aclose()
    run(main())
