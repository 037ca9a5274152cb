"""The executor's Reader cache: one task at a time per key, paused between tasks, closed
when idle or when its task failed; and fetch tasks that reuse a cached Reader, taking
first what it held (no socket: the stand-in Reader of test_spark_unit)."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Hashable
from typing import Any

import pytest

from nsq_spark.spark._fetch import fetch_stream_partition
from nsq_spark.spark._fetch_task import ReaderLease, ReaderPort
from nsq_spark.spark.options import NSQOptionError, ReadOptions, parse_read_options
from nsq_spark.spark._reader_cache import CachedReaders, Pausable, cache_key
from nsq_spark.spark._spool import Spool

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stand_in_reader import Paused, StandInReader, as_pausable  # noqa: E402
from test_spark_unit import bodies, make_messages, opts, read_opts  # noqa: E402

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_reader_given_back_is_paused_and_reused_by_the_next_take_only():
    clock = Clock()
    cache: CachedReaders[Paused] = CachedReaders(clock, sweeper=False)
    made: list[Paused] = []

    def make() -> Paused:
        made.append(Paused())
        return made[-1]

    r, reused = cache.take("k", make)
    assert not reused and len(cache) == 0  # taken out: nobody else sees it
    other, reused2 = cache.take("k", make)
    assert not reused2 and other is not r  # a second task at once gets its own
    cache.give_back("k", r, idle_timeout=5.0)
    assert r.mif == [0] and len(cache) == 1
    clock.now = 4.9
    again, reused = cache.take("k", make)
    assert again is r and reused and r.closed == 0
    assert cache.take("other key", make)[1] is False


def test_an_idle_reader_is_closed_by_the_sweep_or_at_the_next_take():
    clock = Clock()
    cache: CachedReaders[Paused] = CachedReaders(clock, sweeper=False)
    a, b = Paused(), Paused()
    cache.give_back("a", a, idle_timeout=1.0)
    cache.give_back("b", b, idle_timeout=3.0)
    assert cache.next_expiry() == 1.0
    clock.now = 1.0
    assert cache.sweep() == 1 and a.closed == 1 and b.closed == 0
    clock.now = 3.5  # the sweeper did not run: the take notices
    fresh = Paused()
    got, reused = cache.take("b", lambda: fresh)
    assert got is fresh and not reused and b.closed == 1


def test_the_sweeper_thread_closes_idle_readers():
    import time

    cache: CachedReaders[Paused] = CachedReaders()
    r = Paused()
    cache.give_back("k", r, idle_timeout=0.05)
    deadline = time.monotonic() + 5
    while r.closed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert r.closed == 1 and len(cache) == 0


def test_a_failed_task_closes_its_reader_and_close_all_closes_the_rest():
    cache: CachedReaders[Paused] = CachedReaders(Clock(), sweeper=False)
    r, s = Paused(), Paused()
    cache.discard(r)
    cache.give_back("s", s, 5.0)
    cache.close_all()
    assert (r.closed, s.closed, len(cache)) == (1, 1, 0)


def test_the_key_tells_topics_connection_options_and_in_flight_apart(tmp_path):
    o = read_opts(tmp_path)
    base = cache_key(o, "t")
    assert base == cache_key(read_opts(tmp_path), "t")
    assert base != cache_key(o, "t2")
    assert base != cache_key(read_opts(tmp_path, authSecret="x"), "t")
    assert base != cache_key(dataclasses.replace(o, max_in_flight=8), "t")


def test_cache_options_are_bounded_below_msg_timeout():
    o = parse_read_options(opts(), streaming=True)
    assert o.reader_cache and o.reader_cache_idle_timeout == 5.0
    o = parse_read_options(opts(readerCache="false", readerCacheIdleTimeout="2"),
                           streaming=True)
    assert not o.reader_cache and o.reader_cache_idle_timeout == 2.0
    with pytest.raises(NSQOptionError, match="readerCacheIdleTimeout.*half of 'msgTimeout'"):
        parse_read_options(opts(readerCacheIdleTimeout="10", msgTimeout="15000"),
                           streaming=True)
    with pytest.raises(NSQOptionError, match="readerCacheIdleTimeout.*at most 300"):
        parse_read_options(opts(readerCacheIdleTimeout="301"), streaming=True)
    # its own bounds (its row's), not every duration's "> 0 .. 31,536,000"
    with pytest.raises(NSQOptionError, match=r"seconds, > 0 \.\. 300, or a duration .*not 'x'"):
        parse_read_options(opts(readerCacheIdleTimeout="x"), streaming=True)
    with pytest.raises(NSQOptionError, match="<= 300; at most 300 s: a paused Reader may "
                       "hold messages in flight"):
        parse_read_options(opts(readerCacheIdleTimeout="301"), streaming=True)
    with pytest.raises(NSQOptionError, match="readerCache"):
        parse_read_options(opts(readerCache="maybe"), streaming=True)
    with pytest.raises(NSQOptionError, match="did you mean 'readerCache'"):
        parse_read_options(opts(readerCach="true"), streaming=True)


def test_the_idle_timeout_stays_at_most_half_the_msg_timeout_the_reader_negotiates(tmp_path):
    """Decided once, in the options; the lease hands the cache the option as it is."""
    o = read_opts(tmp_path, readerCacheIdleTimeout="20", msgTimeout="60000")
    assert o.reader_cache_idle_timeout == 20
    # nsq.msg_timeout (seconds) is the same connection value as msgTimeout (ms)
    short = read_opts(tmp_path, **{"nsq.msg_timeout": "8"})
    assert short.reader_cache_idle_timeout == 4.0
    with pytest.raises(NSQOptionError, match="readerCacheIdleTimeout.*half of 'msgTimeout' "
                       "/ 'nsq.msg_timeout'.*8 s.*at most 4"):
        read_opts(tmp_path, readerCacheIdleTimeout="5", **{"nsq.msg_timeout": "8"})
    # without a msg_timeout nsqd's default, 60 s, applies: 30 s is the most
    assert read_opts(tmp_path, readerCacheIdleTimeout="30").reader_cache_idle_timeout == 30
    with pytest.raises(NSQOptionError, match="readerCacheIdleTimeout.*60 s, nsqd's default"):
        read_opts(tmp_path, readerCacheIdleTimeout="120")


class IdleTimeoutsGiven(CachedReaders[ReaderPort]):
    """The real cache, noting the idle timeout each Reader comes back with."""

    def __init__(self) -> None:
        super().__init__(Clock(), sweeper=False)
        self.idle_timeouts: list[float] = []

    def give_back(self, key: Hashable, reader: ReaderPort, idle_timeout: float) -> None:
        self.idle_timeouts.append(idle_timeout)
        super().give_back(key, reader, idle_timeout)


def test_the_lease_gives_the_cache_the_options_idle_timeout(tmp_path):
    o = read_opts(tmp_path, **{"nsq.msg_timeout": "8"})
    cache = IdleTimeoutsGiven()
    lease = ReaderLease(o, lambda _: StandInReader([], []), cache)
    lease.open(o.max_in_flight)
    lease.release(ok=True)
    assert cache.idle_timeouts == [4.0]


class LateArrivals(StandInReader):
    """nsqd had sent ``late`` more messages before it saw RDY 0: they reach the Reader
    after the task's drain, so the Reader holds them (un-FINished) when it is paused."""

    def __init__(self, queue: list[Any], log: list[Any], late: int) -> None:
        super().__init__(queue, log)
        self.late = late
        self.held: list[Any] = []

    def set_max_in_flight(self, max_in_flight: int) -> None:
        super().set_max_in_flight(max_in_flight)
        if max_in_flight == 0 and self.late:
            self.held, self.queue[:] = self.queue[:self.late], self.queue[self.late:]
            self.late = 0

    def get_blocks(self, max_messages: int = 1000, timeout: float = 1.0) -> list[Any]:
        if timeout == 0 and self.held:  # the drain: not here yet
            return []
        if self.held:  # the next task: they are buffered in the Reader
            self.queue[:0], self.held = self.held, []
        return super().get_blocks(max_messages, timeout)


