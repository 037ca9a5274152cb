"""asyncio iteration over the Reader (``async for message in reader``,
``reader.batches(n, timeout)``): the contract of :mod:`nsq_spark._consumer.aiter`.

The first part runs against real nsqd and checks what nsqd saw (``/stats``): everything
received and finished, batch sizes and timeouts, backpressure through RDY, close ending
the iteration, cancellation and unanswered messages requeued. The second part runs the
real Reader on a real loop with fake connections (no sockets: the typed fakes of
tests/fake_nsqd.py, given as ``connection_factory=``) and a property test of the pull queue's one-at-a-time
taking, to pin the rules down fast.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_nsqd import FakeConn, FakeConnections
from nsq_spark._consumer import Reader
from nsq_spark._consumer.lifecycle import Lifecycle
from nsq_spark._consumer.pull import PullQueue, ReceivedPullQueue
from nsq_spark.errors import ConfigError, NSQError
from nsq_spark.testing import publish
from reader_helpers import await_for

pytestmark = [pytest.mark.timeout(60)]

T, C = "aiter", "ac"


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def run_async(coro: Any, timeout: float = 30) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def clients_sum(cluster: Any, key: str) -> int:
    """``key`` (finish_count, requeue_count, ...) summed over the channel's clients (nsqd
    keeps per-client counters only while the client is connected)."""
    return sum(c[key] for c in cluster.nsqds[0].channel_stats(T, C).get("clients", []))


async def nsqd_stats(cluster: Any) -> dict[str, Any]:
    return await asyncio.to_thread(cluster.nsqds[0].channel_stats, T, C)


# -- against real nsqd ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["messages", "batches"])
@pytest.mark.nsqd
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_every_message_is_received_and_finished(nsq_cluster, how):
    sent = bodies(500)
    publish(nsq_cluster.nsqd_http_addresses[0], T, sent)
    got: list[bytes] = []

    async def main() -> dict[str, int]:
        r = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=100)
        if how == "messages":
            async for m in r:
                got.append(m.body)
                m.finish()
                if len(got) == len(sent):
                    break
        else:
            async for batch in r.batches(64, timeout=0.2):
                assert 1 <= len(batch) <= 64
                got.extend(m.body for m in batch)
                r.finish(batch)
                if len(got) == len(sent):
                    break
        # nsqd counts per client while the client is connected: read it before closing
        finished = await asyncio.to_thread(
            lambda: _wait_value(lambda: clients_sum(nsq_cluster, "finish_count"), len(sent)))
        await r.aclose()
        return {"nsqd_finished": finished, "finished": r.finished, "requeued": r.requeued}

    counts = run_async(main())
    assert sorted(got) == sorted(sent)
    assert counts == {"nsqd_finished": 500, "finished": 500, "requeued": 0}
    nsq_cluster.wait_drained(T, C)
    c = nsq_cluster.nsqds[0].channel_stats(T, C)
    assert c["depth"] == 0 and c["in_flight_count"] == 0 and c["requeue_count"] == 0


def _wait_value(get: Any, want: int, timeout: float = 5.0) -> int:
    """``get()`` once it equals ``want`` (or its last value after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    value = get()
    while value != want and time.monotonic() < deadline:
        time.sleep(0.02)
        value = get()
    return value


@pytest.mark.nsqd
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_batches_end_at_n_messages_or_timeout_after_the_first_and_are_never_empty(nsq_cluster):
    http = nsq_cluster.nsqd_http_addresses[0]
    publish(http, T, bodies(250))

    async def main() -> None:
        r = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=1000)
        it = r.batches(100, timeout=0.5)
        sizes = []
        for _ in range(3):
            batch = await it.__anext__()
            sizes.append(len(batch))
            r.finish(batch)
        # all 250 arrive at once: two full batches, then the rest when the timeout ran out
        assert sizes == [100, 100, 50]
        # nothing buffered: the iterator waits (no empty batch) until a message comes
        nxt = asyncio.ensure_future(it.__anext__())
        await asyncio.sleep(1.0)
        assert not nxt.done()
        t0 = time.monotonic()
        await asyncio.to_thread(publish, http, T, bodies(7, "late"))
        batch = await asyncio.wait_for(nxt, 5)
        waited = time.monotonic() - t0
        assert [m.body for m in batch] == bodies(7, "late")
        assert 0.5 <= waited < 2.5  # yielded by the timeout, measured from its arrival
        r.finish(batch)
        await r.aclose()

    run_async(main())
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsqd
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_backpressure_never_more_than_max_in_flight_unanswered(nsq_cluster):
    k, n = 5, 60
    publish(nsq_cluster.nsqd_http_addresses[0], T, bodies(n))

    async def main() -> None:
        r = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=k)
        it = r.__aiter__()
        # a consumer that answers nothing: after k messages nsqd sends no more
        held = [await asyncio.wait_for(it.__anext__(), 5) for _ in range(k)]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(it.__anext__(), 0.5)
        c = await nsqd_stats(nsq_cluster)
        assert c["in_flight_count"] == k and c["depth"] == n - k
        r.finish(held)
        # a slow consumer: nsqd never has more than k in flight, the Reader never buffers more
        got = k
        seen_in_flight = []
        async for m in it:
            await asyncio.sleep(0.01)
            seen_in_flight.append((await nsqd_stats(nsq_cluster))["in_flight_count"])
            assert r.stats()["pull_queued"] < k
            m.finish()
            got += 1
            if got == n:
                break
        assert max(seen_in_flight) <= k and max(seen_in_flight) >= 1
        await r.aclose()

    run_async(main())
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsqd
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_close_ends_the_iteration_and_requeues_what_was_buffered(nsq_cluster):
    n = 100
    publish(nsq_cluster.nsqd_http_addresses[0], T, bodies(n))

    async def main() -> None:
        r = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=50)
        got = 0
        async for m in r:  # close() inside the body: the next step ends the loop
            m.finish()
            got += 1
            if got == 10:
                r.close()
        assert got == 10
        await r.aclose()
        assert r.closed and r.finished == 10 and r.requeued >= 1

        # a second Reader, its iterators waiting on an empty buffer: aclose() from another
        # task ends both of them cleanly
        r2 = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=200)

        counts = [0, 0]

        async def drain(i: int, it: Any, answer: Any) -> str:
            async for x in it:
                answer(x)
                counts[i] += len(x) if isinstance(x, list) else 1
            return "ended"
        a = asyncio.ensure_future(drain(0, r2.__aiter__(), lambda m: m.finish()))
        b = asyncio.ensure_future(drain(1, r2.batches(1000, 0.05), r2.finish))
        await await_for(lambda: sum(counts) == n - 10, 10, "the 90 left")
        await asyncio.sleep(0.1)
        assert not a.done() and not b.done()  # both waiting for more
        await r2.aclose()
        assert await asyncio.wait_for(asyncio.gather(a, b), 5) == ["ended", "ended"]
        assert sum(counts) == n - 10

    run_async(main())
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsqd
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_cancelling_the_consuming_task_loses_no_message(nsq_cluster):
    n = 20
    publish(nsq_cluster.nsqd_http_addresses[0], T, bodies(n))

    async def main() -> None:
        r = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=100)
        handed: list[Any] = []

        async def consume() -> None:
            async for batch in r.batches(100, timeout=30):  # waits for 100: never comes
                handed.append(batch)

        task = asyncio.ensure_future(consume())
        await await_for(lambda: r.stats()["pull_queued"] == n, 10, "20 buffered")
        await asyncio.sleep(0.1)  # the batch waits for more
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert handed == []
        # nothing was lost: the next iteration gets the same 20, first delivery
        batch = await asyncio.wait_for(r.batches(100, timeout=0.1).__anext__(), 5)
        assert sorted(m.body for m in batch) == sorted(bodies(n))
        assert {m.attempts for m in batch} == {1}

        # a task cancelled while it holds a message in its loop body: close requeues it
        keep, drop = batch[:-1], batch[-1]
        r.finish(keep)
        await asyncio.to_thread(publish, nsq_cluster.nsqd_http_addresses[0], T, [b"x"])

        holding: list[Any] = []

        async def hold() -> None:
            async for m in r:
                holding.append(m)
                await asyncio.sleep(30)  # cancelled here, m unanswered

        task = asyncio.ensure_future(hold())
        await await_for(lambda: holding, 10, "the message x handed out")
        assert [m.body for m in holding] == [b"x"]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await r.aclose()
        assert r.finished == n - 1 and r.requeued == 2  # drop, and the one held by hold()

    run_async(main())
    c = nsq_cluster.nsqds[0].channel_stats(T, C)
    assert c["depth"] == 2 and c["in_flight_count"] == 0 and c["requeue_count"] == 2


