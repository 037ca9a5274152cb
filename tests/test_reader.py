"""The Reader against real nsqd/nsqlookupd: handlers (plain, batch, coroutine, async from
threads), responses, max_tries, requeue delays, TOUCH, RDY limits, set_max_in_flight,
is_starved, backoff, close, pull API, stats, dedup, discovery."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from nsq_spark.errors import AlreadyRespondedError, NSQError
from nsq_spark.reader import Reader
from nsq_spark.testing import free_port
from reader_helpers import assert_drained, await_for, channel_stats, mpub

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(60)]

T, C = "rt", "rc"


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def run_async(coro, timeout: float = 30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


# -- handlers -------------------------------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=2, lookupd=0)
def test_sync_handler_consumes_everything_from_two_nsqd(nsq_cluster):
    sent = bodies(500, "a") + bodies(500, "b")
    mpub(nsq_cluster.nsqd_http_addresses[0], T, sent[:500])
    mpub(nsq_cluster.nsqd_http_addresses[1], T, sent[500:])
    got = []

    def handler(m):
        got.append(m.body)
        assert m.attempts == 1 and len(m.id) == 16 and m.timestamp > 0
        return True

    async def main():
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=50)
        await await_for(lambda: len(got) >= 1000, 20, "1000 messages")
        await r.aclose()
        return r
    r = run_async(main())
    assert sorted(got) == sorted(sent)
    s = r.stats()
    assert s["finished"] == 1000 and s["requeued"] == 0 and s["messages_received"] == 1000
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_batch_handler_gets_lists_and_may_answer_some_itself(nsq_cluster):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, bodies(3000))
    sizes, got, requeued_once = [], [], set()

    def batch(msgs):
        sizes.append(len(msgs))
        for m in msgs:
            if m.body.endswith(b"7") and m.body not in requeued_once:
                requeued_once.add(m.body)
                m.requeue(delay=0, backoff=False)  # answered by the handler itself
            else:
                got.append(m.body)
        return True

    async def main():
        r = Reader(T, C, batch_handler=batch, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=1000)
        await await_for(lambda: len(got) >= 3000, 20, "3000 messages")
        await r.aclose()
        return r
    r = run_async(main())
    assert sorted(got) == sorted(bodies(3000))
    assert max(sizes) > 1  # really batches
    assert r.requeued == len(requeued_once) == 300
    assert r._backoff.level == 0  # backoff=False requeues are no failures
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_coroutine_handler_and_awaitable_results(nsq_cluster):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, bodies(200))
    got = []

    async def handler(m):
        await asyncio.sleep(0.001)
        if m.attempts == 1 and m.body.endswith(b"3"):
            return False  # requeued (then handled on the second attempt)
        got.append(m.body)
        return True

    async def main():
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=100, max_backoff_duration=0, requeue_delay=0)
        await await_for(lambda: len(got) >= 200, 20, "200 messages")
        await r.aclose()
        return r
    r = run_async(main())
    assert sorted(got) == sorted(bodies(200))
    assert r.requeued == 20
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_enable_async_answered_from_worker_threads(nsq_cluster):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, bodies(2000))
    got, threads = [], set()
    lock = threading.Lock()

    def worker(m):
        threads.add(threading.get_ident())
        with lock:
            got.append(m.body)
        m.finish()

    def handler(m):
        m.enable_async()
        threading.Thread(target=worker, args=(m,)).start()
        return True  # ignored: the message is async

    async def main():
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=200)
        await await_for(lambda: len(got) >= 2000 and r.finished >= 2000, 20, "2000 finished")
        await r.aclose()
        return r
    r = run_async(main())
    assert sorted(got) == sorted(bodies(2000))
    assert threading.get_ident() not in threads
    assert r.finished == 2000
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_handlers_returning_executor_futures(nsq_cluster):
    """``return executor.submit(work, m)``: the result is settled on the Reader's loop, not
    in the worker thread that completes the future (asyncio debug mode catches loop calls
    from other threads); a batch handler may return one too."""
    import concurrent.futures
    mpub(nsq_cluster.nsqd_http_addresses[0], T, bodies(300))
    pool = concurrent.futures.ThreadPoolExecutor(4)
    got, batches = [], []

    def work(m):
        got.append(m.body)
        return not m.body.endswith(b"7") or m.attempts > 1  # some fail once

    def batch_work(msgs):
        batches.append(len(msgs))
        return True

    async def main():
        asyncio.get_running_loop().set_debug(True)
        r = Reader(T, C, lambda m: pool.submit(work, m),
                   nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=50,
                   max_backoff_duration=0, requeue_delay=0)
        await await_for(lambda: r.finished >= 300, 15, "300 finished")
        await r.aclose()
        mpub(nsq_cluster.nsqd_http_addresses[0], T, bodies(100, "b"))
        rb = Reader(T, C, batch_handler=lambda msgs: pool.submit(batch_work, msgs),
                    nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=50,
                    max_backoff_duration=0, requeue_delay=0)
        await await_for(lambda: rb.finished >= 100, 15, "100 finished by a batch handler")
        await rb.aclose()
        return r, rb
    try:
        r, rb = run_async(main())
    finally:
        pool.shutdown()
    assert r.finished == 300 and r.requeued == 30 and sorted(set(got)) == sorted(bodies(300))
    assert rb.finished == 100 and rb.requeued == 0 and sum(batches) == 100
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_handler_exception_and_none(nsq_cluster):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, [b"boom", b"none"])
    seen = []

    def handler(m):
        seen.append((m.body, m.attempts))
        if m.body == b"boom" and m.attempts == 1:
            raise RuntimeError("handler bug")
        return None  # go-nsq semantics: no error means success

    async def main():
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=5, max_backoff_duration=0, requeue_delay=0)
        await await_for(lambda: (b"boom", 2) in seen and r.finished == 2, 10, "retry")
        await r.aclose()
    run_async(main())
    assert sorted(seen) == [(b"boom", 1), (b"boom", 2), (b"none", 1)]
    assert_drained(nsq_cluster, T, C)


# -- requeue delays, max_tries, giving_up ---------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_max_tries_giving_up_then_fin_and_growing_capped_delay(nsq_cluster):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, [b"bad"])
    deliveries, gave_up = [], []

    class R(Reader):
        def giving_up(self, message):
            gave_up.append((message.body, message.attempts))

    def handler(m):
        deliveries.append(time.monotonic())
        return False

    async def main():
        r = R(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
              max_tries=3, max_backoff_duration=0, requeue_delay=0.3, max_requeue_delay=0.45)
        await await_for(lambda: gave_up and r.finished == 1, 15, "giving up")
        await r.aclose()
        return r
    r = run_async(main())
    assert gave_up == [(b"bad", 4)]
    assert len(deliveries) == 3 and r.given_up == 1
    gaps = [b - a for a, b in zip(deliveries, deliveries[1:])]
    assert gaps[0] >= 0.29  # 0.3 s * 1 attempt
    assert gaps[1] >= 0.44  # 0.3 s * 2 = 0.6 s, capped at 0.45 s
    assert gaps[1] < 0.6 + 0.25  # the cap really applied (nsqd scans deferred every 100 ms)
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_giving_up_that_fails_requeues_instead_of_finishing(nsq_cluster):
    """pynsq requeues a message whose giving_up() raised: finishing it would drop a
    message the application could not put aside (e.g. its dead-letter store was down)."""
    mpub(nsq_cluster.nsqd_http_addresses[0], T, [b"poison"])
    gave_up = []

    class R(Reader):
        def giving_up(self, message):
            gave_up.append(message.attempts)
            if len(gave_up) == 1:
                raise OSError("dead-letter store unreachable")

    async def main():
        r = R(T, C, lambda m: False, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
              max_tries=1, max_backoff_duration=0, requeue_delay=0)
        await await_for(lambda: len(gave_up) >= 2 and r.finished == 1, 10, "giving up twice")
        await r.aclose()
        return r
    r = run_async(main())
    assert gave_up == [2, 3]  # the failed giving_up got the message back, the next one kept it
    assert r.given_up == 2 and r.finished == 1 and r.requeued == 2
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_message_requeue_delay_is_seconds_as_in_pynsq(nsq_cluster):
    # pynsq's Message.requeue(delay=2) defers by 2 s (REQ 2000): nsqd must hold it deferred
    # for about 2 s, not 2 ms; and msg_timeout=2 (seconds) is what nsqd says it applies.
    # nsqd adds a new channel to its deferred-queue scan only at its next 5 s refresh, so a
    # warm-up message (requeued by 1 ms) is redelivered first: after that, timing is nsqd's
    # 100 ms scan and a 2 ms REQ would come back in well under a second.
    mpub(nsq_cluster.nsqd_http_addresses[0], T, [b"warm-up"])
    deliveries: dict[bytes, list[float]] = {b"warm-up": [], b"later": []}
    deferred_seen = []

    def handler(m):
        deliveries[m.body].append(time.monotonic())
        if m.attempts == 1:
            if m.body == b"warm-up":
                m.requeue(delay_ms=1, backoff=False)
            else:
                m.requeue(delay=2, backoff=False)
        return True

    async def main():
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_backoff_duration=0, msg_timeout=2, heartbeat_interval=5)
        await await_for(lambda: len(deliveries[b"warm-up"]) == 2, 10, "warm-up redelivered")
        mpub(nsq_cluster.nsqd_http_addresses[0], T, [b"later"])
        await await_for(lambda: len(deliveries[b"later"]) == 1, 10, "first delivery")
        await await_for(lambda: channel_stats(nsq_cluster, 0, T, C).get("deferred_count") == 1,
                        5, "the requeued message deferred in nsqd")
        deferred_seen.append(time.monotonic())
        await await_for(lambda: len(deliveries[b"later"]) == 2, 10, "redelivery")
        negotiated = [c.msg_timeout for c in r.conns.values()]  # nsqd's IDENTIFY answer, ms
        await await_for(lambda: r.finished == 2, 5, "finish")
        await r.aclose()
        return r, negotiated
    r, negotiated = run_async(main())
    assert negotiated == [2000]
    first, again = deliveries[b"later"]
    assert 1.9 <= again - first < 4.5, again - first  # 2 s, plus nsqd's 100 ms scans
    assert deferred_seen[0] - first < 1.9  # it sat deferred, not in flight
    assert r.stats()["requeued"] == 2
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_touch_only_when_asked(nsq_cluster):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, [b"slow", b"fast"])
    done = []

    def slow(m):
        for _ in range(6):  # 1.8 s of work on a 1 s msg_timeout, touching every 0.3 s
            time.sleep(0.3)
            m.touch()
        m.finish()
        done.append(m.body)

    def handler(m):
        if m.body == b"slow":
            m.enable_async()
            threading.Thread(target=slow, args=(m,)).start()
            return None
        done.append(m.body)
        return True

    async def main():
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=5, msg_timeout=1)
        await await_for(lambda: len(done) == 2 and r.finished == 2, 10, "both done")
        await r.aclose()
    run_async(main())
    c = channel_stats(nsq_cluster, 0, T, C)
    assert c["timeout_count"] == 0 and c["requeue_count"] == 0  # touches kept it alive
    assert sorted(done) == [b"fast", b"slow"]
    assert_drained(nsq_cluster, T, C)


# -- RDY ------------------------------------------------------------------------------------


def _client_rdy(cluster, i):
    c = channel_stats(cluster, i, T, C)
    return [(cl["ready_count"], cl["in_flight_count"]) for cl in c.get("clients", [])]


@pytest.mark.nsq_cluster(nsqd=3, lookupd=0)
def test_rdy_sum_bounded_and_even_spread(nsq_cluster):
    held = []
    hold = [True]
    samples = []

    def handler(m):
        if not hold[0]:
            return True
        m.enable_async()
        held.append(m)
        return None

    async def main():
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=31)
        # publish once every connection is subscribed: a connection that joins later trims
        # the others' RDY, but cannot take back what they already have in flight
        await await_for(lambda: len(r.conns) == 3, 10, "3 connections")
        for http in nsq_cluster.nsqd_http_addresses:
            await asyncio.to_thread(mpub, http, T, bodies(300))
        # hold everything: in flight reaches RDY and stays there
        await await_for(lambda: len(held) >= 30, 10, "30 held")
        await asyncio.sleep(0.3)
        for i in range(3):
            samples.append(await asyncio.to_thread(_client_rdy, nsq_cluster, i))
        stats = r.stats()
        assert r.is_starved()
        assert len(held) == 30  # 3 * (31 // 3): never more than the sum of RDY
        hold[0] = False
        for m in held:
            m.finish()
        await await_for(lambda: r.finished >= 900, 20, "all finished")
        await r.aclose()
        return stats
    stats = run_async(main())
    rdys = [s[0][0] for s in samples]
    assert rdys == [10, 10, 10]  # 31 // 3 each; sum 30 <= 31
    assert all(s[0][1] == 10 for s in samples)
    assert sum(c["rdy"] for c in stats["connections"].values()) <= 31
    for c in stats["connections"].values():
        assert c["state"] == "subscribed" and c["in_flight"] == 10 and c["rdy"] == 10
        assert c["backoff"] == "normal" and c["max_rdy_count"] == 2500
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=3, lookupd=0)
def test_fewer_rdy_than_connections_drains_every_nsqd(nsq_cluster):
    sent = []
    for i, http in enumerate(nsq_cluster.nsqd_http_addresses):
        b = bodies(20, f"n{i}-")
        mpub(http, T, b)
        sent += b
    got = []
    max_seen = [0]

    def handler(m):
        got.append(m.body)
        return True

    async def main():
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=1, low_rdy_idle_timeout=0.3, rdy_redistribute_interval=0.1)
        deadline = time.monotonic() + 20
        while len(got) < 60 and time.monotonic() < deadline:
            max_seen[0] = max(max_seen[0], r.total_rdy)
            await asyncio.sleep(0.01)
        await r.aclose()
    run_async(main(), 30)
    assert sorted(got) == sorted(sent)
    assert max_seen[0] <= 1
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_set_max_in_flight_zero_pauses_and_resumes(nsq_cluster):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, bodies(100))
    got = []

    def handler(m):
        got.append(m.body)
        if len(got) == 10:
            r.set_max_in_flight(0)
        return True

    async def main():
        global r
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=1)
        await await_for(lambda: len(got) >= 10, 10, "10 messages")
        await asyncio.sleep(0.5)
        paused_at = len(got)
        rdy = await asyncio.to_thread(_client_rdy, nsq_cluster, 0)
        await asyncio.to_thread(r.set_max_in_flight, 5)  # from another thread
        await await_for(lambda: len(got) >= 100, 10, "the rest")
        await r.aclose()
        return paused_at, rdy
    paused_at, rdy = run_async(main())
    assert paused_at == 10 and rdy == [(0, 0)]
    assert sorted(got) == sorted(bodies(100))


@pytest.mark.nsq_cluster(nsqd=2, lookupd=0)
def test_is_starved_lets_a_buffering_handler_flush(nsq_cluster):
    # pynsq's documented batching pattern: buffer until is_starved(), then answer all
    mpub(nsq_cluster.nsqd_http_addresses[0], T, bodies(37, "x"))
    mpub(nsq_cluster.nsqd_http_addresses[1], T, bodies(41, "y"))
    buf, done = [], []

    def handler(m):
        m.enable_async()
        buf.append(m)
        if r.is_starved():
            for b in buf:
                done.append(b.body)
                b.finish()
            buf.clear()

    async def main():
        global r
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=20)
        # RDY 10 per nsqd: starved at 9 in flight on one connection, so each connection
        # keeps a tail of at most 8 that never starves it
        await await_for(lambda: len(done) >= 78 - 2 * 8, 15, "buffered flushes")
        flushed = len(done)
        await await_for(lambda: r.messages_received >= 78, 15, "all delivered")
        for b in buf:  # the tail that can never starve a connection
            done.append(b.body)
            b.finish()
        buf.clear()
        await r.aclose()
        return flushed
    flushed = run_async(main())
    assert flushed >= 78 - 2 * 8
    assert sorted(done) == sorted(bodies(37, "x") + bodies(41, "y"))
    assert_drained(nsq_cluster, T, C)


# -- backoff --------------------------------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=2, lookupd=0)
def test_backoff_rdy_zero_then_test_waters_then_recover(nsq_cluster):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, bodies(200, "a"))
    mpub(nsq_cluster.nsqd_http_addresses[1], T, bodies(200, "b"))
    fail_until = [0]
    got = []
    observed = {}

    def handler(m):
        if time.monotonic() < fail_until[0]:
            return False
        got.append(m.body)
        return True

    async def main():
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=20, backoff_multiplier=1.0, max_backoff_duration=2.0,
                   requeue_delay=0)  # windows long enough to read nsqd's stats inside one
        tests = []
        orig = r._policy.test_waters

        def test_waters():  # record what testing the waters sent
            cmds = orig()
            tests.append((r._policy.total_rdy, [n for _, n in cmds]))
            return cmds
        r._policy.test_waters = test_waters
        await await_for(lambda: len(got) >= 20, 10, "warm up")
        fail_until[0] = time.monotonic() + 0.6
        await await_for(lambda: r._backoff.level >= 1, 10, "backoff")
        st = r.stats()
        observed["in_backoff"] = (st["backoff"], st["total_rdy"],
                                  await asyncio.to_thread(_client_rdy, nsq_cluster, 0),
                                  await asyncio.to_thread(_client_rdy, nsq_cluster, 1))
        # testing the waters: at most one RDY 1 in total
        await await_for(lambda: tests, 10, "testing the waters")
        observed["testing"] = tests
        await await_for(lambda: len(got) >= 400, 20, "recovery")
        observed["after"] = r.stats()
        await r.aclose()
    run_async(main(), 40)
    backoff, total_rdy, c0, c1 = observed["in_backoff"]
    assert backoff["level"] >= 1 and backoff["in_window"]
    assert total_rdy == 0 and c0[0][0] == 0 and c1[0][0] == 0  # RDY 0 everywhere
    assert observed["testing"][0] == (1, [1])  # RDY 1 on one connection, 1 in total
    after = observed["after"]
    assert after["backoff"]["level"] == 0 and after["rdy_mode"] == "normal"
    assert after["total_rdy"] == 20
    assert sorted(got) == sorted(bodies(200, "a") + bodies(200, "b"))
    assert_drained(nsq_cluster, T, C)


# -- close ----------------------------------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_close_waits_for_async_handlers_and_requeues_the_rest(nsq_cluster):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, bodies(10))
    finished_late = []

    async def handler(m):
        if m.body == b"m0":
            await asyncio.sleep(0.3)  # finishes during close
            finished_late.append(m.body)
            return True
        m.touch()  # a touched message is still in flight: close must requeue it too
        await asyncio.sleep(30)  # never in time: requeued by close

    async def main():
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=10, drain_timeout=1.0)
        await await_for(lambda: r.messages_received >= 10, 10, "10 in flight")
        t0 = time.monotonic()
        await r.aclose()
        return r, time.monotonic() - t0
    r, took = run_async(main())
    assert finished_late == [b"m0"]
    assert 0.9 <= took < 5
    c = channel_stats(nsq_cluster, 0, T, C)
    assert c["in_flight_count"] == 0 and c["timeout_count"] == 0
    assert c["depth"] == 9 and c["requeue_count"] == 9  # handed back at once, not timed out
    assert c["client_count"] == 0


# -- pull API -------------------------------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=2, lookupd=0)
def test_pull_api_bulk_finish_and_requeue(nsq_cluster):
    sent = bodies(1500)
    mpub(nsq_cluster.nsqd_http_addresses[0], T, sent[:700])
    mpub(nsq_cluster.nsqd_http_addresses[1], T, sent[700:])
    got, requeued = [], set()
    with Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                max_in_flight=400, max_backoff_duration=0, requeue_delay=0) as r:
        for batch in r.iter_batches(max_messages=250, timeout=2.0):
            assert 0 < len(batch) <= 250
            again = [m for m in batch if m.body.endswith(b"5") and m.attempts == 1]
            ok = [m for m in batch if not (m.body.endswith(b"5") and m.attempts == 1)]
            r.requeue(again, delay_ms=0)
            requeued.update(m.body for m in again)
            r.finish(ok)
            got += [m.body for m in ok]
            with pytest.raises(AlreadyRespondedError):
                r.finish(ok[:1])
            if len(got) >= 1500:
                break
        st = r.stats()
    assert sorted(got) == sorted(sent)
    assert len(requeued) == 150 and st["requeued"] == 150
    assert r.closed
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_pull_close_requeues_unanswered_and_restarts_cheaply(nsq_cluster):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, bodies(310))
    threads_before = threading.active_count()
    handled = []
    for round_ in range(6):  # start/stop repeatedly in one process
        r = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=100)
        batch = []
        while len(batch) < 60:  # the first batch may be 1 message: RDY 1 on a new connection
            more = r.get_batch(max_messages=60 - len(batch), timeout=5)
            assert more
            batch += more
        keep, leave = batch[:50], batch[50:]
        for m in keep:
            m.finish()  # per message, from this (non-loop) thread
        handled += [m.body for m in keep]
        r.close()  # `leave` and whatever was queued are requeued, not left to time out
        assert r.closed
        with pytest.raises(NSQError):
            leave[0].finish()
        c = channel_stats(nsq_cluster, 0, T, C)
        assert c["in_flight_count"] == 0 and c["client_count"] == 0
    assert len(handled) == len(set(handled)) == 300
    assert threading.active_count() <= threads_before
    c = channel_stats(nsq_cluster, 0, T, C)
    assert c["timeout_count"] == 0 and c["depth"] == 10


def test_pull_api_rejected_with_handler_and_argument_errors():
    r = Reader(T, C, batch_handler=lambda ms: True, nsqd_tcp_addresses=["127.0.0.1:1"])
    with pytest.raises(NSQError, match="without a message_handler"):
        r.get_batch()
    r.close()  # never started: closing is immediate, and it will not start later
    assert r.closed
    with pytest.raises(ValueError, match="nsqd_tcp_addresses or lookupd_http_addresses"):
        Reader(T, C)
    with pytest.raises(ValueError, match="host:port"):
        Reader(T, C, nsqd_tcp_addresses="localhost")
    with pytest.raises(ValueError, match="not both"):
        Reader(T, C, lambda m: True, nsqd_tcp_addresses="h:1", batch_handler=print)
    with pytest.raises(ValueError, match="max_in_flight"):
        Reader(T, C, nsqd_tcp_addresses="h:1", max_in_flight=-1)
    with pytest.raises(Exception, match="topic"):
        Reader("bad topic!", C, nsqd_tcp_addresses="h:1")
    with pytest.raises(Exception, match="unknown connection option"):
        Reader(T, C, nsqd_tcp_addresses="h:1", heartbeat_intervall=5)


def test_direct_nsqd_that_comes_up_later_is_reached_by_reconnect_backoff():
    from nsq_spark.testing import NSQCluster
    with NSQCluster(nsqd=1, lookupd=0) as cluster:
        cluster.nsqds[0].kill()
        mpub_later = bodies(50)
        r = Reader(T, C, nsqd_tcp_addresses=cluster.nsqd_tcp_addresses, max_in_flight=10,
                   reconnect_initial=0.1, reconnect_max=0.5)
        assert r.get_batch(timeout=0.5) == []  # nothing reachable yet; retrying meanwhile
        cluster.restart(0)
        mpub(cluster.nsqd_http_addresses[0], T, mpub_later)
        got = []
        deadline = time.monotonic() + 15
        while len(got) < 50 and time.monotonic() < deadline:
            b = r.get_batch(timeout=0.5)
            r.finish(b)
            got += [m.body for m in b]
        r.close()
        assert sorted(got) == sorted(mpub_later)


# -- dedup ----------------------------------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_dedup_drops_duplicates_and_failed_handling_erases(nsq_cluster):
    from nsq_spark.dedup import OppositeBloomFilter, by_body_digest
    sent = bodies(300)
    mpub(nsq_cluster.nsqd_http_addresses[0], T, sent)
    mpub(nsq_cluster.nsqd_http_addresses[0], T, sent[:100])  # a publisher's retries
    calls = []

    def handler(m):
        calls.append((m.body, m.attempts))
        return not (m.body == b"m207" and m.attempts == 1)  # fails once: must come back

    async def main():
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=50, dedup=OppositeBloomFilter(1 << 20),
                   dedup_key=by_body_digest, max_backoff_duration=0, requeue_delay=0)
        await await_for(lambda: r.finished + r.requeued >= 401 and (b"m207", 2) in calls, 15,
                        "all answered")
        await r.aclose()
        return r
    r = run_async(main())
    handled = [b for b, a in calls if not (b == b"m207" and a == 1)]
    assert set(handled) == set(sent)  # each body handled
    # every extra delivery was either dropped as a duplicate or (the filter forgets a key
    # when another lands in its bucket: expected ~0.08 times here) handled again
    assert r.duplicates + (len(handled) - len(sent)) == 100
    assert r.duplicates >= 98
    assert_drained(nsq_cluster, T, C)


# -- discovery ------------------------------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=2, lookupd=2)
def test_lookupd_discovery_with_one_lookupd_down_and_late_nsqd(nsq_cluster):
    sent = bodies(100, "a") + bodies(100, "b")
    mpub(nsq_cluster.nsqd_http_addresses[0], T, sent[:100])
    mpub(nsq_cluster.nsqd_http_addresses[1], T, sent[100:])
    nsq_cluster.kill_lookupd(1)
    dead = f"127.0.0.1:{free_port()}"
    got = []

    def handler(m):
        got.append(m.body)
        return True

    async def main():
        r = Reader(T, C, handler, lookupd_http_addresses=[*nsq_cluster.lookupd_http_addresses,
                                                          dead],
                   max_in_flight=10, lookupd_poll_interval=0.5, lookupd_poll_jitter=0.3)
        await await_for(lambda: len(got) >= 200, 15, "both nsqd drained")
        i = await asyncio.to_thread(nsq_cluster.add_nsqd)
        late = bodies(50, "late")
        await asyncio.to_thread(mpub, nsq_cluster.nsqd_http_addresses[i], T, late)
        t0 = time.monotonic()
        await await_for(lambda: len(r.conns) == 3, 10, "late nsqd discovered")
        found = time.monotonic() - t0
        await await_for(lambda: len(got) >= 250, 10, "late messages")
        await r.aclose()
        return late, found
    late, found = run_async(main(), 40)
    assert found <= 0.5 * 1.3 + 0.5  # one poll interval plus jitter (+ connect slack)
    assert sorted(got) == sorted(sent + late)
    assert_drained(nsq_cluster, T, C)


# -- more handler shapes ----------------------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_coroutine_batch_handler(nsq_cluster):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, bodies(500))
    got, sizes = [], []

    async def batch(msgs):
        sizes.append(len(msgs))
        await asyncio.sleep(0.001)
        got.extend(m.body for m in msgs)
        # returning None finishes every message the handler did not answer itself

    async def main():
        r = Reader(T, C, batch_handler=batch, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=200)
        await await_for(lambda: r.finished >= 500, 15, "500 finished")
        await r.aclose()
    run_async(main())
    assert sorted(got) == sorted(bodies(500))
    assert max(sizes) > 1
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_pynsq_subclass_hooks(nsq_cluster):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, [b"keep-1", b"skip-2", b"keep-3"])
    processed, validated = [], []

    class R(Reader):
        def preprocess_message(self, message):
            message.body = message.body.upper()
            return message

        def validate_message(self, message):
            validated.append(message.body)
            return not message.body.startswith(b"SKIP")  # False: finished, not handled

        def process_message(self, message):
            processed.append(message.body)
            return True

    async def main():
        r = R(T, C, lambda m: pytest.fail("process_message overrides the handler"),
              nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=5)
        await await_for(lambda: r.finished >= 3, 10, "3 finished")
        await r.aclose()
    run_async(main())
    assert sorted(validated) == [b"KEEP-1", b"KEEP-3", b"SKIP-2"]
    assert sorted(processed) == [b"KEEP-1", b"KEEP-3"]
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_dedup_forgets_messages_requeued_by_close(nsq_cluster):
    """close() requeues what was never answered: a shared (e.g. Redis) deduplicator must
    not then take the redelivery for a duplicate and finish it unhandled."""
    from nsq_spark.dedup import OppositeBloomFilter
    sent = bodies(20)
    mpub(nsq_cluster.nsqd_http_addresses[0], T, sent)
    seen = OppositeBloomFilter(1 << 16)
    r1 = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=20,
                dedup=seen, max_backoff_duration=0)
    try:
        assert r1.get_batch(5, timeout=10)  # pulled, never answered
    finally:
        r1.close()
    assert r1.duplicates == 0
    got = []
    r2 = Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=20,
                dedup=seen, max_backoff_duration=0)
    try:
        deadline = time.monotonic() + 10
        while len(got) < len(sent) and time.monotonic() < deadline:
            batch = r2.get_batch(100, timeout=0.5)
            got.extend(m.body for m in batch)
            r2.finish(batch)
    finally:
        r2.close()
    assert r2.duplicates == 0
    assert sorted(got) == sorted(sent)
    assert_drained(nsq_cluster, T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_handler_errors_are_logged_with_the_nsqd_address(nsq_cluster, caplog):
    mpub(nsq_cluster.nsqd_http_addresses[0], T, [b"x"])
    calls = []

    def handler(m):
        calls.append(m.attempts)
        return 42 if m.attempts == 1 else True  # 42: neither a result nor an awaitable

    async def main():
        r = Reader(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_backoff_duration=0, requeue_delay=0)
        await await_for(lambda: r.finished >= 1, 10, "finished after the requeue")
        await r.aclose()
        return r
    with caplog.at_level("ERROR", logger="nsq_spark.reader"):
        r = run_async(main())
    assert calls == [1, 2] and r.requeued == 1
    errors = [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]
    assert any("returned 42" in e and nsq_cluster.nsqd_tcp_addresses[0] in e for e in errors), errors


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
@pytest.mark.parametrize("mode", ["pull", "batch"])
def test_max_tries_in_pull_and_batch_modes(nsq_cluster, mode):
    """Over max_tries, pulled and batch-handled messages go to giving_up() and are FINished
    instead of reaching the caller or the batch handler again."""
    topic = f"{T}_{mode}"
    mpub(nsq_cluster.nsqd_http_addresses[0], topic, [b"a", b"b", b"c"])
    gave_up: list[bytes] = []
    handled: list[tuple[bytes, int]] = []

    class R(Reader):
        def giving_up(self, message):
            gave_up.append(message.body)

    kwargs = dict(nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_tries=1,
                  max_backoff_duration=0, requeue_delay=0, max_in_flight=10)
    if mode == "pull":
        r = R(topic, C, **kwargs)
        try:
            deadline = time.monotonic() + 10
            while len(handled) < 3 and time.monotonic() < deadline:
                batch = r.get_batch(10, timeout=0.5)
                handled.extend((m.body, m.attempts) for m in batch)
                r.requeue(batch, delay_ms=0)
            deadline = time.monotonic() + 10
            while len(gave_up) < 3 and time.monotonic() < deadline:
                batch = r.get_batch(10, timeout=0.2)
                handled.extend((m.body, m.attempts) for m in batch)
                r.requeue(batch, delay_ms=0)
        finally:
            r.close()
    else:
        def batch_handler(msgs):
            handled.extend((m.body, m.attempts) for m in msgs)
            return False

        async def main():
            r = R(topic, C, batch_handler=batch_handler, **kwargs)
            await await_for(lambda: len(gave_up) == 3, 10, "giving up on all three")
            await r.aclose()
        run_async(main())
    assert sorted(gave_up) == [b"a", b"b", b"c"]
    assert sorted(handled) == [(b"a", 1), (b"b", 1), (b"c", 1)]  # never handed out again
    assert_drained(nsq_cluster, topic, C)
