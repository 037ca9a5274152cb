"""OppositeBloomFilter: promises, erase, threads, and the sizing arithmetic (formula and
simulation with the real filter)."""

from __future__ import annotations

import sys
import threading

import pytest

from nsq_spark.dedup import OppositeBloomFilter, by_body_digest, by_message_id

pytestmark = pytest.mark.unit

MODES = [16, 8, None]


def keys(n: int, start: int = 0, tag: bytes = b"k") -> list[bytes]:
    return [tag + i.to_bytes(8, "little") for i in range(start, start + n)]


@pytest.mark.parametrize("ds", MODES)
def test_first_sight_is_new_second_is_duplicate(ds):
    f = OppositeBloomFilter(1024, ds)
    assert f.check_and_set(b"a") is False
    assert f.check_and_set(b"a") is True
    assert f.check_and_set("a") is True  # str keys are their UTF-8 bytes
    assert f.check_and_set(b"b") is False
    assert b"b" in f and b"c" not in f


@pytest.mark.parametrize("ds", MODES)
def test_forgets_when_the_bucket_is_overwritten(ds):
    f = OppositeBloomFilter(1, ds)  # one bucket: every new key overwrites
    assert f.check_and_set(b"a") is False
    assert f.check_and_set(b"b") is False
    assert f.check_and_set(b"a") is False  # forgotten: a missed duplicate, never a false one
    assert f.check_and_set(b"a") is True


@pytest.mark.parametrize("ds", MODES)
def test_erase_forgets_only_its_own_key(ds):
    f = OppositeBloomFilter(1, ds)
    f.check_and_set(b"a")
    f.erase(b"a")
    assert b"a" not in f
    assert f.check_and_set(b"a") is False  # processed again after a failure
    f.check_and_set(b"b")  # overwrites a
    f.erase(b"a")  # a is not there any more: b must survive
    assert b"b" in f
    f.erase(b"never-seen")
    assert b"b" in f


@pytest.mark.parametrize("ds", [16, None])
def test_never_a_false_seen_with_full_digests_or_keys(ds):
    f = OppositeBloomFilter(257, ds)
    assert f.check_and_set_many(keys(20_000)) == [False] * 20_000
    fresh = keys(50_000, start=10**6)
    assert not any(k in f for k in fresh)
    assert f.check_and_set_many(fresh) == [False] * 50_000


def test_shortened_digest_gives_false_seen_at_the_predicted_rate():
    # 1-byte digests: a new key matches a full bucket with probability 1/256.
    f = OppositeBloomFilter(512, 1)
    f.check_and_set_many(keys(20_000))  # every bucket is occupied by now
    n = 100_000
    false_seen = sum(k in f for k in keys(n, start=10**6))
    expected = n / 256
    assert abs(false_seen - expected) < 5 * expected ** 0.5, (false_seen, expected)


def test_batch_equals_single_calls_and_repeats_inside_a_batch():
    batch = [b"x", b"y", b"x", "y", b"z", b"x"]
    f = OppositeBloomFilter(4096)
    assert f.check_and_set_many(batch) == [False, False, True, True, False, True]
    g = OppositeBloomFilter(4096)
    assert [g.check_and_set(k) for k in batch] == [False, False, True, True, False, True]