@pytest.mark.nsqd
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_unanswered_messages_are_never_finished_and_close_requeues_them(nsq_cluster):
    n = 30
    publish(nsq_cluster.nsqd_http_addresses[0], T, bodies(n))

    async def main() -> None:
        r = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=10)
        seen = 0
        it = r.__aiter__()
        for _ in range(4):  # looked at, never answered: the pull API's rule
            await asyncio.wait_for(it.__anext__(), 5)
            seen += 1
        for _ in range(100):  # until nsqd sent all it may (RDY reaches 10 after RDY 1)
            c = await nsqd_stats(nsq_cluster)
            if c["in_flight_count"] == 10:
                break
            await asyncio.sleep(0.05)
        assert c["in_flight_count"] == 10  # 4 handed out + 6 buffered, nothing finished
        assert r.finished == 0
        await r.aclose()
        assert r.finished == 0 and r.requeued == 10

    run_async(main())
    c = nsq_cluster.nsqds[0].channel_stats(T, C)
    assert c["depth"] == n and c["in_flight_count"] == 0 and c["requeue_count"] == 10


@pytest.mark.nsqd
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_iterating_from_another_loop_or_mixing_pull_ways_is_a_typed_error(nsq_cluster):
    publish(nsq_cluster.nsqd_http_addresses[0], T, bodies(3))

    async def main() -> None:
        r = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=10)
        m = await asyncio.wait_for(r.__aiter__().__anext__(), 5)
        errors: list[BaseException] = []

        def other_loop() -> None:
            async def iterate() -> None:
                async for _ in r:
                    pass
            try:
                asyncio.run(iterate())
            except BaseException as exc:
                errors.append(exc)
        t = threading.Thread(target=other_loop)
        t.start()
        await asyncio.to_thread(t.join, 5)
        assert len(errors) == 1 and isinstance(errors[0], NSQError)
        assert "another event loop" in str(errors[0])
        with pytest.raises(NSQError, match="one Reader per way"):
            r.get_batch(timeout=0)
        with pytest.raises(NSQError, match="already pulled"):
            r.set_message_handler(lambda m: True)
        m.finish()
        await r.aclose()
        assert [x async for x in r] == []  # a closed Reader: the iteration is over

        p = Reader(T, "pulled", nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
        p.start()  # pull mode: its loop on a thread
        try:
            with pytest.raises(NSQError, match="one Reader per way"):
                await p.__aiter__().__anext__()
        finally:
            await asyncio.to_thread(p.close)

    run_async(main())


# -- fast: the real Reader on a real loop, fake connections (no sockets) -------------------


@pytest.fixture
def fake_connections() -> FakeConnections:
    """The connection factory to give the Reader: fakes, no sockets."""
    return FakeConnections()


async def first_step(r: Reader, it: Any) -> tuple[FakeConn, "asyncio.Future[Any]"]:
    """Start ``it.__anext__()`` (which starts ``r``); the subscribed fake connection."""
    step = asyncio.ensure_future(it.__anext__())
    for _ in range(100):
        await asyncio.sleep(0)
        if r.conns:
            break
    [conn] = r.conns.values()
    assert isinstance(conn, FakeConn)
    return conn, step


@pytest.mark.unit
def test_messages_come_one_at_a_time_in_order_and_count_in_flight(fake_connections):
    async def main() -> None:
        r = Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"],
                   connection_factory=fake_connections, max_in_flight=10)
        it = r.__aiter__()
        c, step = await first_step(r, it)
        assert not step.done()  # nothing delivered: waiting
        sent = c.deliver(3)
        got = [await step, await it.__anext__(), await it.__anext__()]
        assert got == sent and r.stats()["in_flight"] == 3 and c.fins() == []
        got[0].finish()
        await asyncio.sleep(0)
        assert c.fins() == [sent[0].id]
        await r.aclose()
        assert sorted(i for i, _ in c.reqs()) == sorted(m.id for m in sent[1:])
        assert {d for _, d in c.reqs()} == {0}
    run_async(main(), 10)


