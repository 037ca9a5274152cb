"""The Reader against real nsqd/nsqlookupd: what only a real server shows.

Kept here: the wire end to end over several nsqd, requeue delays and TOUCH as nsqd applies
them, the msg_timeout nsqd negotiates, RDY redistribution and pausing seen in nsqd's
stats, close handing messages back to nsqd, repeated pull sessions, reconnecting to a late
nsqd, lookupd discovery, and the handler shapes whose results cross threads or loops. The
rules that need no server (results and requeue delays, giving_up, in flight, is_starved,
backoff, pull accounting, dedup) are unit-tested against a fake connection in
tests/test_consumer_reader.py and tests/test_rdy.py.

The plugin's helpers do the plumbing: ``nsq_cluster.publish`` (HTTP, no client of ours),
``running_reader`` (a Reader on its own loop thread, closed after the test), ``wait_until``
and ``nsq_cluster.wait_drained``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from nsq_spark._consumer.reader import Reader
from nsq_spark.errors import NSQError
from nsq_spark.testing import NSQCluster, free_port, wait_until

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(60)]

T, C = "rt", "rc"


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def nsqd_rdy(cluster: NSQCluster, i: int) -> list[tuple[int, int]]:
    """(ready_count, in_flight_count) of each client nsqd ``i`` has on the channel."""
    c = cluster.nsqds[i].channel_stats(T, C)
    return [(cl["ready_count"], cl["in_flight_count"]) for cl in c.get("clients", [])]


# -- handlers -------------------------------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=2, lookupd=0)
def test_sync_handler_consumes_everything_from_two_nsqd(nsq_cluster, running_reader):
    sent = bodies(500, "a") + bodies(500, "b")
    nsq_cluster.publish(T, sent[:500], nsqd=0)
    nsq_cluster.publish(T, sent[500:], nsqd=1)
    got = []

    def handler(m):
        got.append(m.body)
        assert m.attempts == 1 and len(m.id) == 16 and m.timestamp > 0
        return True

    r = running_reader.start(T, C, handler, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                             max_in_flight=50)
    wait_until(lambda: len(got) >= 1000, 20, "1000 messages")
    running_reader.stop(r)
    assert sorted(got) == sorted(sent)
    s = r.stats()
    assert s["finished"] == 1000 and s["requeued"] == 0 and s["messages_received"] == 1000
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_batch_handler_gets_lists_and_may_answer_some_itself(nsq_cluster, running_reader):
    nsq_cluster.publish(T, bodies(3000))
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

    r = running_reader.start(T, C, batch_handler=batch, max_in_flight=1000,
                             nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: len(got) >= 3000, 20, "3000 messages")
    running_reader.stop(r)
    assert sorted(got) == sorted(bodies(3000))
    assert max(sizes) > 1  # really batches: nsqd's chunks, handed over whole
    assert r.requeued == len(requeued_once) == 300
    assert r.stats()["backoff"]["level"] == 0  # backoff=False requeues are no failures
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_coroutine_batch_handler(nsq_cluster, running_reader):
    nsq_cluster.publish(T, bodies(500))
    got, sizes = [], []

    async def batch(msgs):
        sizes.append(len(msgs))
        await asyncio.sleep(0.001)
        got.extend(m.body for m in msgs)
        # returning None finishes every message the handler did not answer itself

    r = running_reader.start(T, C, batch_handler=batch, max_in_flight=200,
                             nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: r.finished >= 500, 15, "500 finished")
    running_reader.stop(r)
    assert sorted(got) == sorted(bodies(500))
    assert max(sizes) > 1
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_handlers_returning_executor_futures(nsq_cluster, running_reader):
    """``return executor.submit(work, m)``: the result is settled on the Reader's loop, not
    in the worker thread that completes the future (asyncio debug mode catches loop calls
    from other threads); a batch handler may return one too."""
    pool = concurrent.futures.ThreadPoolExecutor(4)
    got, batches = [], []

    def work(m):
        got.append(m.body)
        return not m.body.endswith(b"7") or m.attempts > 1  # some fail once

    def batch_work(msgs):
        batches.append(len(msgs))
        return True

    def debugged(r: Reader) -> Reader:
        assert r.loop is not None
        r.loop.call_soon_threadsafe(r.loop.set_debug, True)
        return r

    try:
        r = debugged(running_reader.start(
            T, C, lambda m: pool.submit(work, m), max_in_flight=50, max_backoff_duration=0,
            requeue_delay=0, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses))
        nsq_cluster.publish(T, bodies(300))
        wait_until(lambda: r.finished >= 300, 15, "300 finished")
        running_reader.stop(r)
        rb = debugged(running_reader.start(
            T, C, batch_handler=lambda msgs: pool.submit(batch_work, msgs), max_in_flight=50,
            max_backoff_duration=0, requeue_delay=0,
            nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses))
        nsq_cluster.publish(T, bodies(100, "b"))
        wait_until(lambda: rb.finished >= 100, 15, "100 finished by a batch handler")
        running_reader.stop(rb)
    finally:
        pool.shutdown()
    assert r.finished == 300 and r.requeued == 30 and sorted(set(got)) == sorted(bodies(300))
    assert rb.finished == 100 and rb.requeued == 0 and sum(batches) == 100
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_pynsq_subclass_hooks(nsq_cluster, running_reader):
    nsq_cluster.publish(T, [b"keep-1", b"skip-2", b"keep-3"])
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

    r = running_reader.start(T, C, lambda m: pytest.fail("process_message overrides it"),
                             reader_class=R, max_in_flight=5,
                             nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: r.finished >= 3, 10, "3 finished")
    running_reader.stop(r)
    assert sorted(validated) == [b"KEEP-1", b"KEEP-3", b"SKIP-2"]
    assert sorted(processed) == [b"KEEP-1", b"KEEP-3"]
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_handler_errors_are_logged_with_the_nsqd_address(nsq_cluster, running_reader, caplog):
    nsq_cluster.publish(T, b"x")
    calls = []

    def handler(m):
        calls.append(m.attempts)
        return 42 if m.attempts == 1 else True  # 42: neither a result nor an awaitable

    with caplog.at_level("ERROR", logger="nsq_spark.reader"):
        r = running_reader.start(T, C, handler, max_backoff_duration=0, requeue_delay=0,
                                 nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
        wait_until(lambda: r.finished >= 1, 10, "finished after the requeue")
        running_reader.stop(r)
    assert calls == [1, 2] and r.requeued == 1
    errors = [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]
    assert any("returned 42" in e and nsq_cluster.nsqd_tcp_addresses[0] in e for e in errors), errors


# -- requeue delays, max_tries, TOUCH: as nsqd applies them ----------------------------------


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_max_tries_giving_up_then_fin_and_growing_capped_delay(nsq_cluster, running_reader):
    nsq_cluster.publish(T, b"bad")
    deliveries, gave_up = [], []

    class R(Reader):
        def giving_up(self, message):
            gave_up.append((message.body, message.attempts))

    def handler(m):
        deliveries.append(time.monotonic())
        return False

    r = running_reader.start(T, C, handler, reader_class=R, max_tries=3,
                             max_backoff_duration=0, requeue_delay=0.3, max_requeue_delay=0.45,
                             nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: gave_up and r.finished == 1, 15, "giving up")
    running_reader.stop(r)
    assert gave_up == [(b"bad", 4)]
    assert len(deliveries) == 3 and r.given_up == 1
    gaps = [b - a for a, b in zip(deliveries, deliveries[1:])]
    assert gaps[0] >= 0.29  # 0.3 s * 1 attempt
    assert gaps[1] >= 0.44  # 0.3 s * 2 = 0.6 s, capped at 0.45 s
    assert gaps[1] < 0.6 + 0.25  # the cap really applied (nsqd scans deferred every 100 ms)
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_message_requeue_delay_is_seconds_as_in_pynsq(nsq_cluster, running_reader):
    # pynsq's Message.requeue(delay=2) defers by 2 s (REQ 2000): nsqd must hold it deferred
    # for about 2 s, not 2 ms; and msg_timeout=2 (seconds) is what nsqd says it applies.
    # nsqd adds a new channel to its deferred-queue scan only at its next 5 s refresh, so a
    # warm-up message (requeued by 1 ms) is redelivered first: after that, timing is nsqd's
    # 100 ms scan and a 2 ms REQ would come back in well under a second.
    nsq_cluster.publish(T, b"warm-up")
    deliveries: dict[bytes, list[float]] = {b"warm-up": [], b"later": []}

    def handler(m):
        deliveries[m.body].append(time.monotonic())
        if m.attempts == 1:
            if m.body == b"warm-up":
                m.requeue(delay_ms=1, backoff=False)
            else:
                m.requeue(delay=2, backoff=False)
        return True

    r = running_reader.start(T, C, handler, max_backoff_duration=0, msg_timeout=2,
                             heartbeat_interval=5,
                             nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: len(deliveries[b"warm-up"]) == 2, 10, "warm-up redelivered")
    nsq_cluster.publish(T, b"later")
    wait_until(lambda: len(deliveries[b"later"]) == 1, 10, "first delivery")
    wait_until(lambda: nsq_cluster.nsqds[0].channel_stats(T, C).get("deferred_count") == 1,
               5, "the requeued message deferred in nsqd", interval=0.01)
    deferred_seen = time.monotonic()
    wait_until(lambda: len(deliveries[b"later"]) == 2, 10, "redelivery", interval=0.01)
    negotiated = [c.msg_timeout for c in r.conns.values()]
    wait_until(lambda: r.finished == 2, 5, "finish")
    running_reader.stop(r)
    assert negotiated == [2000]  # nsqd's IDENTIFY answer, ms
    first, again = deliveries[b"later"]
    assert 1.9 <= again - first < 4.5, again - first  # 2 s, plus nsqd's 100 ms scans
    assert deferred_seen - first < 1.9  # it sat deferred, not in flight
    assert r.stats()["requeued"] == 2
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_touch_only_when_asked(nsq_cluster, running_reader):
    nsq_cluster.publish(T, [b"slow", b"fast"])
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

    r = running_reader.start(T, C, handler, max_in_flight=5, msg_timeout=1,
                             nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: len(done) == 2 and r.finished == 2, 10, "both done")
    running_reader.stop(r)
    c = nsq_cluster.nsqds[0].channel_stats(T, C)
    assert c["timeout_count"] == 0 and c["requeue_count"] == 0  # touches kept it alive
    assert sorted(done) == [b"fast", b"slow"]
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
@pytest.mark.parametrize("mode", ["pull", "batch"])
def test_max_tries_in_pull_and_batch_modes(nsq_cluster, running_reader, mode):
    """Over max_tries, pulled and batch-handled messages go to giving_up() and are FINished
    instead of reaching the caller or the batch handler again (nsqd counts the attempts)."""
    topic = f"{T}_{mode}"
    nsq_cluster.publish(topic, [b"a", b"b", b"c"])
    gave_up: list[bytes] = []
    handled: list[tuple[bytes, int]] = []

    class R(Reader):
        def giving_up(self, message):
            gave_up.append(message.body)

    kwargs = dict(nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_tries=1,
                  max_backoff_duration=0, requeue_delay=0, max_in_flight=10)
    if mode == "pull":
        with R(topic, C, **kwargs) as r:
            def pull_and_requeue(timeout: float) -> None:
                batch = r.get_batch(10, timeout=timeout)
                handled.extend((m.body, m.attempts) for m in batch)
                r.requeue(batch, delay_ms=0)
            wait_until(lambda: pull_and_requeue(0.5) or len(handled) >= 3, 10, "3 pulled")
            wait_until(lambda: pull_and_requeue(0.2) or len(gave_up) >= 3, 10, "3 given up")
    else:
        def batch_handler(msgs):
            handled.extend((m.body, m.attempts) for m in msgs)
            return False

        r = running_reader.start(topic, C, batch_handler=batch_handler, reader_class=R, **kwargs)
        wait_until(lambda: len(gave_up) == 3, 10, "giving up on all three")
        running_reader.stop(r)
    assert sorted(gave_up) == [b"a", b"b", b"c"]
    assert sorted(handled) == [(b"a", 1), (b"b", 1), (b"c", 1)]  # never handed out again
    nsq_cluster.wait_drained(topic, C)


# -- RDY as nsqd sees it ----------------------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=3, lookupd=0)
def test_fewer_rdy_than_connections_drains_every_nsqd(nsq_cluster, running_reader):
    sent = []
    for i in range(3):
        b = bodies(20, f"n{i}-")
        nsq_cluster.publish(T, b, nsqd=i)
        sent += b
    got = []
    max_seen = [0]

    def handler(m):
        got.append(m.body)
        return True

    r = running_reader.start(T, C, handler, max_in_flight=1, low_rdy_idle_timeout=0.3,
                             rdy_redistribute_interval=0.1,
                             nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)

    def all_got() -> bool:
        max_seen[0] = max(max_seen[0], r.total_rdy)
        return len(got) >= 60
    wait_until(all_got, 20, "60 messages from 3 nsqd through RDY 1", interval=0.01)
    running_reader.stop(r)
    assert sorted(got) == sorted(sent)
    assert max_seen[0] <= 1
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_set_max_in_flight_zero_pauses_and_resumes(nsq_cluster, running_reader):
    nsq_cluster.publish(T, bodies(100))
    got = []
    readers: list[Reader] = []

    def handler(m):
        got.append(m.body)
        if len(got) == 10:
            readers[0].set_max_in_flight(0)  # on the loop
        return True

    readers.append(running_reader.start(T, C, handler, max_in_flight=1,
                                        nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses))
    wait_until(lambda: len(got) >= 10, 10, "10 messages")
    time.sleep(0.5)
    paused_at, rdy = len(got), nsqd_rdy(nsq_cluster, 0)
    readers[0].set_max_in_flight(5)  # from another thread
    wait_until(lambda: len(got) >= 100, 10, "the rest")
    running_reader.stop(readers[0])
    assert paused_at == 10 and rdy == [(0, 0)]
    assert sorted(got) == sorted(bodies(100))


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_a_reader_paused_before_it_connects_receives_nothing_until_resumed(nsq_cluster):
    """max_in_flight=0 is refused (as by pynsq: it would never receive, silently); pausing
    at the start is set_max_in_flight(0) right after construction."""
    with pytest.raises(NSQError, match="set_max_in_flight"):
        Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=0)
    nsq_cluster.publish(T, bodies(20))
    with Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                max_in_flight=5) as reader:
        reader.set_max_in_flight(0)
        assert reader.get_batch(max_messages=20, timeout=1.0) == []
        wait_until(lambda: nsqd_rdy(nsq_cluster, 0) == [(0, 0)], 10, "the subscription, RDY 0")
        reader.set_max_in_flight(5)
        got: list[bytes] = []
        while len(got) < 20:
            batch = reader.get_batch(max_messages=20, timeout=5)
            assert batch, f"nothing after resuming; {len(got)} so far"
            got += [m.body for m in batch]
            reader.finish(batch)
    assert sorted(got) == sorted(bodies(20))


# -- close hands messages back to nsqd ---------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_close_waits_for_async_handlers_and_requeues_the_rest(nsq_cluster, running_reader):
    nsq_cluster.publish(T, bodies(10))
    finished_late = []

    async def handler(m):
        if m.body == b"m0":
            await asyncio.sleep(0.3)  # finishes during close
            finished_late.append(m.body)
            return True
        m.touch()  # a touched message is still in flight: close must requeue it too
        await asyncio.sleep(30)  # never in time: requeued by close

    r = running_reader.start(T, C, handler, max_in_flight=10, drain_timeout=1.0,
                             nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: r.messages_received >= 10, 10, "10 in flight")
    t0 = time.monotonic()
    running_reader.stop(r)
    took = time.monotonic() - t0
    assert finished_late == [b"m0"]
    assert 0.9 <= took < 5
    # nsqd reads the REQs and the CLS after close() returned: wait for it (well inside its
    # 60 s msg_timeout, so nothing here can have timed out instead)
    c = wait_until(lambda: (lambda c: c if c["in_flight_count"] == 0 else None)(
        nsq_cluster.nsqds[0].channel_stats(T, C)), 10, "nsqd to take the answers")
    assert c["timeout_count"] == 0
    assert c["depth"] == 9 and c["requeue_count"] == 9  # handed back at once, not timed out
    assert c["client_count"] == 0


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_pull_close_requeues_unanswered_and_restarts_cheaply(nsq_cluster):
    nsq_cluster.publish(T, bodies(310))
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
        # nsqd reads the last FINs, REQs and the CLS after close() returned
        wait_until(lambda: (lambda c: c["in_flight_count"] == 0 and c["client_count"] == 0)(
            nsq_cluster.nsqds[0].channel_stats(T, C)), 10, "nsqd to take the answers")
    assert len(handled) == len(set(handled)) == 300
    assert threading.active_count() <= threads_before
    c = nsq_cluster.nsqds[0].channel_stats(T, C)
    assert c["timeout_count"] == 0 and c["depth"] == 10


# -- dedup across real redeliveries ------------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_dedup_drops_a_publisher_s_retries_by_body_digest(nsq_cluster, running_reader):
    from nsq_spark.dedup import OppositeBloomFilter, by_body_digest
    sent = bodies(300)
    nsq_cluster.publish(T, sent)
    nsq_cluster.publish(T, sent[:100])  # a publisher's retries: same bodies, new ids
    calls = []

    def handler(m):
        calls.append((m.body, m.attempts))
        return not (m.body == b"m207" and m.attempts == 1)  # fails once: must come back

    r = running_reader.start(T, C, handler, max_in_flight=50,
                             dedup=OppositeBloomFilter(1 << 20), dedup_key=by_body_digest,
                             max_backoff_duration=0, requeue_delay=0,
                             nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: r.finished + r.requeued >= 401 and (b"m207", 2) in calls, 15,
               "all answered")
    running_reader.stop(r)
    handled = [b for b, a in calls if not (b == b"m207" and a == 1)]
    assert set(handled) == set(sent)  # each body handled
    # every extra delivery was either dropped as a duplicate or (the filter forgets a key
    # when another lands in its bucket: expected ~0.08 times here) handled again
    assert r.duplicates + (len(handled) - len(sent)) == 100
    assert r.duplicates >= 98
    nsq_cluster.wait_drained(T, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_dedup_forgets_messages_requeued_by_close(nsq_cluster):
    """close() requeues what was never answered: a shared (e.g. Redis) deduplicator must
    not then take the redelivery for a duplicate and finish it unhandled."""
    from nsq_spark.dedup import OppositeBloomFilter
    sent = bodies(20)
    nsq_cluster.publish(T, sent)
    seen = OppositeBloomFilter(1 << 16)
    with Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=20,
                dedup=seen, max_backoff_duration=0) as r1:
        assert r1.get_batch(5, timeout=10)  # pulled, never answered
    assert r1.duplicates == 0
    got = []
    with Reader(T, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_in_flight=20,
                dedup=seen, max_backoff_duration=0) as r2:
        def pull() -> bool:
            batch = r2.get_batch(100, timeout=0.5)
            got.extend(m.body for m in batch)
            r2.finish(batch)
            return len(got) >= len(sent)
        wait_until(pull, 10, "every message once", interval=0)
    assert r2.duplicates == 0
    assert sorted(got) == sorted(sent)
    nsq_cluster.wait_drained(T, C)


# -- reconnect and discovery -------------------------------------------------------------------


def test_direct_nsqd_that_comes_up_later_is_reached_by_reconnect_backoff():
    with NSQCluster(nsqd=1, lookupd=0) as cluster:
        cluster.nsqds[0].kill()
        later = bodies(50)
        with Reader(T, C, nsqd_tcp_addresses=cluster.nsqd_tcp_addresses, max_in_flight=10,
                    reconnect_initial=0.1, reconnect_max=0.5) as r:
            assert r.get_batch(timeout=0.5) == []  # nothing reachable yet; retrying meanwhile
            cluster.restart(0)
            cluster.publish(T, later)
            got = []

            def pull() -> bool:
                b = r.get_batch(timeout=0.5)
                r.finish(b)
                got.extend(m.body for m in b)
                return len(got) >= 50
            wait_until(pull, 15, "50 messages after the restart", interval=0)
        assert sorted(got) == sorted(later)


@pytest.mark.nsq_cluster(nsqd=2, lookupd=2)
def test_lookupd_discovery_with_one_lookupd_down_and_late_nsqd(nsq_cluster, running_reader):
    sent = bodies(100, "a") + bodies(100, "b")
    nsq_cluster.publish(T, sent[:100], nsqd=0)
    nsq_cluster.publish(T, sent[100:], nsqd=1)
    nsq_cluster.kill_lookupd(1)
    dead = f"127.0.0.1:{free_port()}"
    got = []

    def handler(m):
        got.append(m.body)
        return True

    r = running_reader.start(T, C, handler, max_in_flight=10, lookupd_poll_interval=0.5,
                             lookupd_poll_jitter=0.3,
                             lookupd_http_addresses=[*nsq_cluster.lookupd_http_addresses, dead])
    wait_until(lambda: len(got) >= 200, 15, "both nsqd drained")
    i = nsq_cluster.add_nsqd()
    late = bodies(50, "late")
    nsq_cluster.publish(T, late, nsqd=i)
    t0 = time.monotonic()
    wait_until(lambda: len(r.conns) == 3, 10, "late nsqd discovered",
               interval=0.01)
    found = time.monotonic() - t0
    wait_until(lambda: len(got) >= 250, 10, "late messages")
    running_reader.stop(r)
    assert found <= 0.5 * 1.3 + 0.5  # one poll interval plus jitter (+ connect slack)
    assert sorted(got) == sorted(sent + late)
    nsq_cluster.wait_drained(T, C)


# -- publish envelopes ------------------------------------------------------------------------


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_publish_envelopes_are_opened_and_a_damaged_one_is_handed_over_whole(
        nsq_cluster, running_reader):
    from nsq_spark.envelope import stamp

    pid = bytes(range(16))
    good = stamp(b"published", pid)
    cut = stamp(b"inner-value", bytes(16))[:-3]
    nsq_cluster.publish(T, [good, cut, b"plain"])
    got = []
    r = running_reader.start(T, C, lambda m: got.append((m.body, m.publish_id)),
                             nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                             max_in_flight=10)
    wait_until(lambda: len(got) == 3, 20, "3 messages")
    assert sorted(got, key=repr) == sorted([(b"published", pid), (cut, None),
                                            (b"plain", None)], key=repr)
    assert r.stats()["damaged_envelopes"] == 1
    nsq_cluster.wait_drained(T, C, 10)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_open_envelopes_false_hands_bodies_over_as_delivered(nsq_cluster, running_reader):
    from nsq_spark.envelope import stamp

    wire = stamp(b"published", bytes(range(16)))
    nsq_cluster.publish(T, [wire])
    got = []
    running_reader.start(T, C, lambda m: got.append((m.body, m.publish_id)),
                         nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                         open_envelopes=False)
    wait_until(lambda: got, 20, "the message")
    assert got == [(wire, None)]
