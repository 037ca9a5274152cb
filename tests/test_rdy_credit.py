"""RdyCredit: what nsqd may send, given the RDY sent and the answers given; no sockets.

The rules as examples, then two properties: against a model of a correct nsqd (RDY and
answers reach it late, messages reach us late, messages time out) the credit never
refuses a chunk; against a server that ignores RDY, what it gets past the check is bounded
by the largest RDY of the grace period plus the timeout allowance."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nsq_spark._rdy_credit import RDY_LOWER_GRACE, RdyCredit

pytestmark = pytest.mark.unit


def test_messages_up_to_rdy_fit_and_one_more_is_refused_with_the_counts():
    c = RdyCredit(msg_timeout=60)
    c.on_rdy(10, 0.0)
    assert c.arrive(6, 1.0) is None
    assert c.arrive(4, 1.0) is None
    why = c.arrive(1, 1.0)
    assert why is not None
    assert "11 messages received and unanswered" in why and "11 received, 0 answered" in why
    assert "credit of 10 (RDY 10)" in why and "ignores RDY" in why
    assert c.received == 10  # a refused chunk is not counted


def test_answers_return_credit():
    c = RdyCredit()
    c.on_rdy(5, 0.0)
    assert c.arrive(5, 0.0) is None
    c.answered += 3
    assert c.arrive(3, 0.1) is None
    assert c.arrive(1, 0.1) is not None


def test_nothing_may_arrive_before_the_first_rdy():
    assert RdyCredit().arrive(1, 0.0) is not None


def test_a_lowered_rdy_allows_the_previous_value_for_the_grace_period():
    c = RdyCredit(msg_timeout=600, grace=5)
    c.on_rdy(100, 0.0)
    c.on_rdy(0, 1.0)  # closing: RDY 0, but nsqd may have filled RDY 100 before it read it
    assert c.rdy_limit(2.0) == 100
    assert c.arrive(100, 2.0) is None
    why = c.arrive(1, 2.0)
    assert why is not None and "100 until nsqd applies the lowered RDY" in why
    c.answered += 100
    assert c.rdy_limit(6.5) == 0  # grace over: RDY 0 is RDY 0
    assert c.arrive(1, 6.5) is not None


def test_raising_rdy_again_keeps_nothing_extra():
    c = RdyCredit(grace=5)
    c.on_rdy(10, 0.0)
    c.on_rdy(2, 0.0)
    c.on_rdy(20, 0.0)
    assert c.rdy_limit(1.0) == 20 and c.credit(1.0) == 20


def test_a_resent_rdy_does_not_extend_the_grace_of_an_earlier_lowering():
    # a consumer resends RDY often: each lowering holds the previous value for the grace
    # period from that lowering only, so RDY 50 is not allowed forever
    c = RdyCredit(msg_timeout=600, grace=2)
    for step, count in enumerate([50, 10, 5] + [3, 4] * 5 + [3]):
        c.on_rdy(count, step * 1.9)
    assert c.rdy == 3  # sent at 24.7, lowering 4
    assert c.rdy_limit(24.7) == 4  # the value this last lowering replaced, nothing older
    assert c.rdy_limit(26.8) == 3


def test_each_held_value_expires_on_its_own_lowerings_clock():
    c = RdyCredit(msg_timeout=600, grace=2)
    c.on_rdy(50, 0.0)
    c.on_rdy(10, 1.0)  # holds 50 until 3.0
    c.on_rdy(5, 2.0)  # holds 10 until 4.0
    c.on_rdy(7, 2.5)  # a raise: holds nothing, extends nothing
    assert c.rdy_limit(3.0) == 50
    assert c.rdy_limit(3.5) == 10
    assert c.rdy_limit(4.5) == 7


def test_messages_held_past_half_the_timeout_allow_their_redelivery():
    # a puller holds 10 messages past msg_timeout: nsqd times them out and sends 10 more
    c = RdyCredit(msg_timeout=60)
    c.on_rdy(10, 0.0)
    assert c.arrive(10, 1.0) is None
    assert c.arrive(10, 25.0) is not None  # not within half a timeout: none timed out
    # from the next window of msg_timeout / 2 on, the previous window's largest count may
    # have timed out (early by up to half a timeout: the rule errs on the side of allowing)
    assert c.arrive(10, 31.0) is None
    why = c.arrive(1, 31.0)
    assert why is not None and "plus 10 that may have timed out" in why


def test_bad_arguments():
    with pytest.raises(ValueError, match="msg_timeout"):
        RdyCredit(msg_timeout=0)
    with pytest.raises(ValueError, match="grace"):
        RdyCredit(grace=-1)


def test_the_default_grace_is_generous():
    # only restates the constant's intent; the grace *rule* is checked by the examples
    # above and the properties below
    assert RDY_LOWER_GRACE >= 30


# -- properties ----------------------------------------------------------------------------

rdy_steps = st.lists(st.tuples(st.floats(0.0, 3.0), st.integers(0, 60)), max_size=40)


@given(steps=rdy_steps, probe=st.floats(0.0, 3.0))
def test_the_rdy_limit_is_the_last_rdy_or_a_value_lowered_within_the_grace(steps, probe):
    # the rule written from its definition: every lowering keeps the value it replaced
    # for GRACE seconds after that lowering, whatever RDYs follow
    c = RdyCredit(msg_timeout=600, grace=GRACE)
    now, last, lowerings = 0.0, 0, []
    for dt, count in steps:
        now += dt
        c.on_rdy(count, now)
        if count < last:
            lowerings.append((last, now))
        last = count
    at = now + probe
    expected = max([last] + [value for value, t in lowerings if at <= t + GRACE])
    assert c.rdy_limit(at) == expected


@given(high=st.integers(2, 100), steps=rdy_steps, after=st.floats(0.001, 5.0))
def test_a_held_value_expires_grace_seconds_after_its_own_lowering(high, steps, after):
    c = RdyCredit(msg_timeout=600, grace=GRACE)
    c.on_rdy(high, 0.0)
    c.on_rdy(0, 0.0)  # the lowering that holds `high`
    now = 0.0
    for dt, count in steps:  # any RDYs below it, as often as they like
        now = min(now + dt, GRACE)
        c.on_rdy(count % high, now)
    assert c.rdy_limit(GRACE) == high
    assert c.rdy_limit(GRACE + after) < high


TIMEOUT = 10.0  # msg_timeout of the model, seconds
GRACE = 2.0


class CorrectNsqd(RuleBasedStateMachine):
    """A correct nsqd and a client, with both directions of the wire in between. Time only
    advances while every RDY on its way is younger than half the grace period and every
    message on its way younger than the other half and than half the timeout (the
    assumptions of the rule)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.credit = RdyCredit(msg_timeout=TIMEOUT, grace=GRACE)
        self.to_server: deque[tuple[str, int, float]] = deque()  # (RDY|FIN, arg, sent at)
        self.to_client: deque[tuple[int, float]] = deque()  # (id, sent at)
        self.ready = 0  # nsqd's RDY
        self.in_flight: dict[int, float] = {}  # nsqd's: id -> sent at
        self.held: list[int] = []  # the client's unanswered ids
        self.next_id = 0

    @rule(n=st.integers(0, 20))
    def client_sends_rdy(self, n: int) -> None:
        self.credit.on_rdy(n, self.now)
        self.to_server.append(("RDY", n, self.now))

    @rule(k=st.integers(1, 20), newest=st.booleans())
    def client_answers(self, k: int, newest: bool) -> None:
        k = min(k, len(self.held))
        picked = self.held[-k:] if newest else self.held[:k]
        self.held = self.held[:-k] if newest else self.held[k:]
        if k:
            self.credit.answered += k
        for i in picked:
            self.to_server.append(("FIN", i, self.now))

    @precondition(lambda self: bool(self.to_server))
    @rule()
    def server_reads_a_command(self) -> None:
        kind, arg, _ = self.to_server.popleft()
        if kind == "RDY":
            self.ready = arg
        else:
            self.in_flight.pop(arg, None)  # E_FIN_FAILED if it had timed out

    @precondition(lambda self: bool(self.to_server))
    @rule()
    def server_reads_everything(self) -> None:
        while self.to_server:
            self.server_reads_a_command()

    @rule(n=st.integers(1, 30))
    def server_sends(self, n: int) -> None:
        for _ in range(n):
            if len(self.in_flight) >= self.ready:
                return
            self.in_flight[self.next_id] = self.now
            self.to_client.append((self.next_id, self.now))
            self.next_id += 1

    @rule()
    def server_times_out(self) -> None:
        for i, sent in list(self.in_flight.items()):
            if self.now - sent >= TIMEOUT:
                del self.in_flight[i]

    @precondition(lambda self: bool(self.to_client))
    @rule(n=st.integers(1, 40))
    def client_reads_a_chunk(self, n: int) -> None:
        chunk = [self.to_client.popleft() for _ in range(min(n, len(self.to_client)))]
        assert self.credit.arrive(len(chunk), self.now) is None, (self.credit.unanswered,
                                                                   len(chunk), self.ready)
        self.held.extend(i for i, _ in chunk)

    @rule(dt=st.one_of(st.floats(0.01, 1.0), st.floats(1.0, TIMEOUT)))
    def time_passes(self, dt: float) -> None:
        later = self.now + dt
        if any(kind == "RDY" and later - at >= GRACE / 2 for kind, _, at in self.to_server):
            return  # nsqd reads RDY within half the grace period ...
        if self.to_client and later - self.to_client[0][1] >= min(TIMEOUT, GRACE) / 2:
            return  # ... and a message crosses the wire within the other half (and within
            # half the timeout)
        self.now = later

    @invariant()
    def unanswered_is_counted(self) -> None:
        assert self.credit.unanswered == len(self.held)


