"""Claim, then commit, in process: the claims' table, the opposite-of-Bloom filter and the
Bloom filter as claiming deduplicators, the adapter of a user-made one-step deduplicator.
No sockets; a clock the tests move. The rules: a committed key is DONE (a release never
un-commits it), an uncommitted key is never DONE (no message dropped), a live claim is
HELD with the time left on its lease, an expired one is taken over."""

from __future__ import annotations

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dedup_fakes import OneStep, OneStepWithContains, ScriptedClaims
from nsq_spark.dedup import (DONE, NEW, BloomFilter, ClaimingDeduplicator, ClaimState,
                             LocalClaims, OppositeBloomFilter, claiming, held)
from nsq_spark.dedup.base import ClaimTable

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def opposite(clock: Clock, max_claims: int = 1 << 16) -> OppositeBloomFilter:
    return OppositeBloomFilter(1 << 16, clock=clock, max_claims=max_claims)


def bloom(clock: Clock) -> BloomFilter:
    return BloomFilter(1000, 1e-9, clock=clock)


def adapted(clock: Clock) -> LocalClaims:
    return LocalClaims(OneStepWithContains(), clock=clock)


STRUCTURES = {"opposite": opposite, "bloom": bloom, "adapter": adapted}


@pytest.mark.parametrize("make", STRUCTURES.values(), ids=list(STRUCTURES))
def test_claim_commit_release_in_one_structure(make):
    clock = Clock()
    d = make(clock)
    assert d.claim_many([b"a", b"b", b"a"], 1000) == [NEW, NEW, held(1000)]
    assert d.claim_many(["a"], 1000) == [held(1000)]  # str keys are their UTF-8 bytes
    d.commit_many([b"a"])
    d.release_many([b"a", b"b"])  # a release never un-commits
    assert d.claim_many([b"a", b"b"], 500) == [DONE, NEW]
    clock.t += 0.2
    assert d.claim_many([b"b"], 500) == [held(300)]
    clock.t += 0.3  # the lease ended: taken over
    assert d.claim_many([b"b"], 500) == [NEW]
    d.renew_many([b"b"], 2000)
    clock.t += 1.0
    assert d.claim_many([b"b"], 500) == [held(1000)]
    d.renew_many([b"c"], 2000)  # no claim: nothing to renew, nothing claimed
    assert d.claim_many([b"c"], 500) == [NEW]


def test_the_claims_table_is_bounded_and_drops_expired_claims_first():
    clock = Clock()
    t = ClaimTable(max_claims=4, clock=clock)
    for k in (b"1", b"2", b"3"):
        assert t.take(k, 100, clock.t) == NEW
    clock.t += 1  # those three expired
    assert t.take(b"4", 100, clock.t) == NEW
    assert t.take(b"5", 100, clock.t) == NEW  # full: expired ones make room
    assert len(t) <= 4 and t.dropped == 0
    for k in (b"6", b"7", b"8", b"9"):
        t.take(k, 100_000, clock.t)
    assert len(t) == 4 and t.dropped > 0  # all live: the oldest went (logged once)
    assert b"9" in t


def test_an_opposite_filter_keeps_its_claims_bounded():
    clock = Clock()
    d = opposite(clock, max_claims=8)
    for i in range(100):
        d.claim_many([b"k%d" % i], 60_000)
    assert d.claims == 8


@pytest.mark.parametrize("cls", [OneStep, OneStepWithContains])
def test_the_adapter_of_a_one_step_deduplicator(cls):
    clock = Clock()
    inner = cls()
    d = claiming(inner)
    assert isinstance(d, LocalClaims) and isinstance(d, ClaimingDeduplicator)
    # claims are kept here: nothing is marked in the user's store until the commit
    assert d.claim_many([b"a", b"a"], 1000)[0] == NEW
    assert inner.seen == set()  # (without __contains__: checked, then erased again)
    d.release_many([b"a"])
    assert d.claim_many([b"a"], 1000) == [NEW]
    d.commit_many([b"a"])
    assert inner.seen == {b"a"}
    assert d.claim_many([b"a", b"b"], 1000) == [DONE, NEW]


def test_claiming_takes_ours_as_they_are_and_refuses_what_has_neither_interface():
    f = OppositeBloomFilter(16)
    assert claiming(f) is f
    fake = ScriptedClaims()
    assert claiming(fake) is fake
    with pytest.raises(TypeError, match="claim_many.*check_and_set"):
        claiming(object())


# -- a state machine: any sequence of claims, commits, releases, renewals and time ---------


KEYS = [b"k%d" % i for i in range(6)]
LEASES = st.sampled_from([100, 1000, 5000])


class ClaimRules(RuleBasedStateMachine):
    """One in-process structure against a model: committed keys, live claims (key ->
    deadline). Checked at every claim: committed -> DONE; a live claim -> HELD with its
    time left; else NEW (taken, or taken over)."""

    @initialize(kind=st.sampled_from(sorted(STRUCTURES)))
    def make(self, kind: str) -> None:
        self.clock = Clock()
        self.d = STRUCTURES[kind](self.clock)
        # the filter forgets a key when another lands in its bucket (hash() is salted per
        # run): the keys the structure sees are chosen to sit in distinct buckets
        self.alias: dict[bytes, bytes] = {}
        buckets: set[int] = set()
        n = 0
        for k in KEYS:
            while True:
                n += 1
                cand = b"%s-%d" % (k, n)
                if hash(cand) % (1 << 16) not in buckets:
                    buckets.add(hash(cand) % (1 << 16))
                    self.alias[k] = cand
                    break
        self.committed: set[bytes] = set()
        self.claims: dict[bytes, float] = {}

    def of(self, keys: list[bytes]) -> list[bytes]:
        return [self.alias[k] for k in keys]

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4), lease=LEASES)
    def claim(self, keys: list[bytes], lease: int) -> None:
        got = self.d.claim_many(self.of(keys), lease)
        now = self.clock.t
        for k, c in zip(keys, got):
            if k in self.committed:
                assert c == DONE, (k, c)
            elif self.claims.get(k, -1.0) > now:
                assert c.state is ClaimState.HELD, (k, c)
                assert c.left_ms == max(1, math.ceil((self.claims[k] - now) * 1000)), (k, c)
            else:
                assert c == NEW, (k, c)
                self.claims[k] = now + lease / 1000

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3))
    def commit(self, keys: list[bytes]) -> None:
        self.d.commit_many(self.of(keys))
        self.committed.update(keys)
        for k in keys:
            self.claims.pop(k, None)

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3))
    def release(self, keys: list[bytes]) -> None:
        self.d.release_many(self.of(keys))
        for k in keys:
            self.claims.pop(k, None)

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3), lease=LEASES)
    def renew(self, keys: list[bytes], lease: int) -> None:
        self.d.renew_many(self.of(keys), lease)
        now = self.clock.t
        for k in keys:
            if self.claims.get(k, -1.0) > now:
                self.claims[k] = now + lease / 1000

    @rule(ms=st.integers(1, 6000))
    def time_passes(self, ms: int) -> None:
        self.clock.t += ms / 1000

    @precondition(lambda self: hasattr(self, "d"))
    @invariant()
    def committed_keys_stay_committed(self) -> None:
        if isinstance(self.d, OppositeBloomFilter):
            assert all(self.alias[k] in self.d for k in self.committed)


TestClaimRules = ClaimRules.TestCase
TestClaimRules.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