@pytest.mark.parametrize("ds", [16, None])
def test_check_and_set_is_atomic_under_threads(ds):
    size = 1 << 16
    # keep keys whose buckets are all distinct, so that only races could cause two Falses
    probe = OppositeBloomFilter(size, ds)
    probe.check_and_set_many(keys(3000))
    distinct = [k for k in keys(3000) if k in probe][:2000]
    assert len(distinct) > 1900
    nthreads = 8

    def race() -> list[int]:
        f = OppositeBloomFilter(size, ds)
        results: list[list[bool]] = [[] for _ in range(nthreads)]
        barrier = threading.Barrier(nthreads)

        def run(i: int) -> None:
            barrier.wait()
            mine = distinct if i % 2 else distinct[::-1]
            if i % 3 == 0:
                results[i] = f.check_and_set_many(mine)
            else:
                results[i] = [f.check_and_set(k) for k in mine]
            if i % 2 == 0:
                results[i].reverse()  # realign with `distinct`

        threads = [threading.Thread(target=run, args=(i,)) for i in range(nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return [sum(not results[t][j] for t in range(nthreads)) for j in range(len(distinct))]

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for _ in range(3):  # races are chancy: several rounds
            assert race() == [1] * len(distinct)
    finally:
        sys.setswitchinterval(old)


def test_validation_names_the_fix():
    with pytest.raises(ValueError, match="size_for"):
        OppositeBloomFilter(0)
    with pytest.raises(ValueError, match="digest_size"):
        OppositeBloomFilter(10, 0)
    with pytest.raises(TypeError, match="bytes or str"):
        OppositeBloomFilter(10).check_and_set(123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="probability"):
        OppositeBloomFilter.size_for(1000, 3600, 1.5)


def test_memory_is_reported_honestly():
    f = OppositeBloomFilter(100_000, 16)
    assert 1_600_000 <= f.memory_bytes < 1_600_000 + 1000
    g = OppositeBloomFilter(1000, None)
    empty = g.memory_bytes
    g.check_and_set_many(keys(5000))
    # a pointer per bucket plus one bytes object per remembered key (>= 33 + 9 bytes)
    assert g.memory_bytes - empty >= 900 * 42


def test_key_functions():
    class M:
        id = b"0123456789abcdef"
        body = b"hello"
    f = OppositeBloomFilter(10, key="body")
    assert f.key_func is by_body_digest
    assert OppositeBloomFilter(10).key_func is by_message_id
    assert by_message_id(M) == b"0123456789abcdef"
    assert len(by_body_digest(M)) == 16


# -- the sizing arithmetic -----------------------------------------------------------------

def test_sizing_figures_by_formula():
    # 100 buckets: after 459 more inserts a key is overwritten with probability >= 99%
    assert OppositeBloomFilter.inserts_until_forgotten(100, 0.99) == 459
    assert 1 - OppositeBloomFilter.probability_remembered(100, 459) >= 0.99
    assert 1 - OppositeBloomFilter.probability_remembered(100, 458) < 0.99
    # 1,000 events/s, a duplicate one hour later. The 1,563,461 buckets is the size
    # at which the key has been overwritten with 90% probability (a 10% chance to catch it);
    # a 90% chance to catch it needs 34,168,399 buckets.
    assert OppositeBloomFilter.size_for(1000, 3600, 0.10) == 1_563_461
    # the smallest size that still remembers the key with probability 10%
    assert (OppositeBloomFilter.probability_remembered(1_563_461, 3_600_000) >= 0.10
            > OppositeBloomFilter.probability_remembered(1_563_460, 3_600_000))
    assert OppositeBloomFilter.size_for(1000, 3600, 0.90) == 34_168_399
    assert OppositeBloomFilter.probability_remembered(34_168_399, 3_600_000) >= 0.90


def test_overwrite_probability_by_simulation_100_buckets():
    f = OppositeBloomFilter(100)
    trials, later = 2000, 459
    stream = keys(trials * (later + 1))
    remembered = 0
    for t in range(trials):
        chunk = stream[t * (later + 1):(t + 1) * (later + 1)]
        f.check_and_set_many(chunk)
        remembered += chunk[0] in f
    expected = trials * OppositeBloomFilter.probability_remembered(100, later)  # ~19.8
    assert abs(remembered - expected) < 4 * expected ** 0.5 + 1, (remembered, expected)
    assert remembered / trials < 0.02  # i.e. overwritten with ~99% probability


def test_overwrite_probability_by_simulation_one_hour_at_1000_per_second():
    n, x, tracked = 1_563_461, 3_600_000, 20_000
    f = OppositeBloomFilter(n, 8)  # the digest size does not change the bucket arithmetic
    f.check_and_set_many(keys(tracked, tag=b"t"))
    step = 200_000
    for start in range(0, x, step):
        f.check_and_set_many(keys(min(step, x - start), start=start))
    remembered = sum(k in f for k in keys(tracked, tag=b"t"))
    # tracked key j saw x + (tracked - 1 - j) later inserts
    expected = sum(OppositeBloomFilter.probability_remembered(n, x + tracked - 1 - j)
                   for j in range(tracked))
    sd = (expected * (1 - expected / tracked)) ** 0.5
    assert abs(remembered - expected) < 4 * sd, (remembered, expected)
    assert 0.09 < remembered / tracked < 0.11  # overwritten with ~90% probability


def test_keys_of_digest_length_are_stored_exactly():
    # 16-byte NSQ ids are stored as they are: even a 1-bucket filter tells them apart
    f = OppositeBloomFilter(1, 16)
    a, b = b"0123456789abcdef", b"0123456789abcdeF"
    assert f.check_and_set(a) is False and a in f and b not in f
    assert bytes(f._buf) == a
    f.erase(b)
    assert a in f
    f.erase(a)
    assert a not in f and bytes(f._buf) == bytes(16)
    # an all-zero key would look like an empty bucket: it is digested instead
    zero = bytes(16)
    assert zero not in f and f.check_and_set(zero) is False and f.check_and_set(zero) is True


def test_never_a_false_seen_with_nsq_ids():
    f = OppositeBloomFilter(101)
    ids = [b"%016x" % i for i in range(30_000)]
    f.check_and_set_many(ids)
    assert not any(b"%016x" % i in f for i in range(10**6, 10**6 + 50_000))