CorrectNsqd.TestCase.settings = settings(max_examples=400, stateful_step_count=40,
                                         deadline=None)
test_a_correct_nsqd_is_never_refused = CorrectNsqd.TestCase


class IgnoresRdy(RuleBasedStateMachine):
    """A server that sends whatever it likes: what passes the check stays within the
    largest RDY of the grace period plus the previous window's largest unanswered count."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.credit = RdyCredit(msg_timeout=TIMEOUT, grace=GRACE)
        self.rdys: list[tuple[float, int]] = []

    @rule(n=st.integers(0, 50))
    def rdy(self, n: int) -> None:
        self.credit.on_rdy(n, self.now)
        self.rdys.append((self.now, n))

    @rule(k=st.integers(0, 30))
    def answer(self, k: int) -> None:
        self.credit.answered += min(k, self.credit.unanswered)

    @rule(n=st.integers(1, 200))
    def flood(self, n: int) -> None:
        before = self.credit.unanswered
        if self.credit.arrive(n, self.now) is None:
            # every RDY in effect at some time of the last GRACE seconds
            since = self.now - GRACE
            before_window = [r for t, r in self.rdys if t < since][-1:]
            recent = max([r for t, r in self.rdys if t >= since] + before_window, default=0)
            assert self.credit.unanswered == before + n
            assert self.credit.unanswered <= recent + self.credit._prev_max
        else:
            assert self.credit.unanswered == before

    @rule(dt=st.floats(0.01, 8.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def timeout_allowance_is_what_was_allowed_before(self) -> None:
        # the allowance of a window is at most what the previous windows allowed
        assert self.credit._prev_max <= max([r for _, r in self.rdys], default=0) * max(
            1, int(self.now // (TIMEOUT / 2)) + 1)


IgnoresRdy.TestCase.settings = settings(max_examples=100, stateful_step_count=50,
                                        deadline=None)
test_a_server_that_ignores_rdy_gets_no_more_than_the_credit = IgnoresRdy.TestCase