@pytest.mark.unit
def test_a_batch_is_cut_at_n_or_by_its_timeout_and_messages_left_stay_in_order(fake_connections):
    async def main() -> None:
        r = Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"],
                   connection_factory=fake_connections, max_in_flight=100)
        it = r.batches(4, timeout=0.2)
        c, step = await first_step(r, it)
        sent = c.deliver(6)
        assert await step == sent[:4]  # full: at once
        t0 = time.monotonic()
        one = await it.__anext__()  # 2 left, fewer than 4: the timeout ends the batch
        assert one == sent[4:] and time.monotonic() - t0 >= 0.1
        # the message iterator and the batches share one queue, in order
        more = c.deliver(5)
        msgs = r.__aiter__()
        assert [await msgs.__anext__(), await msgs.__anext__()] == more[:2]
        assert await it.__anext__() == more[2:]
        await r.aclose()
    run_async(main(), 10)


@pytest.mark.unit
def test_close_from_another_task_ends_a_waiting_iteration(fake_connections):
    async def main() -> None:
        r = Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"],
                   connection_factory=fake_connections, max_in_flight=100)
        it = r.batches(10, timeout=60)
        c, step = await first_step(r, it)
        sent = c.deliver(3)  # a partial batch, waiting for 7 more or 60 s
        await asyncio.sleep(0.05)
        assert not step.done()
        await r.aclose()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(step, 1)
        assert sorted(i for i, _ in c.reqs()) == sorted(m.id for m in sent)
        with pytest.raises(StopAsyncIteration):
            await it.__anext__()
    run_async(main(), 10)