def test_a_cached_reader_serves_the_next_batch_and_what_it_held_comes_first(tmp_path):
    o: ReadOptions = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "rc1")
    queue, log = make_messages(10), []
    made: list[LateArrivals] = []

    def factory(ro: ReadOptions) -> ReaderPort:
        made.append(LateArrivals(queue, log, late=2))
        return made[-1]

    cache: CachedReaders[ReaderPort] = CachedReaders(Clock(), sweeper=False)
    first = bodies(fetch_stream_partition(o, spool, 1, 0, 3, factory, reader_cache=cache))
    assert first == [b"body-%d" % i for i in range(3)]
    assert len(made) == 1 and not made[0].closed and len(cache) == 1
    assert made[0].held  # held, un-FINished, in the paused Reader
    second = bodies(fetch_stream_partition(o, spool, 2, 0, 4, factory, reader_cache=cache))
    assert len(made) == 1  # reused: no second connect
    assert second == [b"body-%d" % i for i in range(3, 7)]  # the held ones first, in order
    assert not [e for e in log if e[0] == "REQ"]
    fins = [i for what, ids in log if what == "FIN" for i in ids]
    assert len(fins) == len(set(fins)) == 7
    caps = [n for what, n in log if what == "MIF"]
    assert caps[-1] == 0 and 0 in caps[:-1]  # paused between the batches, resumed
    # a task that fails discards the Reader: closing it requeues what it holds
    with pytest.raises(ConnectionError):
        made[0].fail_after_gets = made[0].gets
        list(fetch_stream_partition(o, spool, 3, 0, 4, factory, reader_cache=cache))
    assert made[0].closed and len(cache) == 0


