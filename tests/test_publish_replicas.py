"""The replica planner (nsq_spark._publish.replicas), sans-IO: which nsqds get a message's
copies, substitution, spreading, and the quorum arithmetic. Property tests drive plans
with arbitrary answers; no sockets."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark._publish.replicas import ReplicaChooser, ReplicaPlan, default_quorum

pytestmark = pytest.mark.unit


def addrs(k: int) -> list[str]:
    return [f"127.0.0.1:{4150 + 10 * i}" for i in range(k)]


def all_up(_: str) -> bool:
    return True


@st.composite
def shapes(draw: st.DrawFn) -> tuple[int, int, int]:
    k = draw(st.integers(1, 7))
    n = draw(st.integers(1, k))
    w = draw(st.integers(1, n))
    return k, n, w


def drive(plan: ReplicaPlan, ok: dict[str, bool]) -> list[str]:
    """Answer every send as ``ok`` says (a failure gets its substitute sent); the sends."""
    sent: list[str] = []
    queue = plan.start()
    while queue:
        target = queue.pop(0)
        sent.append(target)
        if ok[target]:
            plan.acked(target)
        else:
            sub = plan.failed(target)
            if sub is not None:
                queue.append(sub)
    return sent


# -- choosing ------------------------------------------------------------------------------

@given(shapes(), st.data())
def test_a_plan_starts_on_n_distinct_nsqds_and_never_on_a_holder(shape, data):
    k, n, w = shape
    a = addrs(k)
    have = frozenset(data.draw(st.sets(st.sampled_from(a), max_size=n)))
    healthy = set(data.draw(st.sets(st.sampled_from(a))))
    plan = ReplicaChooser(a, n, w).plan(lambda x: x in healthy, have)
    targets = plan.start()
    assert len(targets) == len(set(targets)) == n - len(have)
    assert not set(targets) & have


@given(shapes(), st.data())
def test_healthy_nsqds_are_chosen_before_unhealthy_ones(shape, data):
    k, n, w = shape
    a = addrs(k)
    healthy = set(data.draw(st.sets(st.sampled_from(a))))
    targets = ReplicaChooser(a, n, w).plan(lambda x: x in healthy).start()
    assert len(set(targets) & healthy) == min(n, len(healthy))


@given(shapes(), st.integers(1, 5))
def test_with_every_nsqd_healthy_the_copies_spread_evenly(shape, rounds):
    k, n, w = shape
    chooser = ReplicaChooser(addrs(k), n, w)
    held: Counter[str] = Counter()
    first: Counter[str] = Counter()
    for _ in range(rounds * k):
        targets = chooser.plan(all_up).start()
        first[targets[0]] += 1
        held.update(targets)
    assert set(first.values()) == {rounds}            # each nsqd first 1/K of the time
    assert set(held.values()) == {rounds * n}          # and holds N/K of the messages


def test_the_first_replica_rotates_over_the_healthy_nsqds_only():
    a = addrs(4)
    down = {a[1]}
    chooser = ReplicaChooser(a, 2, 1)
    starts = [chooser.plan(lambda x: x not in down).start() for _ in range(6)]
    assert [s[0] for s in starts] == [a[0], a[2], a[3], a[0], a[2], a[3]]
    assert all(a[1] not in s for s in starts)          # substituted by the next healthy one
    assert starts[2] == [a[3], a[0]]                   # wrapping around


def test_with_no_healthy_nsqd_every_one_is_still_tried():
    a = addrs(3)
    plan = ReplicaChooser(a, 2, 1).plan(lambda _: False)
    assert len(plan.start()) == 2                       # a caller is waiting: try anyway


# -- substitution and the quorum -------------------------------------------------------------

@given(shapes(), st.data())
def test_driven_with_any_answers_no_nsqd_gets_a_message_twice_and_the_counts_add_up(
        shape, data):
    k, n, w = shape
    a = addrs(k)
    have = frozenset(data.draw(st.sets(st.sampled_from(a), max_size=n)))
    ok = {x: data.draw(st.booleans()) for x in a}
    plan = ReplicaChooser(a, n, w).plan(all_up, have)
    sent = drive(plan, ok)
    assert len(sent) == len(set(sent)) and not set(sent) & have   # once each, never a holder
    assert plan.settled and not plan.in_flight
    good = [x for x in a if ok[x] and x not in have]
    # holders: what it had, plus as many good nsqds as copies were missing (substitution)
    assert len(plan.holders) == len(have) + min(len(good), n - len(have))
    assert plan.holders <= have | set(good)
    assert len(plan.holders) <= n
    assert plan.quorum_met == (len(plan.holders) >= w)
    assert plan.complete == (len(plan.holders) == n)
    assert set(plan.failures) == {x for x in sent if not ok[x]}
    # a failure is substituted while a candidate is left and a copy is missing: a round
    # short of N has tried every nsqd
    if not plan.complete:
        assert set(sent) | have == set(a)


@given(shapes(), st.data())
def test_hopeless_is_exactly_when_the_quorum_can_no_longer_be_met(shape, data):
    k, n, w = shape
    a = addrs(k)
    ok = {x: data.draw(st.booleans()) for x in a}
    plan = ReplicaChooser(a, n, w).plan(all_up)
    queue = plan.start()
    while queue:
        target = queue.pop(0)
        if ok[target]:
            plan.acked(target)
        else:
            sub = plan.failed(target)
            if sub is not None:
                queue.append(sub)
        reachable = len(plan.holders) + len(plan.in_flight) + sum(
            1 for x in a if x not in plan.holders and x not in plan.failures
            and x not in plan.in_flight)
        assert plan.hopeless == (reachable < w)
    assert plan.hopeless == (not plan.quorum_met)


def test_a_failure_gets_the_next_candidate_until_none_is_left():
    a = addrs(3)
    plan = ReplicaChooser(a, 2, 2).plan(all_up)
    assert plan.start() == [a[0], a[1]]
    assert plan.failed(a[0]) == a[2]
    plan.acked(a[1])
    assert plan.failed(a[2]) is None                    # nothing left: the round settles short
    assert plan.settled and plan.hopeless and not plan.quorum_met
    assert plan.holders == {a[1]} and plan.failures == (a[0], a[2])


def test_no_substitute_once_enough_are_in_flight_or_held():
    a = addrs(3)
    plan = ReplicaChooser(a, 1, 1).plan(all_up)
    (t,) = plan.start()
    assert plan.failed(t) == a[1]
    plan.acked(a[1])
    assert plan.complete and plan.quorum_met and plan.settled


def test_a_round_for_what_every_replica_already_holds_sends_nothing():
    a = addrs(2)
    plan = ReplicaChooser(a, 2, 2).plan(all_up, frozenset(a))
    assert plan.start() == [] and plan.complete and plan.settled


def test_start_is_called_once_and_an_answer_for_an_unsent_nsqd_is_a_bug():
    plan = ReplicaChooser(addrs(2), 1, 1).plan(all_up)
    plan.start()
    with pytest.raises(RuntimeError):
        plan.start()
    with pytest.raises(KeyError):
        plan.acked("127.0.0.1:1")


def test_the_default_quorum_is_a_majority():
    assert [default_quorum(n) for n in range(1, 6)] == [1, 2, 2, 3, 3]


@pytest.mark.parametrize("k,n,w,bad", [(2, 3, 1, "replicas=3"), (2, 0, 1, "replicas=0"),
                                       (3, 2, 3, "write_quorum=3"),
                                       (3, 2, 0, "write_quorum=0")])
def test_the_chooser_refuses_impossible_shapes(k, n, w, bad):
    with pytest.raises(ValueError, match=bad):
        ReplicaChooser(addrs(k), n, w)
    with pytest.raises(ValueError, match="repeat"):
        ReplicaChooser(["a:1", "a:1"], 1, 1)


@settings(max_examples=50)
@given(st.integers(2, 6), st.integers(0, 3))
def test_the_rotation_is_shared_by_threads_without_skipping_a_turn(k, start):
    import threading
    chooser = ReplicaChooser(addrs(k), 1, 1)
    for _ in range(start):
        chooser.plan(all_up)
    firsts: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(k * 10):
            t = chooser.plan(all_up).start()[0]
            with lock:
                firsts.append(t)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(Counter(firsts).values()) == {40}
