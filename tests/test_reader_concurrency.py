"""``concurrency=N``: a blocking handler on a bounded pool of N threads (go-nsq's
``AddConcurrentHandlers``), through the one delivery gate and the answers ledger: against
real nsqd, handlers overlap up to N, never more than ``max_in_flight``; results FIN and
REQ as on the loop thread; ``enable_async()`` leaves the answer to the application;
closing requeues what the pool still holds. ``concurrency=1`` is today's strategy."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import pytest

from nsq_spark._consumer import handlers
from nsq_spark._consumer.reader import Reader
from nsq_spark.errors import ConfigError
from nsq_spark.message import Message
from nsq_spark.testing import NSQCluster, ReaderRunner, wait_until

pytestmark = pytest.mark.nsqd


def _topic() -> str:
    return "t" + uuid.uuid4().hex[:12]


class Overlap:
    """A blocking handler that records how many of its calls run at once."""

    def __init__(self, seconds: float, result: Any = True) -> None:
        self.seconds = seconds
        self.result = result
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.threads: set[str] = set()
        self.bodies: list[bytes] = []

    def __call__(self, m: Message) -> Any:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.threads.add(threading.current_thread().name)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
            self.bodies.append(m.body)
        return self.result


def test_n_threads_handle_blocking_messages_at_once_and_finish_them(
        nsq_cluster: NSQCluster, running_reader: ReaderRunner) -> None:
    topic = _topic()
    bodies = [b"m%d" % i for i in range(16)]
    nsq_cluster.publish(topic, bodies)
    handler = Overlap(0.2)
    t0 = time.monotonic()
    reader = running_reader.start(topic, "ch", handler, max_in_flight=16, concurrency=4,
                                  nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: reader.finished >= 16, 20, "16 finished")
    took = time.monotonic() - t0
    assert handler.most == 4  # four at once, never more
    assert len(handler.threads) == 4 and not any(
        n.startswith("test-reader") for n in handler.threads)  # not the loop thread
    assert sorted(handler.bodies) == sorted(bodies)
    assert took < 16 * 0.2 * 0.6  # serial would take 3.2 s
    running_reader.stop(reader)
    nsq_cluster.wait_drained(topic, "ch")
    assert reader.requeued == 0


def test_max_in_flight_bounds_the_queued_and_running_messages(
        nsq_cluster: NSQCluster, running_reader: ReaderRunner) -> None:
    topic = _topic()
    nsq_cluster.publish(topic, [b"x%d" % i for i in range(12)])
    handler = Overlap(0.1)
    reader = running_reader.start(topic, "ch", handler, max_in_flight=3, concurrency=8,
                                  nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    peak = 0
    deadline = time.monotonic() + 20
    while reader.finished < 12 and time.monotonic() < deadline:
        ch = nsq_cluster.nsqds[0].channel_stats(topic, "ch")
        peak = max(peak, ch.get("in_flight_count", 0))
        time.sleep(0.01)
    assert reader.finished == 12
    assert handler.most <= 3  # 8 threads, but only 3 messages may be out at once
    assert peak <= 3


def test_false_and_exceptions_requeue_like_on_the_loop_thread(
        nsq_cluster: NSQCluster, running_reader: ReaderRunner) -> None:
    topic = _topic()
    nsq_cluster.publish(topic, [b"ok", b"no", b"boom"])
    tries: dict[bytes, int] = {}
    lock = threading.Lock()

    def handler(m: Message) -> Any:
        with lock:
            tries[m.body] = tries.get(m.body, 0) + 1
        if m.attempts > 1:
            return True  # second delivery succeeds
        if m.body == b"boom":
            raise RuntimeError("handler failure")
        return m.body == b"ok"

    reader = running_reader.start(topic, "ch", handler, max_in_flight=3, concurrency=2,
                                  max_backoff_duration=0, requeue_delay=0,
                                  nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: reader.finished >= 3, 20, "3 finished")
    assert tries == {b"ok": 1, b"no": 2, b"boom": 2}
    assert reader.requeued == 2
    running_reader.stop(reader)
    nsq_cluster.wait_drained(topic, "ch")


def test_enable_async_leaves_the_answer_to_the_application(
        nsq_cluster: NSQCluster, running_reader: ReaderRunner) -> None:
    topic = _topic()
    nsq_cluster.publish(topic, [b"a", b"b"])
    kept: list[Message] = []

    def handler(m: Message) -> None:
        m.enable_async()
        kept.append(m)

    reader = running_reader.start(topic, "ch", handler, max_in_flight=2, concurrency=2,
                                  nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: len(kept) == 2, 10, "2 handed over")
    time.sleep(0.2)
    assert reader.finished == 0  # returning None after enable_async() answers nothing
    assert nsq_cluster.nsqds[0].channel_stats(topic, "ch")["in_flight_count"] == 2
    for m in kept:
        m.finish()
    wait_until(lambda: reader.finished == 2, 10, "2 finished by the application")
    running_reader.stop(reader)
    nsq_cluster.wait_drained(topic, "ch")


class Blocking:
    """A handler that records each message's id as it starts, then blocks until
    ``release`` is set (at most ``seconds``)."""

    def __init__(self, seconds: float = 10) -> None:
        self.seconds = seconds
        self.release = threading.Event()
        self.started: list[bytes] = []

    def __call__(self, m: Message) -> bool:
        self.started.append(m.id)
        self.release.wait(self.seconds)
        return True


class BlockedPool:
    """A Reader with a pool of 2 threads whose handler blocks until ``release`` is set:
    2 messages running, the rest of ``n`` queued in the pool."""

    def __init__(self, nsq_cluster: NSQCluster, n: int) -> None:
        self.topic = _topic()
        nsq_cluster.publish(self.topic, [b"q%d" % i for i in range(n)])
        handler = Blocking()
        self.release, self.started = handler.release, handler.started
        self.runner = ReaderRunner()
        self.reader = self.runner.start(self.topic, "ch", handler, max_in_flight=n,
                                        concurrency=2, drain_timeout=0.3,
                                        nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
        wait_until(lambda: len(self.started) == 2, 10, "2 handlers blocked")


def test_close_requeues_what_the_pool_still_holds(nsq_cluster: NSQCluster) -> None:
    blocked = BlockedPool(nsq_cluster, 6)
    reader = blocked.reader
    blocked.runner.stop(reader)  # 2 running, 4 queued: all 6 unanswered after drain_timeout
    blocked.release.set()
    assert reader.requeued == 6 and reader.finished == 0
    time.sleep(0.2)
    assert len(blocked.started) == 2  # the queued ones never reached the handler
    ch = nsq_cluster.nsqds[0].channel_stats(blocked.topic, "ch")
    assert ch["depth"] + ch["deferred_count"] == 6 and ch["in_flight_count"] == 0


def test_close_stops_a_pool_replaced_by_a_hook_from_starting_its_queue(
        nsq_cluster: NSQCluster) -> None:
    # a hook re-assigned mid-run retires the pool, which still works through its queue;
    # the Reader's close must tell it, as it tells the current one, to start nothing more
    # (its queued messages are requeued by the close: never both)
    blocked = BlockedPool(nsq_cluster, 4)
    reader = blocked.reader
    retired = reader._strategy
    assert isinstance(retired, handlers.Concurrent)
    closes: list[bool] = []
    real_close = retired.close
    retired.close = lambda skip_queued=False: (closes.append(skip_queued),  # type: ignore[method-assign]
                                               real_close(skip_queued))[1]
    reader.validate_message = lambda m: True  # type: ignore[method-assign]
    wait_until(lambda: reader._strategy is not retired, 10, "the pool replaced")
    assert closes == [False]  # retired: it finishes its queue
    blocked.runner.stop(reader)
    blocked.release.set()
    assert closes == [False, True]  # and the close stopped it starting queued messages
    assert reader.requeued == 4 and len(blocked.started) == 2


def test_concurrency_refuses_batch_and_async_handlers() -> None:
    async def coro(m: Message) -> None:
        return None
    with pytest.raises(ConfigError, match="batch_handler"):
        Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], batch_handler=lambda ms: True,
               concurrency=2)
    with pytest.raises(ConfigError, match="async def"):
        Reader("t", "c", coro, nsqd_tcp_addresses=["127.0.0.1:4150"], concurrency=2)
    r = Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], concurrency=2)
    with pytest.raises(ConfigError, match="async def"):
        r.set_message_handler(coro)
    with pytest.raises(ConfigError, match="concurrency=0"):
        Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], concurrency=0)


def test_one_thread_is_todays_strategy_and_n_is_the_pool() -> None:
    kw: dict[str, Any] = dict(batch_handler=None, answers=None, bridge=None, tasks=None,
                              name="n")
    assert type(handlers.choose(message_handler=lambda m: True, **kw)) is handlers.PerMessage
    assert type(handlers.choose(message_handler=lambda m: True, concurrency=1, **kw)
                ) is handlers.PerMessage
    pool = handlers.choose(message_handler=lambda m: True, concurrency=3, **kw)
    assert isinstance(pool, handlers.Concurrent) and pool.threads == 3
    hooked = handlers.choose(message_handler=lambda m: True, validate=lambda m: False,
                             concurrency=3, **kw)
    assert isinstance(hooked, handlers.Concurrent)  # pynsq's hooks run on the pool too


@pytest.mark.unit
def test_the_pools_error_lines_carry_the_nsqd_field() -> None:
    # the results the workers hand back are logged with the structured fields of the
    # other strategies (reader, and the nsqd of the message), not by the bare module logger
    from types import SimpleNamespace

    settled: list[tuple[bytes, bool]] = []
    answers: Any = SimpleNamespace(settle=lambda link, m, ok: settled.append((m.id, ok)),
                                   flush=lambda: None)
    pool = handlers.Concurrent(lambda m: True, answers, None, None, "r:c", 2)  # type: ignore[arg-type]
    link: Any = SimpleNamespace(address="127.0.0.1:4150")
    failed, odd, delegated = (Message(b"%016d" % i, b"", 0, 1) for i in range(3))
    delegated.delegated = True
    pool._done.extend([(link, failed, None, ValueError("boom")), (link, odd, 42, None),
                       (link, delegated, None, ValueError("late"))])
    records = _settle_logged(pool)
    assert settled == [(failed.id, False), (odd.id, False)]
    assert len(records) == 3
    for record in records:
        assert record.levelno == logging.ERROR
        assert (getattr(record, "nsqd", None), getattr(record, "reader", None)) == (
            "127.0.0.1:4150", "r:c")


def test_concurrency_refuses_a_coroutine_process_message_and_gen_coroutine() -> None:
    # the threads call the process_message override when there is one: an async def
    # override would hand each worker an un-awaited coroutine (nothing ever handled)
    from tornado import gen

    class AsyncProcess(Reader):
        async def process_message(self, message: Message) -> Any:  # type: ignore[override]
            return True

    with pytest.raises(ConfigError, match=r"concurrency=2 .*process_message.*concurrency at 1"):
        AsyncProcess("t", "c", lambda m: True, nsqd_tcp_addresses=["127.0.0.1:4150"],
                     concurrency=2)
    AsyncProcess("t", "c", lambda m: True, nsqd_tcp_addresses=["127.0.0.1:4150"])  # 1: fine

    @gen.coroutine
    def tornado_handler(m: Message) -> Any:
        return True

    with pytest.raises(ConfigError, match="concurrency=3"):
        Reader("t", "c", tornado_handler, nsqd_tcp_addresses=["127.0.0.1:4150"],
               concurrency=3)
    r = Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], concurrency=2)
    with pytest.raises(ConfigError, match="concurrency=2"):
        r.set_message_handler(tornado_handler)

    async def coro(m: Message) -> Any:
        return True

    with pytest.raises(ConfigError, match="process_message"):
        r.process_message = coro  # type: ignore[method-assign]
    assert "process_message" not in vars(r)  # refused, not half-applied
    with pytest.raises(ConfigError, match="concurrency"):
        handlers.choose(message_handler=lambda m: True, batch_handler=None, process=coro,
                        answers=None, bridge=None, tasks=None, name="n",  # type: ignore[arg-type]
                        concurrency=2)


def _settle_logged(pool: handlers.Concurrent) -> list[logging.LogRecord]:
    """The log records of the handlers' logger while ``pool`` settles its results."""
    records: list[logging.LogRecord] = []
    catch = logging.Handler(logging.DEBUG)
    catch.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("nsq_spark.reader.handlers")
    logger.addHandler(catch)
    try:
        pool._settle_done()
    finally:
        logger.removeHandler(catch)
    return records