def test_without_the_cache_each_task_closes_its_reader(tmp_path):
    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "rc2")
    queue, log = make_messages(4), []
    made: list[StandInReader] = []

    def factory(ro: ReadOptions) -> ReaderPort:
        made.append(StandInReader(queue, log))
        return made[-1]

    for batch in (1, 2):
        list(fetch_stream_partition(o, spool, batch, 0, 2, factory))
    assert len(made) == 2 and all(r.closed for r in made)


def test_a_partition_stops_at_its_byte_share_and_completes_with_lag_figures(tmp_path):
    o = dataclasses.replace(read_opts(tmp_path), max_in_flight=2, spool_chunk_size=2)
    spool = Spool(str(tmp_path), "rc3")
    queue = make_messages(10)  # bodies of 6 bytes ("body-0")
    for i, m in enumerate(queue):
        m.timestamp += i * 1000  # a microsecond apart (Spark's timestamp unit)
    got = bodies(fetch_stream_partition(o, spool, 1, 0, None,
                                        lambda _: StandInReader(queue, []), max_bytes=13,
                                        topic="other"))
    # 12 < 13 after two bodies: the third reaches the share and is the last one taken
    assert got == [b"body-%d" % i for i in range(3)]
    done = spool.partition(1, 0).completion()
    assert done is not None and (done.rows, done.bytes) == (3, 18)
    assert done.oldest_timestamp_ns == 1_700_000_000_000_000_000
    assert done.newest_timestamp_ns == 1_700_000_000_000_002_000  # microsecond precision
    rows = list(fetch_stream_partition(o, spool, 1, 0, None, None))  # replay
    assert {t for rb in rows for t in rb.column("topic").to_pylist()} == {"other"}


def test_pausable_is_what_a_reader_port_gives():
    """The static half (every ReaderPort can be cached) is ``as_pausable``'s, checked by
    mypy --strict in tests/test_typing.py; here, that it hands back the Reader itself."""
    port: ReaderPort = StandInReader([], [])
    pausable: Pausable = as_pausable(port)
    assert pausable is port


def test_timings_go_to_the_observers_only(tmp_path, monkeypatch):
    import json

    from nsq_spark.spark import _fetch_task as fetch_task
    from nsq_spark.spark._fetch_task import observe_timings

    seen: list[dict[str, float]] = []
    remove = observe_timings(seen.append)
    try:
        list(fetch_stream_partition(read_opts(tmp_path), Spool(str(tmp_path), "rc4"), 1, 0,
                                    3, lambda _: StandInReader(make_messages(5), [])))
    finally:
        remove()
    assert len(seen) == 1 and seen[0]["rows"] == 3 and seen[0]["reused"] == 0
    assert seen[0]["t_end"] >= seen[0]["t_start"]
    # the benchmark's observer, named in the environment as for Spark's workers
    monkeypatch.setattr(fetch_task, "_env_observer_loaded", False)
    monkeypatch.setattr(fetch_task, "_observers", [])
    from bench import timings

    monkeypatch.setenv(timings.TIMINGS_DIR_ENV, str(tmp_path / "t"))
    monkeypatch.setenv(fetch_task.OBSERVER_ENV, "bench.timings:write_json")
    os.makedirs(tmp_path / "t")
    list(fetch_stream_partition(read_opts(tmp_path), Spool(str(tmp_path), "rc5"), 1, 0, 2,
                                lambda _: StandInReader(make_messages(5), [])))
    files = os.listdir(tmp_path / "t")
    assert len(files) == 1
    assert json.load(open(tmp_path / "t" / files[0]))["rows"] == 2


def test_a_batch_read_takes_the_topic_and_stops_at_its_byte_share(tmp_path):
    from nsq_spark.spark._fetch import fetch_batch_partition

    o = dataclasses.replace(read_opts(tmp_path), spool_chunk_size=2)
    queue, log = make_messages(10), []
    reader = StandInReader(queue, log)
    rows = list(fetch_batch_partition(o, 10, lambda _: reader, topic="other", max_bytes=13))
    # a chunk of 12 bytes, then the body that reaches 13 and nothing past it
    assert bodies(rows) == [b"body-%d" % i for i in range(3)]
    assert {t for rb in rows for t in rb.column("topic").to_pylist()} == {"other"}
    assert reader.closed and len(queue) == 7
