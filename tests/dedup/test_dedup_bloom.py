"""In-process BloomFilter: parameters, measured false-positive rate, erase, threads."""

from __future__ import annotations

import math
import threading

import pytest

from nsq_spark.dedup import BloomFilter, bloom_parameters

pytestmark = pytest.mark.unit


def keys(n: int, start: int = 0) -> list[bytes]:
    return [b"b" + i.to_bytes(8, "little") for i in range(start, start + n)]


def test_parameters_follow_the_textbook_formulas():
    bits, hashes = bloom_parameters(1_000_000, 0.01)
    assert bits == math.ceil(1_000_000 * math.log(100) / math.log(2) ** 2)  # ~9.59 bits/key
    assert hashes == 7
    assert bloom_parameters(1000, 0.001) == (14378, 10)
    with pytest.raises(ValueError, match="dropped as a duplicate"):
        bloom_parameters(10, 1.0)
    with pytest.raises(ValueError, match="capacity"):
        bloom_parameters(0, 0.01)


def test_no_false_negatives_and_duplicates_are_caught():
    f = BloomFilter(5000, 0.01)
    ks = keys(5000)
    first = f.check_and_set_many(ks)
    assert sum(first) < 5000 * 0.01 * 1.5 + 10  # a few new keys look seen: that is the error rate
    assert all(f.check_and_set_many(ks))  # every real duplicate is caught
    assert f.check_and_set("b" + "x") is False and f.check_and_set(b"bx") is True


@pytest.mark.parametrize("error_rate", [0.01, 0.001])
def test_measured_false_positive_rate_matches_the_configured_one(error_rate):
    capacity = 20_000
    f = BloomFilter(capacity, error_rate)
    f.check_and_set_many(keys(capacity))
    probes = 200_000 if error_rate < 0.01 else 50_000
    fp = sum(k in f for k in keys(probes, start=10**7))
    expected = probes * error_rate
    # the configured rate is the design point at capacity; allow binomial noise
    assert 0.5 * expected < fp < 1.5 * expected, (fp, expected)


def test_erase_makes_the_next_check_new_once():
    f = BloomFilter(1000, 0.01)
    assert f.check_and_set(b"m") is False
    f.erase(b"m")  # handling failed
    assert b"m" not in f
    assert f.check_and_set(b"m") is False  # the redelivery is handled
    assert f.check_and_set(b"m") is True  # and the one after that is a duplicate again


def test_erase_records_are_bounded():
    f = BloomFilter(1000, 0.01, max_erased=3)
    for k in (b"a", b"b", b"c", b"d"):
        f.check_and_set(k)
        f.erase(k)
    assert f.check_and_set(b"a") is True  # its record was the oldest, dropped
    assert [f.check_and_set(k) for k in (b"b", b"c", b"d")] == [False, False, False]


def test_over_capacity_logs_a_warning(caplog):
    f = BloomFilter(10, 0.01)
    with caplog.at_level("WARNING", logger="nsq_spark.dedup.bloom"):
        f.check_and_set_many(keys(30))
    assert any("larger capacity" in r.getMessage() for r in caplog.records)


def test_atomic_under_threads():
    f = BloomFilter(10_000, 1e-6)  # so low that a false positive among 2000 keys is unlikely
    ks = keys(2000)
    probe = BloomFilter(10_000, 1e-6)
    assert not any(probe.check_and_set_many(ks))  # no false positive in this key set
    out: list[list[bool]] = [[] for _ in range(6)]
    barrier = threading.Barrier(6)

    def run(i: int) -> None:
        barrier.wait()
        out[i] = [f.check_and_set(k) for k in ks]

    ts = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert [sum(not out[t][j] for t in range(6)) for j in range(len(ks))] == [1] * len(ks)


def test_memory_is_bits_over_eight():
    f = BloomFilter(1_000_000, 0.01)
    assert f.bits // 8 <= f.memory_bytes < f.bits // 8 + 1000