@pytest.mark.unit
def test_cancelled_waits_leave_no_stale_waiter_and_lose_nothing(fake_connections):
    async def main() -> None:
        r = Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"],
                   connection_factory=fake_connections, max_in_flight=100)
        it = r.batches(10, timeout=60)
        c, step = await first_step(r, it)
        sent = c.deliver(2)
        await asyncio.sleep(0.01)
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        assert r._aiter._waiters == []
        again = await asyncio.wait_for(r.batches(10, timeout=0).__anext__(), 1)
        assert again == sent and c.reqs() == []
        r.finish(again)
        await r.aclose()
    run_async(main(), 10)


@pytest.mark.unit
def test_bad_arguments_and_wrong_contexts_are_typed_errors(fake_connections):
    r = Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"],
                   connection_factory=fake_connections)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="max_messages"):
            r.batches(bad)
    for bad_t in (-0.1, float("nan"), "1"):
        with pytest.raises(ConfigError, match="timeout"):
            r.batches(10, bad_t)
    # no running loop: __anext__ driven by hand
    coro = r.__aiter__().__anext__()
    with pytest.raises(NSQError, match="running event loop"):
        coro.send(None)
    assert r._mode is None  # nothing started
    r.close()

    async def with_handler() -> None:
        h = Reader("t", "c", lambda m: True, nsqd_tcp_addresses=["127.0.0.1:4150"],
                   connection_factory=fake_connections)
        with pytest.raises(NSQError, match="without a message_handler"):
            await h.__aiter__().__anext__()
        await h.aclose()
    run_async(with_handler(), 10)


# -- the pull queue's one-at-a-time taking (pure) -------------------------------------------


