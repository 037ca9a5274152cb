"""RdyPolicy: RDY distribution, the 25 % refresh rule, redistribution, is_starved, backoff
hooks, set_max_in_flight; plus a hypothesis state machine for the invariants."""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nsq_spark._consumer.rdy import BACKOFF, NORMAL, TESTING, ConnRdy, RdyPolicy, commands_by_key

pytestmark = pytest.mark.unit


def policy(mif: int, idle: float = 10.0, seed: int = 1) -> RdyPolicy:
    return RdyPolicy(mif, low_rdy_idle_timeout=idle, rng=random.Random(seed))


def rdys(p: RdyPolicy) -> dict:
    return {k: c.rdy for k, c in p.conns.items()}


# -- construction ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 1.5, "3", None, True])
def test_rejects_bad_max_in_flight(bad):
    with pytest.raises(ValueError, match="max_in_flight"):
        RdyPolicy(bad)


def test_rejects_negative_idle_timeout():
    with pytest.raises(ValueError, match="low_rdy_idle_timeout"):
        RdyPolicy(1, low_rdy_idle_timeout=-1)


def test_rejects_duplicate_connection_and_bad_max_rdy():
    p = policy(10)
    p.add("a")
    with pytest.raises(ValueError, match="already tracked"):
        p.add("a")
    with pytest.raises(ValueError, match="max_rdy_count"):
        p.add("b", max_rdy_count=0)


# -- new connections and the even spread -------------------------------------------------


def test_new_connection_starts_at_rdy_1_then_gets_its_share():
    p = policy(100)
    c, out = p.add("a", now=0)
    assert commands_by_key(out) == {"a": 1}
    out = p.on_messages(c, 1, now=1)
    assert commands_by_key(out) == {"a": 100}
    assert p.total_rdy == 100


def test_share_is_even_and_capped_by_max_rdy_count():
    p = policy(2500)
    a, _ = p.add("a", max_rdy_count=2500)
    p.on_messages(a, 1, 0)
    b, out = p.add("b", max_rdy_count=500)
    # a is trimmed to its new share before b gets RDY 1
    assert commands_by_key(out) == {"a": 1250, "b": 1}
    p.on_messages(b, 1, 0)
    assert rdys(p) == {"a": 1250, "b": 500}
    assert p.share(a) == 1250 and p.share(b) == 500


def test_sum_of_rdy_never_exceeds_max_in_flight_when_connections_join():
    p = policy(10)
    states = []
    for i in range(4):
        c, _ = p.add(i)
        states.append(c)
        for s in states:
            p.on_messages(s, 1, 0)
            assert p.total_rdy <= 10
    assert sorted(rdys(p).values()) == [1, 2, 2, 2] or sum(rdys(p).values()) <= 10
    assert all(v <= 2 for v in rdys(p).values())  # 10 // 4


def test_more_connections_than_max_in_flight_only_budget_gets_rdy():
    p = policy(2)
    for k in "abcd":
        p.add(k)
    assert sum(rdys(p).values()) == 2
    assert sorted(rdys(p).values()) == [0, 0, 1, 1]


def test_max_in_flight_zero_gives_no_rdy():
    p = policy(0)
    c, out = p.add("a")
    assert out == []
    assert p.on_messages(c, 1, 0) == [] or p.total_rdy == 0
    assert p.total_rdy == 0


# -- the 25 % refresh rule -----------------------------------------------------------------


def test_rdy_is_resent_when_remaining_falls_under_a_quarter():
    p = policy(100)
    c, _ = p.add("a")
    p.on_messages(c, 1, 0)  # -> RDY 100
    assert p.on_messages(c, 74, 0) is None  # 26 left
    assert p.on_messages(c, 1, 0) is None  # 25 left: at the 25 % mark, exactly
    out = p.on_messages(c, 1, 0)  # 24 left
    assert commands_by_key(out) == {"a": 100}
    assert c.remaining == 100