def _unit_pool(handler: Any, threads: int = 1) -> tuple[handlers.Concurrent, Any]:
    from types import SimpleNamespace
    answers: Any = SimpleNamespace(hand_over_held=lambda link, msgs: None,
                                   settle=lambda link, m, ok: None, flush=lambda: None)
    bridge: Any = SimpleNamespace(loop=None)  # results stay in pool._done
    pool = handlers.Concurrent(handler, answers, bridge, None, "r:c", threads)  # type: ignore[arg-type]
    return pool, SimpleNamespace(address="127.0.0.1:4150")


@pytest.mark.unit
def test_closing_the_reader_starts_no_queued_message() -> None:
    # between the pool's close and the Reader's requeue_outstanding a worker that frees up
    # must not start a message the requeue is about to answer
    handler = Blocking(5)
    release, called = handler.release, handler.started
    pool, link = _unit_pool(handler)
    a, b, c = (Message(b"%016d" % i, b"", 0, 1) for i in range(3))
    pool(link, [a, b, c])
    wait_until(lambda: called == [a.id], 5, "the first message running")
    pool.close(skip_queued=True)  # what Reader._aclose does
    release.set()
    for t in pool._workers:
        t.join(5)
        assert not t.is_alive()
    assert called == [a.id]  # b and c were left (unanswered, held) for the requeue
    assert not b.responded and not c.responded
    assert [m for _, m, _, _ in pool._done] == [a]


