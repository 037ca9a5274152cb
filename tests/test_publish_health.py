"""NsqdHealth, the one place for the strategy order and each nsqd's backoff (both TCP pools
ask it): orders, turns, backoffs and up/down transitions, with a fake clock, no sockets."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark._publish.health import NsqdHealth
from nsq_spark._publish.stats import PublishStats

pytestmark = pytest.mark.unit

ADDRS = ["a:1", "b:2", "c:3"]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(strategy: str = "round_robin", addrs: list[str] = ADDRS, wait: float = 0.1,
         max_wait: float = 2.0) -> tuple[NsqdHealth, Clock, PublishStats]:
    clock = Clock()
    stats = PublishStats(logging.getLogger("test.health"))
    return NsqdHealth(addrs, strategy, retry_wait=wait, retry_max_wait=max_wait,
                      stats=stats, clock=clock), clock, stats


def test_failover_always_starts_with_the_first_configured_nsqd() -> None:
    h, _, _ = make("failover")
    assert [h.order() for _ in range(4)] == [ADDRS] * 4
    assert [h.choose(["x", "y"]) for _ in range(3)] == ["x", "x", "x"]


def test_round_robin_starts_each_call_one_nsqd_further() -> None:
    h, _, _ = make()
    firsts = [h.order()[0] for _ in range(6)]
    assert firsts == ADDRS * 2
    assert sorted(h.order()) == sorted(ADDRS)   # a rotation, nothing lost


def test_round_robin_chooses_the_live_connections_in_turn() -> None:
    h, _, _ = make()
    assert [h.choose(["x", "y"]) for _ in range(4)] == ["x", "y", "x", "y"]
    assert h.choose(["only"]) == "only"


def test_a_failed_connect_backs_off_exponentially_up_to_the_cap() -> None:
    h, clock, stats = make(wait=0.1, max_wait=0.5)
    exc = ConnectionRefusedError("refused")
    waits = []
    for _ in range(4):
        h.connect_failed("a:1", exc)
        start = clock.now
        while h.backing_off("a:1"):
            clock.now += 0.01
        waits.append(round(clock.now - start, 2))
    assert waits == [0.2, 0.4, 0.5, 0.5]
    assert stats.is_up("a:1") is False


def test_a_connect_ends_the_backoff_and_the_count() -> None:
    h, clock, stats = make(wait=0.1, max_wait=10)
    for _ in range(3):
        h.connect_failed("a:1", ConnectionRefusedError())
    h.connected("a:1")
    assert not h.backing_off("a:1") and stats.is_up("a:1") is True
    h.connect_failed("a:1", ConnectionRefusedError())   # counts from one again
    clock.now += 0.21
    assert not h.backing_off("a:1")


def test_a_lost_connection_is_skipped_for_retry_wait() -> None:
    h, clock, stats = make(wait=0.3)
    h.connection_lost("b:2", ConnectionResetError("reset"))
    assert h.candidates() == ["a:1", "c:3"] and stats.is_up("b:2") is False
    clock.now += 0.31
    assert h.candidates() == ADDRS


def test_when_every_nsqd_backs_off_all_are_tried_anyway() -> None:
    h, _, _ = make()
    for a in ADDRS:
        h.connect_failed(a, ConnectionRefusedError())
    assert h.candidates() == ADDRS
    assert h.candidates(["c:3", "a:1"]) == ["c:3", "a:1"]   # in the order asked for


def test_a_connect_refused_while_closing_is_not_reported() -> None:
    h, _, stats = make()
    h.connect_failed("a:1", ConnectionRefusedError(), report=False)
    assert stats.is_up("a:1") is None and h.backing_off("a:1")


def test_down_and_up_are_logged_once_each(caplog: pytest.LogCaptureFixture) -> None:
    h, _, _ = make()
    with caplog.at_level(logging.INFO, logger="test.health"):
        for _ in range(3):
            h.connect_failed("a:1", ConnectionRefusedError("refused"))
            h.connection_lost("a:1", ConnectionResetError("reset"))
        h.connected("a:1")
        h.connected("a:1")
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]


def test_forget_starts_over() -> None:
    h, _, _ = make()
    h.connect_failed("a:1", ConnectionRefusedError())
    h.forget()
    assert not h.backing_off("a:1")


EVENTS = st.lists(st.tuples(st.sampled_from(["fail", "lost", "up", "tick"]),
                            st.sampled_from(ADDRS), st.floats(0, 1)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(EVENTS, st.sampled_from(["round_robin", "failover"]))
def test_candidates_are_the_nsqd_not_backing_off_in_the_order_asked(
        events: list[tuple[str, str, float]], strategy: str) -> None:
    """A model of the rule: each nsqd's 'skip until' time, n failures in a row."""
    h, clock, _ = make(strategy, wait=0.1, max_wait=0.5)
    until = {a: 0.0 for a in ADDRS}
    fails = {a: 0 for a in ADDRS}
    for kind, addr, dt in events:
        if kind == "fail":
            fails[addr] += 1
            until[addr] = clock.now + min(0.5, 0.1 * 2 ** fails[addr])
            h.connect_failed(addr, ConnectionRefusedError())
        elif kind == "lost":
            until[addr] = clock.now + 0.1
            h.connection_lost(addr, ConnectionResetError())
        elif kind == "up":
            fails[addr] = 0
            until[addr] = 0.0
            h.connected(addr)
        else:
            clock.now += dt
        order = h.order()
        assert sorted(order) == sorted(ADDRS)
        if strategy == "failover":
            assert order == ADDRS
        want = [a for a in order if until[a] <= clock.now] or order
        assert h.candidates(order) == want