def test_in_flight_and_responses_are_counted():
    p = policy(100)
    c, _ = p.add("a")
    p.on_messages(c, 10, 0)
    assert c.in_flight == 10 and p.in_flight == 10
    p.on_responses(c, finished=7, requeued=2)
    assert (c.in_flight, c.finished, c.requeued) == (1, 7, 2)
    p.on_responses(c, finished=5)  # late responses never make it negative
    assert c.in_flight == 0


def test_rdy_zero_connection_is_not_refreshed_by_leftover_messages():
    p = policy(1)
    a, _ = p.add("a")
    b, _ = p.add("b")
    holder, other = (a, b) if a.rdy else (b, a)
    assert other.rdy == 0
    assert p.on_messages(other, 1, 0) is None  # in flight from before: no RDY for it
    assert other.rdy == 0


# -- is_starved ----------------------------------------------------------------------------


def test_is_starved_at_85_percent_of_rdy():
    p = policy(100)
    c, _ = p.add("a")
    p.on_messages(c, 1, 0)
    p.on_responses(c, finished=1)
    assert not p.is_starved()
    p.on_messages(c, 84, 0)
    assert not p.is_starved()
    p.on_messages(c, 1, 0)
    assert p.is_starved()  # 85 >= 0.85 * 100
    p.on_responses(c, finished=85)
    assert not p.is_starved()  # nothing in flight is never starved


def test_is_starved_and_in_flight_tolerate_connections_changing_meanwhile():
    """is_starved() runs on the caller's thread while the loop adds/removes connections:
    a connection added in the middle of the iteration must not raise RuntimeError
    (dictionary changed size during iteration). The loop thread's add is simulated by an
    entry whose in_flight read inserts another connection."""
    p = policy(100)
    p.add("a")

    class Racing:  # a ConnRdy look-alike whose read lets the "loop thread" run
        rdy = 10
        added = 0

        @property
        def in_flight(self) -> int:
            Racing.added += 1
            key = f"late{Racing.added}"
            p.conns[key] = ConnRdy(key)  # what add() does to the dict, on "the loop thread"
            return 0
    p.conns["racing"] = Racing()  # type: ignore[assignment]
    assert p.is_starved() is False
    assert p.in_flight == 0
    assert Racing.added == 2 and "late1" in p.conns and "late2" in p.conns


def test_is_starved_any_connection():
    p = policy(4)
    a, _ = p.add("a")
    b, _ = p.add("b")
    p.on_messages(a, 1, 0)
    p.on_messages(b, 1, 0)
    p.on_responses(a, finished=1)
    p.on_responses(b, finished=1)
    assert rdys(p) == {"a": 2, "b": 2}
    p.on_messages(b, 2, 0)
    assert p.is_starved()


# -- removal and rebalance -----------------------------------------------------------------


def test_removed_connection_returns_its_rdy_to_the_others():
    p = policy(100)
    a, _ = p.add("a")
    b, _ = p.add("b")
    p.on_messages(a, 1, 0)
    p.on_messages(b, 1, 0)
    assert rdys(p) == {"a": 50, "b": 50}
    out = p.remove("a")
    assert commands_by_key(out) == {"b": 100}
    assert p.total_rdy == 100
    assert p.remove("a") == []


# -- set_max_in_flight ---------------------------------------------------------------------


def test_set_max_in_flight_zero_pauses_and_back():
    p = policy(100)
    a, _ = p.add("a")
    b, _ = p.add("b")
    p.on_messages(a, 1, 0)
    p.on_messages(b, 1, 0)
    out = p.set_max_in_flight(0)
    assert commands_by_key(out) == {"a": 0, "b": 0}
    assert p.total_rdy == 0
    assert p.on_messages(a, 1, 0) is None  # a leftover message does not resume
    assert p.tick(100) == []
    out = p.set_max_in_flight(10)
    assert commands_by_key(out) == {"a": 5, "b": 5}


def test_set_max_in_flight_lower_than_connections_keeps_a_subset():
    p = policy(90)
    for k in "abc":
        c, _ = p.add(k)
        p.on_messages(c, 1, 0)
    assert rdys(p) == {"a": 30, "b": 30, "c": 30}
    out = p.set_max_in_flight(2)
    final = commands_by_key(out)
    assert all(v <= 1 for v in final.values())
    assert sum(rdys(p).values()) == 2
    # lowering commands come before any raise: replaying them never exceeds 90 nor ends > 2
    running = {"a": 30, "b": 30, "c": 30}
    for c, v in out:
        running[c.key] = v
        assert sum(running.values()) <= 90
    assert sum(running.values()) == 2