class _Answers:
    def hand_over_held(self, link: Any, msgs: list[Any]) -> None:
        link.rdy.in_flight += len(msgs)

    def flush(self) -> None:
        pass


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(1, 5)),
    st.tuples(st.just("one"), st.just(0)),
    st.tuples(st.just("get"), st.integers(1, 7))), max_size=40))
def test_take_one_and_get_messages_hand_out_each_message_once_in_order(ops):
    q = PullQueue(_Answers(), Lifecycle())  # type: ignore[arg-type]
    link = SimpleNamespace(rdy=SimpleNamespace(in_flight=0), outstanding={})
    put: list[int] = []
    out: list[int] = []
    for op, k in ops:
        if op == "put":
            msgs = [SimpleNamespace(id=len(put) + i) for i in range(k)]
            put.extend(m.id for m in msgs)
            q.put_messages(link, msgs)  # type: ignore[arg-type]
        elif op == "one":
            m = q.take_one()
            if m is not None:
                out.append(m.id)
            else:
                assert q.queued == 0
        else:
            got = q.get_messages(k, 0)
            assert len(got) <= k
            out.extend(m.id for m in got)
        assert q.queued == len(put) - len(out)
    out.extend(m.id for m in q.get_messages(10_000, 0))
    assert out == put and link.rdy.in_flight == len(put)


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(1, 5), st.sampled_from("ab")),
    st.tuples(st.just("one"), st.just(0), st.just("")),
    st.tuples(st.just("get"), st.integers(1, 7), st.just(""))), max_size=40))
def test_take_queued_takes_one_links_waiting_messages_and_keeps_the_others_in_order(ops):
    # disconnect_from_nsqd: what nsqd a delivered and nobody took yet leaves the queue;
    # b's waiting messages are handed out afterwards, in order, each once
    q = PullQueue(_Answers(), Lifecycle())  # type: ignore[arg-type]
    links = {k: SimpleNamespace(rdy=SimpleNamespace(in_flight=0), outstanding={})
             for k in "ab"}
    put: list[tuple[str, int]] = []
    out: list[tuple[str, int]] = []
    for op, k, which in ops:
        if op == "put":
            msgs = [SimpleNamespace(id=(which, len(put) + i), responder=links[which])
                    for i in range(k)]
            put.extend(m.id for m in msgs)
            q.put_messages(links[which], msgs)  # type: ignore[arg-type]
        elif op == "one":
            m = q.take_one()
            if m is not None:
                out.append(m.id)
        else:
            out.extend(m.id for m in q.get_messages(k, 0))
    taken, blocks = q.take_queued(links["a"])  # type: ignore[arg-type]
    waiting = [i for i in put if i not in out]
    assert blocks == [] and [m.id for m in taken] == [i for i in waiting if i[0] == "a"]
    assert q.queued == len(waiting) - len(taken)
    rest = [m.id for m in q.get_messages(10_000, 0)]
    assert rest == [i for i in waiting if i[0] == "b"] and q.queued == 0


@pytest.mark.unit
def test_a_failing_instrument_still_hands_the_pulled_messages_out(caplog):
    # the messages have left the queue when the instrument is told: if it raises, the
    # caller must still get them, or they would stay in flight until nsqd's msg_timeout
    def broken(messages: Any, start: float) -> None:
        raise RuntimeError("a tracer provider that raises")

    q = ReceivedPullQueue(_Answers(), Lifecycle(), broken, broken)  # type: ignore[arg-type]
    link = SimpleNamespace(rdy=SimpleNamespace(in_flight=0), outstanding={})
    msgs = [SimpleNamespace(id=i) for i in range(3)]
    q.put_messages(link, msgs)  # type: ignore[arg-type]
    with caplog.at_level("ERROR", logger="nsq_spark.reader.pull"):
        assert q.get_messages(2, 0) == msgs[:2]
        assert q.take_one() is msgs[2]
    assert [r.message for r in caplog.records].count(
        "telemetry failed on a pulled hand-out; the messages are handed out all the same") == 2
