"""The Reader's behaviour with fake connections: no nsqd, no sockets.

The real Reader, pool, intake gate, answers ledger, strategies and pull queue run on a
real event loop; only the connections are fakes, made by the
:class:`~fake_nsqd.FakeConnections` factory the Reader is given (``connection_factory=``),
typed against the consumer's connection port and checked by mypy. They record what would be
written (RDY, FIN, REQ, TOUCH, CLS) and deliver the chunks a test gives them. The live
suites (tests/test_reader*.py) keep the checks that need nsqd.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_nsqd import FakeConn, FakeConnections
from nsq_spark._consumer import Reader
from nsq_spark.errors import AlreadyRespondedError, NSQError
from nsq_spark.message import Message

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


async def started(handler: Callable | None = None, n_conns: int = 1, **kw: Any
                  ) -> tuple[Reader, list[FakeConn]]:
    """A handler-mode Reader on the running loop, subscribed to ``n_conns`` fakes."""
    addresses = [f"127.0.0.1:{4150 + i}" for i in range(n_conns)]
    nsqd = FakeConnections()
    r = Reader("t", "c", handler, nsqd_tcp_addresses=addresses, connection_factory=nsqd, **kw)
    await subscribed(r, n_conns)
    return r, list(nsqd.made)


async def subscribed(r: Reader, n_conns: int = 1) -> None:
    for _ in range(100):
        await asyncio.sleep(0)
        if len(r.conns) == n_conns:
            break
    assert len(r.conns) == n_conns


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


# -- handler modes ------------------------------------------------------------------------


def test_a_chunk_handled_synchronously_goes_out_in_one_fin_write():
    async def main():
        r, [c] = await started(lambda m: True, max_in_flight=10)
        msgs = c.deliver(5)
        assert [e for e in c.log if e[0] == "FIN"] == [("FIN", tuple(m.id for m in msgs))]
        assert r.stats()["in_flight"] == 0 and r.finished == 5
        await r.aclose()
    run(main())


def test_false_and_exceptions_requeue_with_the_attempt_based_delay(caplog):
    def handler(m):
        if m.body == b"body" and m.id.endswith(b"1"):
            raise RuntimeError("boom")
        return False

    async def main():
        r, [c] = await started(handler, max_in_flight=10, requeue_delay=2, max_tries=0,
                               max_requeue_delay=5, max_backoff_duration=0)
        c.deliver(2, attempts=2)
        assert c.reqs() == [(b"%016d" % 1, 4000), (b"%016d" % 2, 4000)]
        c.deliver(1, attempts=9)  # 18 s, capped at 5 s
        assert c.reqs()[-1] == (b"%016d" % 3, 5000)
        assert r.requeued == 3 and r.stats()["in_flight"] == 0
        await r.aclose()
    run(main())
    # logged under the Reader's historical logger (its level and handlers still apply)
    failed = [rec for rec in caplog.records if "handler failed" in rec.getMessage()]
    assert failed and all(rec.name.startswith("nsq_spark.reader.") for rec in failed)


def test_coroutine_handler_results_count():
    async def handler(m):
        await asyncio.sleep(0.01)
        return m.id.endswith(b"1")

    async def main():
        r, [c] = await started(handler, max_in_flight=10, max_backoff_duration=0)
        c.deliver(2)
        await asyncio.sleep(0.1)
        assert c.fins() == [b"%016d" % 1] and [i for i, _ in c.reqs()] == [b"%016d" % 2]
        await r.aclose()
    run(main())


def test_batch_handler_false_requeues_only_what_it_did_not_answer():
    def batch(msgs):
        msgs[0].finish()
        return False

    async def main():
        r, [c] = await started(batch_handler=batch, max_in_flight=10, max_backoff_duration=0)
        msgs = c.deliver(3)
        assert c.fins() == [msgs[0].id]
        assert [i for i, _ in c.reqs()] == [msgs[1].id, msgs[2].id]
        assert r.stats()["in_flight"] == 0
        await r.aclose()
    run(main())


def test_overridden_pynsq_hooks_are_used():
    seen = []

    class Mine(Reader):
        def validate_message(self, message):
            return message.id.endswith(b"2")

        def process_message(self, message):
            seen.append(message.id)
            return True

    async def main():
        nsqd = FakeConnections()
        r = Mine("t", "c", lambda m: None, nsqd_tcp_addresses="127.0.0.1:4150",
                 max_in_flight=10, connection_factory=nsqd)
        await subscribed(r)
        [c] = nsqd.made
        msgs = c.deliver(3)
        assert seen == [msgs[1].id]  # the others were invalid: finished unhandled
        assert sorted(c.fins()) == sorted(m.id for m in msgs)
        await r.aclose()
    run(main())


# -- max_tries ------------------------------------------------------------------------------


def test_over_max_tries_goes_to_giving_up_then_fin_or_req_if_it_raises():
    given_up = []

    class Mine(Reader):
        def giving_up(self, message):
            given_up.append(message.id)
            if len(given_up) == 2:
                raise RuntimeError("cannot put it aside")

    async def main():
        handled = []
        nsqd = FakeConnections()
        r = Mine("t", "c", handled.append, nsqd_tcp_addresses="127.0.0.1:4150",
                 max_in_flight=10, max_tries=3, max_backoff_duration=0,
                 connection_factory=nsqd)
        await subscribed(r)
        [c] = nsqd.made
        ok = c.deliver(1, attempts=3)
        over = c.deliver(2, attempts=4)
        assert [m.id for m in handled] == [ok[0].id]
        assert given_up == [m.id for m in over] and r.given_up == 2
        assert c.fins() == [ok[0].id, over[0].id]
        assert [i for i, _ in c.reqs()] == [over[1].id]
        assert r.stats()["in_flight"] == 0
        await r.aclose()
    run(main())


# -- in flight and is_starved -----------------------------------------------------------------


def test_a_chunk_is_in_flight_only_as_it_is_handed_over():
    starved_at = []

    def handler(m):
        m.enable_async()
        starved_at.append(r.is_starved())

    async def main():
        global r
        r, [c] = await started(handler, max_in_flight=10, drain_timeout=0)
        c.deliver(1)  # RDY 1 -> 10 on the first message
        assert c.rdys()[-1] == 10
        c.deliver(9)
        # starved at 9 of RDY 10 in flight (85 %), not before: the rest of the chunk
        # was not in flight while the first ones were handled
        assert starved_at == [False] * 8 + [True, True]
        assert r.stats()["in_flight"] == 10
        await r.aclose()
    run(main())


def test_answers_from_other_threads_leave_flight_and_are_sent():
    held: list[Message] = []

    def handler(m):
        m.enable_async()
        held.append(m)

    async def main():
        r, [c] = await started(handler, max_in_flight=10, drain_timeout=0)
        c.deliver(4)
        assert r.stats()["in_flight"] == 4

        def worker():
            held[0].finish()
            held[1].requeue(delay=1.5, backoff=False)
            held[2].touch()
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        for _ in range(20):
            await asyncio.sleep(0)
        assert c.fins() == [held[0].id] and c.reqs() == [(held[1].id, 1500)]
        assert ("TOUCH", held[2].id) in c.log
        assert r.stats()["in_flight"] == 2
        with pytest.raises(AlreadyRespondedError):
            held[0].finish()
        await r.aclose()
        # close requeued the two nobody answered, at once
        assert sorted(c.reqs()[1:]) == sorted([(held[2].id, 0), (held[3].id, 0)])
    run(main())


# -- backoff --------------------------------------------------------------------------------


def test_a_failure_backs_off_then_tests_the_waters_then_recovers():
    async def main():
        results = iter([False, True])
        r, conns = await started(lambda m: next(results), n_conns=2, max_in_flight=10,
                                 backoff_multiplier=0.05)
        a, b = conns
        a.deliver(1)  # False: RDY 0 everywhere
        assert a.rdys()[-1] == 0 and b.rdys()[-1] == 0
        await asyncio.sleep(0.15)  # the window ends: one connection gets RDY 1
        assert sorted([a.rdys()[-1], b.rdys()[-1]]) == [0, 1]
        tester = a if a.rdys()[-1] == 1 else b
        tester.deliver(1)  # True: backoff over, everyone back to their share
        assert a.rdys()[-1] == 5 and b.rdys()[-1] == 5
        await r.aclose()
    run(main())


def test_requeue_without_backoff_is_no_failure():
    async def main():
        def handler(m):
            m.requeue(backoff=False)
        r, [c] = await started(handler, max_in_flight=10)
        c.deliver(3)
        assert r.stats()["backoff"]["level"] == 0 and c.rdys()[-1] == 10
        await r.aclose()
    run(main())


# -- close ----------------------------------------------------------------------------------


def test_close_stops_deliveries_and_requeues_what_arrives_meanwhile():
    async def main():
        r, [c] = await started(lambda m: True, max_in_flight=10, drain_timeout=0.1)
        closing = asyncio.ensure_future(r.aclose())
        while ("CLS",) not in c.log:
            await asyncio.sleep(0)
        late = c.deliver(2)  # nsqd sent them before it saw RDY 0 / CLS
        await closing
        assert ("RDY", 0) in c.log and ("CLS",) in c.log
        assert c.reqs() == [(late[0].id, 0), (late[1].id, 0)]
        assert r.closed and c.closed
    run(main())


# -- pull -----------------------------------------------------------------------------------


def test_pull_counts_what_it_hands_out_and_bulk_answers_from_the_caller_thread():
    nsqd = FakeConnections()
    r = Reader("t", "c", nsqd_tcp_addresses="127.0.0.1:4150", max_in_flight=10,
               max_backoff_duration=0, connection_factory=nsqd)
    r.start()
    try:
        for _ in range(100):
            if r.conns:
                break
            threading.Event().wait(0.01)
        [c] = nsqd.made
        r.loop.call_soon_threadsafe(c.deliver, 4)
        got = r.get_batch(10, timeout=5)
        assert len(got) == 4 and r.stats()["in_flight"] == 4
        r.finish(got[:2])
        r.requeue(got[2:3], delay_ms=7)
        with pytest.raises(AlreadyRespondedError):
            r.finish(got[:1])
        foreign = Message(b"0" * 16, b"", 0, 1, object())  # type: ignore[arg-type]
        with pytest.raises(NSQError, match="not delivered by this Reader"):
            r.finish([foreign])
        assert r.stats()["in_flight"] == 1
    finally:
        r.close()
    assert c.fins() == [m.id for m in got[:2]]
    assert c.reqs() == [(got[2].id, 7), (got[3].id, 0)]  # the unanswered one, on close


# -- dedup ----------------------------------------------------------------------------------


def test_duplicates_are_finished_without_the_handler_and_requeued_ones_forgotten():
    from nsq_spark.dedup import OppositeBloomFilter

    handled = []

    def handler(m):
        handled.append(m.id)
        return len(handled) != 1  # the first one fails

    async def main():
        r, [c] = await started(handler, max_in_flight=10, max_backoff_duration=0,
                               dedup=OppositeBloomFilter(1024))
        first = c.deliver(2)
        c.rewind()
        again = c.deliver(2)  # the same ids: the failed one is handled again
        assert handled == [first[0].id, first[1].id, again[0].id]
        assert r.duplicates == 1
        assert c.fins() == [first[1].id, again[1].id, again[0].id]
        await r.aclose()
    run(main())


# -- a property: every delivered message is answered exactly once -----------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=st.lists(st.lists(st.sampled_from(["fin", "req", "none", "raise", "async",
                                                  "hold"]), min_size=1, max_size=8),
                       min_size=1, max_size=6),
       max_tries=st.sampled_from([0, 2]), attempts=st.integers(1, 3))
def test_every_message_is_answered_exactly_once_and_in_flight_never_drifts(
        chunks, max_tries, attempts):
    plan: dict[bytes, str] = {}

    async def main():
        def handler(m):
            what = plan[m.id]
            if what == "fin":
                return True
            if what == "req":
                return False
            if what == "raise":
                raise RuntimeError("x")
            if what == "async":
                m.enable_async()
                asyncio.get_running_loop().call_soon(m.finish)
                return None
            if what == "hold":
                m.enable_async()  # never answered: close() requeues it
            return None

        r, [c] = await started(handler, max_in_flight=100, max_tries=max_tries,
                               max_backoff_duration=0, drain_timeout=0)
        held = 0
        for chunk in chunks:
            ids = c.upcoming_ids(len(chunk))
            plan.update(zip(ids, chunk))
            c.deliver(len(chunk), attempts=attempts)
            await asyncio.sleep(0)
            if not max_tries or attempts <= max_tries:
                held += chunk.count("hold")
            assert r.stats()["in_flight"] == held
        await r.aclose()
        answered = c.fins() + [i for i, _ in c.reqs()]
        assert sorted(answered) == sorted(plan)  # each once: FIN or REQ, never both
        assert r.stats()["in_flight"] == 0 or not r.conns
    run(main())