def test_set_max_in_flight_higher_raises_shares():
    p = policy(10)
    a, _ = p.add("a")
    p.on_messages(a, 1, 0)
    out = p.set_max_in_flight(1000)
    assert commands_by_key(out) == {"a": 1000}
    with pytest.raises(ValueError):
        p.set_max_in_flight(-1)


# -- low-RDY redistribution ----------------------------------------------------------------


def test_tick_moves_rdy_from_idle_to_waiting_connections():
    p = policy(1, idle=10)
    a, _ = p.add("a", now=0)
    b, _ = p.add("b", now=0)
    holder, waiting = (a, b) if a.rdy else (b, a)
    assert (holder.rdy, waiting.rdy) == (1, 0)
    # before the idle timeout, while the holder delivers and answers, nothing moves...
    p.on_messages(holder, 1, 5)
    p.on_responses(holder, finished=1)
    out = p.tick(6)
    # ...except the rotation rule: budget is all held and someone waits -> the holder
    # gives its RDY up (it had nothing in flight, so the waiting one gets it now)
    assert commands_by_key(out) == {holder.key: 0, waiting.key: 1}
    assert p.total_rdy == 1


def test_tick_idle_holder_gives_up_rdy():
    p = policy(1, idle=10)
    a, _ = p.add("a", now=0)
    b, _ = p.add("b", now=0)
    holder, waiting = (a, b) if a.rdy else (b, a)
    out = p.tick(20)  # holder idle for 20 s > 10 s
    assert commands_by_key(out) == {holder.key: 0, waiting.key: 1}
    assert waiting.last_msg_at == 20  # its idle clock starts with its RDY


def test_tick_busy_holder_with_in_flight_frees_slot_next_tick():
    p = policy(1, idle=10)
    a, _ = p.add("a", now=0)
    b, _ = p.add("b", now=0)
    holder, waiting = (a, b) if a.rdy else (b, a)
    p.on_messages(holder, 1, 1)  # one in flight, not answered
    out = p.tick(2)
    assert commands_by_key(out) == {holder.key: 0}  # slot still occupied by its in-flight
    assert waiting.rdy == 0
    assert p.tick(3) == []
    p.on_responses(holder, finished=1)
    out = p.tick(4)
    assert commands_by_key(out) == {waiting.key: 1}


def test_every_connection_gets_a_turn_eventually():
    p = policy(2, idle=10, seed=7)
    states = [p.add(i, now=0)[0] for i in range(6)]
    served = set()
    for t in range(1, 60):
        for c in states:  # every nsqd is busy: holders always receive and answer
            if c.rdy:
                served.add(c.key)
                p.on_messages(c, 1, t)
                p.on_responses(c, finished=1)
        p.tick(t)
        assert p.total_rdy <= 2
    assert served == set(range(6))


def test_tick_with_enough_budget_heals_connections_left_at_zero():
    p = policy(10)
    a, _ = p.add("a")
    p.on_messages(a, 1, 0)
    # simulate a truncated RDY: force b to 0 although there is budget
    b, _ = p.add("b")
    p._send(b, 0, [])
    a_share = p.share(a)
    out = p.tick(1)
    assert commands_by_key(out).get("b") == p.share(b)
    assert a.rdy == a_share


# -- low_rdy_timeout: go-nsq's LowRdyTimeout -------------------------------------------------


def held_policy(mif: int, timeout: float, seed: int = 0) -> RdyPolicy:
    return RdyPolicy(mif, low_rdy_idle_timeout=10, rng=random.Random(seed),
                     low_rdy_timeout=timeout)


def busy(p: RdyPolicy, t: float) -> None:
    """Every holder receives a message at ``t`` and answers it: nobody is ever idle."""
    for c in list(p.conns.values()):
        if c.rdy:
            p.on_messages(c, 1, t)
            p.on_responses(c, finished=1)


