"""Claim, then commit, in the shared stores against real redis-server and memcached: two
owners (two deduplicator objects, as two consumer processes would have) racing on the
same keys, a lease that ends and is taken over, releases and renewals that touch only
their own claims, and commits that no release undoes."""

from __future__ import annotations

import threading
import uuid

import pytest

from nsq_spark.dedup import (DONE, NEW, ClaimState, MemcachedDeduplicator, RedisBloomFilter,
                             RedisDeduplicator)
from nsq_spark.testing import wait_until

pytestmark = pytest.mark.dedup

pytest.importorskip("redis")
pytest.importorskip("pymemcache")

KINDS = ["redis", "redis-days", "memcached", "memcached-days", "redis-bloom"]


def two_owners(kind, redis_server, memcached_server):
    """Two deduplicators on one namespace: what two consumer processes would hold."""
    name = "t-" + uuid.uuid4().hex[:12]
    days = {"keep_days": 2} if kind.endswith("-days") else {"ttl": 60}
    if kind.startswith("redis-bloom"):
        return [RedisBloomFilter(redis_server.url, name, 10_000, 1e-6, module=False)
                for _ in range(2)]
    if kind.startswith("redis"):
        return [RedisDeduplicator(redis_server.url, prefix=name, **days) for _ in range(2)]
    host, port = memcached_server.address
    return [MemcachedDeduplicator(f"{host}:{port}", prefix=name, **days) for _ in range(2)]


def states(claims):
    return [c.state for c in claims]


@pytest.mark.parametrize("kind", KINDS)
def test_two_owners_racing_get_exactly_one_claim_per_key(kind, redis_server, memcached_server):
    a, b = two_owners(kind, redis_server, memcached_server)
    keys = [b"key-%04d" % i for i in range(300)]
    got: dict[str, list] = {}
    start = threading.Barrier(2)

    def claim(name, d):
        start.wait()
        got[name] = d.claim_many(keys, 60_000)

    threads = [threading.Thread(target=claim, args=(n, d)) for n, d in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for ca, cb in zip(got["a"], got["b"]):
        assert sorted([ca.state.value, cb.state.value]) == ["held", "new"], (ca, cb)
        held = ca if ca.state is ClaimState.HELD else cb
        assert 0 < held.left_ms <= 60_000


@pytest.mark.parametrize("kind", KINDS)
def test_a_claim_is_held_for_others_until_its_lease_ends_then_taken_over(
        kind, redis_server, memcached_server):
    a, b = two_owners(kind, redis_server, memcached_server)
    # a repeat in the batch, and a claim of our own: held (another handler has it)
    assert states(a.claim_many([b"k", b"k"], 1000)) == [ClaimState.NEW, ClaimState.HELD]
    assert states(a.claim_many([b"k"], 1000)) == [ClaimState.HELD]
    held = b.claim_many([b"k"], 1000)[0]
    assert held.state is ClaimState.HELD and held.left_ms <= 1000
    # memcached counts whole seconds: its lease of 1 s may end a second early or late
    wait_until(lambda: b.claim_many([b"k"], 60_000) == [NEW], 5, "the lease to end",
               interval=0.1)
    assert states(a.claim_many([b"k"], 1000)) == [ClaimState.HELD]  # b holds it now


@pytest.mark.parametrize("kind", KINDS)
def test_release_and_renew_touch_only_our_own_claims(kind, redis_server, memcached_server):
    a, b = two_owners(kind, redis_server, memcached_server)
    assert a.claim_many([b"x", b"y"], 60_000) == [NEW, NEW]
    b.release_many([b"x"])  # not b's: left alone
    assert states(b.claim_many([b"x"], 60_000)) == [ClaimState.HELD]
    b.renew_many([b"y"], 1)  # not b's: left alone
    assert states(b.claim_many([b"y"], 60_000)) == [ClaimState.HELD]
    a.release_many([b"x"])  # a's own: ended, the next claim is b's
    assert b.claim_many([b"x"], 60_000) == [NEW]


@pytest.mark.parametrize("kind", KINDS)
def test_a_commit_is_never_undone_by_a_release(kind, redis_server, memcached_server):
    a, b = two_owners(kind, redis_server, memcached_server)
    assert a.claim_many([b"p", b"q"], 60_000) == [NEW, NEW]
    a.commit_many([b"p"])
    b.commit_many([b"q"])  # handled elsewhere while a still held it: committed all the same
    a.release_many([b"p", b"q"])
    b.release_many([b"p", b"q"])
    assert a.claim_many([b"p", b"q"], 60_000) == [DONE, DONE]
    assert b.claim_many([b"p", b"q", b"r"], 60_000) == [DONE, DONE, NEW]
    assert a.contains_many([b"p", b"r"]) == [True, False]  # a claim is not "seen"


@pytest.mark.parametrize("kind", ["redis", "memcached", "redis-bloom"])
def test_the_one_step_interface_and_claims_read_each_others_keys(
        kind, redis_server, memcached_server):
    a, _ = two_owners(kind, redis_server, memcached_server)
    assert a.check_and_set(b"old") is False  # marked by a program of the older interface
    assert a.claim_many([b"old", b"new"], 60_000) == [DONE, NEW]
    a.commit_many([b"new"])
    assert a.check_and_set(b"new") is True


def test_a_renewed_claim_outlives_its_first_lease(redis_server, memcached_server):
    for kind in ("redis", "memcached"):
        a, b = two_owners(kind, redis_server, memcached_server)
        assert a.claim_many([b"t"], 1000) == [NEW]
        a.renew_many([b"t"], 60_000)
        held = b.claim_many([b"t"], 1000)[0]
        assert held.state is ClaimState.HELD and held.left_ms > 10_000, (kind, held)