@pytest.mark.unit
def test_a_hook_reassignment_close_still_hands_the_whole_queue() -> None:
    handler = Blocking(5)
    release, called = handler.release, handler.started
    pool, link = _unit_pool(handler)
    msgs = [Message(b"%016d" % i, b"", 0, 1) for i in range(3)]
    pool(link, msgs)
    wait_until(lambda: len(called) == 1, 5, "the first message running")
    pool.close()
    release.set()
    for t in pool._workers:
        t.join(5)
    assert called == [m.id for m in msgs]


@pytest.mark.unit
def test_a_base_exception_requeues_and_the_worker_lives_on() -> None:
    settled: list[tuple[bytes, bool]] = []

    def handler(m: Message) -> bool:
        if m.id.endswith(b"0"):
            raise SystemExit(3)  # would end a thread silently
        if m.id.endswith(b"1"):
            raise KeyboardInterrupt
        return True

    pool, link = _unit_pool(handler)
    pool.answers.settle = lambda link, m, ok: settled.append((m.id, ok))
    msgs = [Message(b"%016d" % i, b"", 0, 1) for i in range(3)]
    pool(link, msgs)
    wait_until(lambda: len(pool._done) == 3, 5, "all three handled by the one worker")
    assert pool._workers[0].is_alive()
    records = _settle_logged(pool)
    assert settled == [(msgs[0].id, False), (msgs[1].id, False), (msgs[2].id, True)]
    assert [getattr(r, "nsqd", None) for r in records] == ["127.0.0.1:4150"] * 2
    pool.close()
    pool._workers[0].join(5)
    assert not pool._workers[0].is_alive()  # the stop signal still ends it