def test_low_rdy_timeout_busy_holder_keeps_rdy_until_the_timeout_then_gives_it_up():
    p = held_policy(1, timeout=30)
    a, _ = p.add("a", now=0)
    b, _ = p.add("b", now=0)
    holder, waiting = (a, b) if a.rdy else (b, a)
    for t in range(1, 31):  # busy for 30 s: no random rotation with low_rdy_timeout
        busy(p, t)
        assert p.tick(t) == [], t
    # first seen holding at t=1: held 30 s at t=31 is not more than 30; 31 s at t=32 is
    busy(p, 31)
    assert p.tick(31) == []
    busy(p, 32)
    # nothing in flight on the holder: the slot is free at once, the waiting one gets it
    assert commands_by_key(p.tick(32)) == {holder.key: 0, waiting.key: 1}
    assert waiting.rdy_since == 32 and holder.rdy_since is None
    busy(p, 33)
    assert p.tick(33) == []  # the one that gave up waits: no ping-pong


def test_low_rdy_timeout_counts_from_the_tick_that_gave_rdy_and_not_from_refreshes():
    p = held_policy(1, timeout=5)
    a, _ = p.add("a", now=0)
    b, _ = p.add("b", now=0)
    holder, waiting = (a, b) if a.rdy else (b, a)
    p.tick(0.5)  # stamps the holder (RDY came from add, not from a tick)
    for t in range(1, 6):
        busy(p, t)  # on_messages refreshes RDY 1 every message in this regime
        assert p.tick(t) == []
    busy(p, 6)
    assert commands_by_key(p.tick(6)) == {holder.key: 0, waiting.key: 1}
    for t in range(7, 12):
        busy(p, t)
        assert p.tick(t) == []
    busy(p, 12)  # given at 6, held 6 s > 5: back to the first
    assert commands_by_key(p.tick(12)) == {waiting.key: 0, holder.key: 1}


def test_low_rdy_timeout_gives_every_busy_connection_turns_in_order():
    p = held_policy(2, timeout=3, seed=5)
    conns = [p.add(i, now=0)[0] for i in range(6)]
    served: list[set] = []
    for t in range(1, 61):
        busy(p, t)
        p.tick(t)
        assert p.total_rdy <= 2
        served.append({c.key for c in conns if c.rdy})
    assert set().union(*served) == set(range(6))
    # nobody holds RDY for more than low_rdy_timeout plus two rounds (stamp, give up)
    for c in conns:
        run = longest = 0
        for holders in served:
            run = run + 1 if c.key in holders else 0
            longest = max(longest, run)
        assert longest <= 3 + 2, (c.key, longest)


def test_low_rdy_timeout_plays_no_part_when_there_is_rdy_for_everyone():
    p = held_policy(10, timeout=1)
    a, _ = p.add("a", now=0)
    b, _ = p.add("b", now=0)
    for t in range(1, 20):
        busy(p, t)
        p.tick(t)
    assert (a.rdy, b.rdy) == (5, 5)


def test_default_rule_without_low_rdy_timeout_still_rotates_at_random():
    p = policy(1, idle=10)
    assert p.low_rdy_timeout is None
    a, _ = p.add("a", now=0)
    b, _ = p.add("b", now=0)
    holder, waiting = (a, b) if a.rdy else (b, a)
    busy(p, 1)
    assert commands_by_key(p.tick(1)) == {holder.key: 0, waiting.key: 1}


@pytest.mark.parametrize("bad", [0, -1])
def test_rejects_a_low_rdy_timeout_that_is_not_positive(bad):
    with pytest.raises(ValueError, match="low_rdy_timeout"):
        RdyPolicy(1, low_rdy_timeout=bad)


# -- backoff hooks -------------------------------------------------------------------------


