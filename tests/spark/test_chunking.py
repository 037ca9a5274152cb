"""ChunkPlanner: the fetch task's cut / wait / drain / settle / finish decisions, without
IO; plus a hypothesis state machine that drives it like the task does."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nsq_spark.spark._chunking import Action, ChunkPlanner, Step, body_bytes

pytestmark = pytest.mark.unit


def planner(now: float = 0.0, chunk_size: int = 10, max_jobs: int = 2,
            share: int | None = None, byte_share: int | None = None,
            idle: float = 1.0, period: float = 10.0, expecting: bool = False,
            mif: int = 20) -> ChunkPlanner:
    return ChunkPlanner(now=now, chunk_size=chunk_size, max_jobs=max_jobs, share=share,
                        byte_share=byte_share, idle_timeout=idle, max_fetch_period=period,
                        flush_interval=2.0, first_wait=5.0, writer_poll=0.002,
                        expecting=expecting, max_in_flight=mif)


def test_it_starts_by_fetching_a_chunk_worth_for_the_idle_timeout():
    assert planner().next(0.0) == Step(Action.FETCH, want=10, timeout=1.0)


def test_a_batch_nsqd_reported_waits_longer_the_first_time_only():
    p = planner(share=30, expecting=True)
    assert p.next(0.0) == Step(Action.FETCH, want=10, timeout=5.0, first=True)
    p.fetched(3, 30, now=0.1, waited=5.0, starved=False)
    assert p.next(0.1) == Step(Action.FETCH, want=7, timeout=1.0)


def test_a_full_chunk_is_cut_and_the_next_fetch_polls_for_the_writer():
    p = planner()
    p.fetched(10, 100, now=0.1, waited=1.0, starved=False)
    assert p.next(0.1).action is Action.CUT
    assert p.cut() == (10, 100)
    assert p.next(0.1) == Step(Action.FETCH, want=10, timeout=0.002)


def test_a_durable_chunk_is_settled_first_and_capped_to_the_share_left():
    p = planner(share=25, mif=20)
    p.fetched(10, 100, now=0.0, waited=1.0, starved=False)
    p.cut()
    p.oldest_durable = True
    assert p.next(0.0).action is Action.SETTLE
    assert p.rdy_cap_before_fin(10) == 15  # 25 - 10: nsqd may send no more than that
    assert p.settled() == 10 and p.finished == 10
    assert p.rdy_cap_before_fin(10) == 5


def test_a_full_window_of_writers_waits_for_the_oldest():
    p = planner(max_jobs=1)
    p.fetched(10, 0, now=0.0, waited=1.0, starved=False)
    p.cut()
    p.fetched(10, 0, now=0.0, waited=0.002, starved=False)
    assert p.next(0.0).action is Action.SETTLE


def test_a_starved_reader_gets_its_chunk_cut_at_once():
    p = planner()
    p.fetched(3, 0, now=0.0, waited=1.0, starved=True)
    assert p.next(0.0).action is Action.CUT


def test_pending_messages_are_cut_after_the_flush_interval():
    p = planner()
    p.fetched(3, 0, now=0.0, waited=1.0, starved=False)
    assert p.next(1.5) == Step(Action.FETCH, want=7, timeout=0.5)
    assert p.next(2.0).action is Action.CUT


def test_reaching_the_share_drains_without_waiting_then_cuts_then_finishes():
    p = planner(share=5)
    p.fetched(5, 50, now=0.0, waited=1.0, starved=False)
    assert p.next(0.0).action is Action.DRAIN
    p.drained(2, 20, now=0.0)  # what nsqd had sent before RDY 0, already here
    assert p.next(0.0).action is Action.CUT
    assert p.cut() == (7, 70)  # the share is a target: the last chunk ends a little above
    assert p.next(0.0).action is Action.SETTLE
    assert p.rdy_cap_before_fin(7) is None  # drained: RDY stays 0
    p.settled()
    assert p.next(0.0).action is Action.FINISH


def test_the_byte_share_ends_the_fetch_like_the_message_share():
    p = planner(byte_share=100)
    p.fetched(4, 120, now=0.0, waited=1.0, starved=False)
    assert p.want() == 0
    assert p.next(0.0).action is Action.DRAIN


def test_an_idle_wait_ends_the_fetch_and_a_writer_poll_does_not():
    p = planner()
    p.fetched(5, 0, now=0.0, waited=1.0, starved=False)
    p.cut()
    p.fetched(0, 0, now=0.0, waited=0.002, starved=False)  # only polled for the writer
    assert not p.idle
    p.oldest_durable = True
    assert p.next(0.0).action is Action.SETTLE
    p.settled()
    p.fetched(0, 0, now=1.0, waited=1.0, starved=False)
    assert p.idle and p.next(1.0).action is Action.DRAIN
    p.drained(0, 0, now=1.0)
    assert p.next(1.0).action is Action.FINISH


def test_no_wait_goes_past_max_fetch_period():
    p = planner(period=0.5)
    assert p.next(0.2).timeout == pytest.approx(0.3)
    assert p.next(0.5).action is Action.DRAIN


def test_body_bytes_is_the_frames_less_their_headers():
    assert body_bytes([100, 130, 170], 2, 26) == 70 - 2 * 26


def test_misuse_is_refused():
    p = planner()
    with pytest.raises(ValueError, match="nothing pending"):
        p.cut()
    with pytest.raises(ValueError, match="no chunk"):
        p.settled()
    with pytest.raises(ValueError, match="chunk_size"):
        planner(chunk_size=0)


class TaskMachine(RuleBasedStateMachine):
    """Drives the planner as FetchTask does, with nsqd and the writers played by
    hypothesis: messages arrive or not, writers finish in order, the clock moves."""

    def __init__(self) -> None:
        super().__init__()
        self.p: ChunkPlanner | None = None
        self.now = 0.0
        self.nsqd = 0  # messages nsqd still has for us
        self.durable = 0  # chunks of the writers' queue that are durable (oldest first)
        self.step: Step | None = None
        self.drains = 0
        self.finished = False
        self.cut_sizes: list[int] = []
        self.last_cut_after_drain = False

    @precondition(lambda self: self.p is None)
    @rule(chunk=st.integers(1, 8), jobs=st.integers(1, 3),
          share=st.none() | st.integers(1, 40), byte_share=st.none() | st.integers(1, 400),
          backlog=st.integers(0, 60), expecting=st.booleans())
    def start(self, chunk: int, jobs: int, share: int | None, byte_share: int | None,
              backlog: int, expecting: bool) -> None:
        self.p = planner(chunk_size=chunk, max_jobs=jobs, share=share,
                         byte_share=byte_share, expecting=expecting, mif=chunk * (jobs + 1))
        self.nsqd = backlog
        self.ask()

    def ask(self) -> None:
        assert self.p is not None
        if self.p.jobs and self.durable:
            self.p.oldest_durable = True
        self.step = self.p.next(self.now)

    @precondition(lambda self: self.step is not None and self.step.action is Action.FETCH)
    @rule(take=st.integers(0, 8), dt=st.floats(0, 3), starved=st.booleans())
    def fetch(self, take: int, dt: float, starved: bool) -> None:
        assert self.p is not None and self.step is not None
        n = min(take, self.step.want, self.nsqd)
        self.nsqd -= n
        waited = self.step.timeout if n == 0 else min(dt, self.step.timeout)
        self.now += waited
        self.p.fetched(n, n * 10, self.now, self.step.timeout if n == 0 else waited, starved)
        self.ask()

    @precondition(lambda self: self.step is not None and self.step.action is Action.DRAIN)
    @rule(late=st.integers(0, 5))
    def drain(self, late: int) -> None:
        assert self.p is not None
        n = min(late, self.nsqd)  # what nsqd sent before it saw RDY 0
        self.nsqd -= n
        self.drains += 1
        self.p.drained(n, n * 10, self.now)
        self.ask()

    @precondition(lambda self: self.step is not None and self.step.action is Action.CUT)
    @rule()
    def cut(self) -> None:
        assert self.p is not None
        n, _ = self.p.cut()
        self.cut_sizes.append(n)
        self.last_cut_after_drain = self.p.paused
        self.ask()

    @precondition(lambda self: self.step is not None and self.step.action is Action.SETTLE)
    @rule()
    def settle(self) -> None:
        assert self.p is not None
        self.durable = max(self.durable, 1)  # the task blocks until the oldest is durable
        self.p.settled()
        self.durable -= 1
        self.ask()

    @precondition(lambda self: self.p is not None and bool(self.p.jobs))
    @rule()
    def a_writer_finishes(self) -> None:
        assert self.p is not None
        self.durable = min(len(self.p.jobs), self.durable + 1)

    @precondition(lambda self: self.step is not None and self.step.action is Action.FINISH)
    @rule()
    def finish(self) -> None:
        self.finished = True
        self.step = None

    @precondition(lambda self: self.finished)
    @rule()
    def finished_stays_finished(self) -> None:
        assert self.p is not None and self.p.next(self.now).action is Action.FINISH

    @invariant()
    def writers_stay_within_the_window(self) -> None:
        if self.p is not None:
            assert len(self.p.jobs) <= self.p.max_jobs

    @invariant()
    def chunks_hold_at_most_chunk_size_except_the_drained_last(self) -> None:
        if self.p is not None and self.cut_sizes:
            over = [n for n in self.cut_sizes if n > self.p.chunk_size]
            assert not over or (self.last_cut_after_drain and over == [self.cut_sizes[-1]])

    @invariant()
    def it_finishes_only_settled_drained_and_empty(self) -> None:
        if self.finished:
            assert self.p is not None
            assert not self.p.jobs and not self.p.pending and self.p.paused
            assert self.p.finished == self.p.taken == sum(self.cut_sizes)
            assert self.drains == 1

    @invariant()
    def waits_are_bounded(self) -> None:
        if self.step is not None and self.step.action is Action.FETCH:
            assert self.p is not None
            assert 0 <= self.step.timeout <= max(self.p.idle_wait(), 0.0)
            assert self.now + self.step.timeout <= self.p.deadline + 1e-9
            assert self.step.want > 0
            if self.p.pending:
                assert self.now + self.step.timeout \
                    <= self.p.first_at + self.p.flush_interval + 1e-9

    @invariant()
    def the_share_is_never_asked_beyond(self) -> None:
        if self.p is not None and self.p.share is not None and not self.p.paused:
            assert self.p.taken + self.p.pending <= self.p.share


TaskMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60,
                                         deadline=None)
TestTaskMachine = TaskMachine.TestCase