def test_backoff_cycle():
    p = policy(100, seed=3)
    a, _ = p.add("a")
    b, _ = p.add("b")
    p.on_messages(a, 1, 0)
    p.on_messages(b, 1, 0)
    out = p.enter_backoff()
    assert p.mode is BACKOFF and commands_by_key(out) == {"a": 0, "b": 0}
    assert p.on_messages(a, 5, 0) is None  # no refresh inside a window
    assert p.tick(100) == []
    c, out = p.add("c")
    assert out == []  # a new connection gets nothing inside a window
    out = p.test_waters()
    assert p.mode is TESTING and len(out) == 1 and out[0][1] == 1
    assert p.total_rdy == 1
    assert p.test_waters() == []  # somebody is already testing
    tester = out[0][0]
    assert p.on_messages(tester, 1, 0) is None  # testing: RDY stays 1
    out = p.exit_backoff()
    assert p.mode is NORMAL
    assert rdys(p) == {"a": 33, "b": 33, "c": 33}


def test_testing_new_connection_tests_if_nobody_does():
    p = policy(10)
    p.enter_backoff()
    p.test_waters()  # no connection yet
    c, out = p.add("a")
    assert commands_by_key(out) == {"a": 1}
    d, out = p.add("b")
    assert out == []


def test_testing_rdy_moves_between_connections():
    p = policy(10, idle=1, seed=5)
    states = [p.add(i, now=0)[0] for i in range(3)]
    p.enter_backoff()
    p.test_waters()
    seen = set()
    for t in range(2, 40, 2):
        p.tick(t)
        assert p.total_rdy <= 1
        seen |= {c.key for c in states if c.rdy}
    assert seen == {0, 1, 2}


def test_testing_survivor_tests_when_the_tester_closes():
    # the only connection with RDY 1 closes while testing the waters: the one left must
    # test instead (tick used to "heal" only in normal mode, so it waited forever)
    p = policy(10, seed=2)
    a, _ = p.add("a")
    b, _ = p.add("b")
    p.enter_backoff()
    tester = p.test_waters()[0][0]
    survivor = b if tester is a else a
    out = p.remove(tester.key)
    assert commands_by_key(out) == {survivor.key: 1}
    assert p.total_rdy == 1 and p.mode is TESTING
    assert p.tick(1000) == []  # and no more than one


def test_testing_tick_gives_rdy_1_back_to_a_lone_connection():
    p = policy(10)
    a, _ = p.add("a")
    p.enter_backoff()
    p.set_max_in_flight(0)
    p.test_waters()
    assert p.total_rdy == 0
    out = p.set_max_in_flight(10)  # resumed while testing the waters
    assert commands_by_key(out) == {"a": 1} and p.total_rdy == 1


# -- invariants under random event sequences -----------------------------------------------


class RdyMachine(RuleBasedStateMachine):
    LOW_RDY_TIMEOUT: float | None = None
    IDLE = 2.0

    def __init__(self) -> None:
        super().__init__()
        self.p = RdyPolicy(5, low_rdy_idle_timeout=self.IDLE, rng=random.Random(0),
                           low_rdy_timeout=self.LOW_RDY_TIMEOUT)
        self.now = 0.0
        self.next_key = 0
        self.wire: dict = {}  # what nsqd was last told, per connection
        self.prev_cap = self.p.cap()

    def apply(self, out):
        """Replay commands on the wire: while they are applied the sum never exceeds the
        larger of the budgets before and after; once applied, it is within the new one."""
        bound = max(self.prev_cap, self.p.cap())
        for c, v in out or ():
            assert v >= 0
            self.wire[c.key] = v
            assert self.wire_sum() <= bound
        assert self.wire_sum() <= self.p.cap()
        self.prev_cap = self.p.cap()

    def wire_sum(self):
        return sum(v for k, v in self.wire.items() if k in self.p.conns)

    @rule(max_rdy=st.integers(1, 10))
    def add(self, max_rdy):
        if len(self.p.conns) >= 8:
            return
        k = self.next_key
        self.next_key += 1
        _, out = self.p.add(k, max_rdy_count=max_rdy, now=self.now)
        self.apply(out)

    @precondition(lambda self: self.p.conns)
    @rule(data=st.data())
    def remove(self, data):
        k = data.draw(st.sampled_from(sorted(self.p.conns)))
        self.wire.pop(k, None)
        self.apply(self.p.remove(k))

    @precondition(lambda self: self.p.conns)
    @rule(data=st.data(), n=st.integers(1, 5))
    def messages(self, data, n):
        k = data.draw(st.sampled_from(sorted(self.p.conns)))
        c = self.p.conns[k]
        n = min(n, max(c.rdy - c.in_flight, 0))  # nsqd never exceeds RDY in flight
        if n:
            self.apply(self.p.on_messages(c, n, self.now))

    @precondition(lambda self: self.p.conns)
    @rule(data=st.data())
    def respond(self, data):
        k = data.draw(st.sampled_from(sorted(self.p.conns)))
        c = self.p.conns[k]
        self.p.on_responses(c, finished=c.in_flight)

    @rule(dt=st.floats(0, 5))
    def tick(self, dt):
        self.now += dt
        self.apply(self.p.tick(self.now))

    @rule(n=st.integers(0, 12))
    def set_mif(self, n):
        self.apply(self.p.set_max_in_flight(n))

    @rule()
    def enter_backoff(self):
        self.apply(self.p.enter_backoff())

    @rule()
    def test_waters(self):
        if self.p.mode is not NORMAL:
            self.apply(self.p.test_waters())

    @rule()
    def exit_backoff(self):
        self.apply(self.p.exit_backoff())

    @invariant()
    def budget(self):
        p = self.p
        assert p.total_rdy == sum(c.rdy for c in p.conns.values())
        assert p.total_rdy <= p.cap()
        for c in p.conns.values():
            assert 0 <= c.rdy <= c.max_rdy_count
            assert c.in_flight >= 0

    @invariant()
    def normal_mode_gives_everyone_rdy_when_budget_allows(self):
        p = self.p
        if p.mode is NORMAL and p.max_in_flight >= len(p.conns):
            # after a tick at the latest; check the tick would fix it and then holds
            self.apply(p.tick(self.now))
            assert all(c.rdy >= 1 for c in p.conns.values())

    @invariant()
    def testing_mode_always_has_a_tester(self):
        p = self.p
        if p.mode is TESTING and p.max_in_flight and p.conns:
            self.apply(p.tick(self.now))
            assert p.total_rdy == 1 or any(c.in_flight for c in p.conns.values())


RdyMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestRdyMachine = RdyMachine.TestCase


class HeldRdyMachine(RdyMachine):
    """The same invariants under go-nsq's rule, plus its own: in the low-RDY regime no
    connection is seen holding RDY at a tick more than ``low_rdy_timeout`` after the tick
    that first saw it hold."""
    LOW_RDY_TIMEOUT = 3.0
    IDLE = 1000.0  # nobody gives up for idleness: only the rule under test moves RDY

    @invariant()
    def nobody_holds_rdy_past_low_rdy_timeout_at_a_tick(self):
        p = self.p
        if p.mode is BACKOFF or not p.max_in_flight or len(p.conns) <= p.cap():
            return
        self.now += 1.0
        self.apply(p.tick(self.now))
        for c in p.conns.values():
            if c.rdy:  # every holder is stamped by a tick, and not older than the timeout
                assert c.rdy_since is not None and self.now - c.rdy_since <= 3.0


HeldRdyMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40,
                                            deadline=None)
TestHeldRdyMachine = HeldRdyMachine.TestCase


def test_the_old_import_path_still_gives_the_same_objects():
    """nsq_spark.rdy is a re-export shim for users (the policy moved into consumer/, the
    read-side credit beside conn.py)."""
    import nsq_spark._rdy_credit as credit
    import nsq_spark._consumer.rdy as policy
    import nsq_spark.rdy as old

    for name in ("ConnRdy", "RdyPolicy", "NORMAL", "BACKOFF", "TESTING", "STARVED_RATIO",
                 "commands_by_key"):
        assert getattr(old, name) is getattr(policy, name), name
    assert old.RdyCredit is credit.RdyCredit and old.RDY_LOWER_GRACE == credit.RDY_LOWER_GRACE
    assert set(old.__all__) == set(policy.__all__) | set(credit.__all__)
