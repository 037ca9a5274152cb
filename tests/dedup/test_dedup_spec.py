"""from_spec: the URL-like strings of the Spark ``dedup`` option (parsing only; the
stores are exercised against real servers in test_dedup_stores)."""

from __future__ import annotations

import pytest

from nsq_spark.dedup import (BloomFilter, Deduplicator, OppositeBloomFilter, by_body_digest,
                             by_message_id, cached_from_spec, check_and_set_many, erase_many,
                             from_spec, resolve_key)

pytestmark = pytest.mark.unit


def test_memory_opposite_by_size_and_by_rate():
    d = from_spec("memory://opposite?size=1000&digest_size=8&key=body")
    assert isinstance(d, OppositeBloomFilter) and d.size == 1000 and d.digest_size == 8
    assert d.key_func is by_body_digest and d.shared is False
    d = from_spec("memory://opposite?rate=1000&window=3600&probability=0.1")
    assert d.size == 1_563_461
    assert from_spec("memory://opposite?size=10&digest_size=none").digest_size is None


def test_memory_bloom():
    d = from_spec("memory://bloom?capacity=5000&error_rate=0.01")
    assert isinstance(d, BloomFilter) and d.capacity == 5000 and d.error_rate == 0.01
    assert d.key_func is by_message_id
    assert isinstance(d, Deduplicator)


def test_redis_spec_options_without_connecting():
    redis = pytest.importorskip("redis")
    d = from_spec("redis://:secret@127.0.0.1:6390/3?ttl=120&prefix=orders&key=body&socket_timeout=2")
    assert d.ttl == 120 and d.prefix == "orders" and d.key_func is by_body_digest
    kw = d.client.connection_pool.connection_kwargs
    assert (kw["port"], kw["db"], kw["password"], kw["socket_timeout"]) == (6390, 3, "secret", 2.0)
    assert isinstance(d.client, redis.Redis) and d.shared and d.spec.startswith("redis://")
    d = from_spec("redis://127.0.0.1:6390/0?keep_days=2")
    assert d.keep_days == 2
    d = from_spec("unix:///tmp/no-such-redis.sock?db=2&ttl=60")
    kw = d.client.connection_pool.connection_kwargs
    assert (kw["path"], kw["db"], d.ttl) == ("/tmp/no-such-redis.sock", 2, 60)
    d = from_spec("rediss://127.0.0.1:6380/0?ttl=5&ssl_cert_reqs=none")
    assert d.client.connection_pool.connection_class.__name__ == "SSLConnection"


def test_memcached_spec():
    pytest.importorskip("pymemcache")
    d = from_spec("memcached://127.0.0.1:11299?ttl=30&key=id&prefix=p")
    assert d.ttl == 30 and d.prefix == "p" and d.key_func is by_message_id


@pytest.mark.parametrize("spec, match", [
    ("127.0.0.1:6379", "look like"),
    ("ftp://x/", "unknown dedup scheme"),
    ("memory://opposite", "size=N"),
    ("memory://opposite?size=10&sise=3", "unknown dedup option"),
    ("memory://cuckoo?size=1", "unknown in-process"),
    ("memory://bloom?capacity=ten", "integer"),
    ("memory://bloom?capacity=10&error_rate=2", "error_rate"),
    ("memcached://127.0.0.1:11211?ttl=60&tll=3", "unknown dedup option"),
    ("memcached://127.0.0.1", "host:port"),
    ("redis://127.0.0.1:6379/0?ttl=0", "ttl"),
    ("redis://127.0.0.1:6379/0?tll=60", "bad Redis dedup spec"),
    ("memory://opposite?size=10&key=bodyy", "unknown deduplication key"),
])
def test_bad_specs_name_the_problem(spec, match):
    with pytest.raises(ValueError, match=match):
        from_spec(spec)


def test_cached_from_spec_reuses_one_instance():
    a = cached_from_spec("memory://opposite?size=64")
    assert cached_from_spec("memory://opposite?size=64") is a
    assert cached_from_spec("memory://opposite?size=65") is not a


def test_resolve_key_and_bulk_helpers_fall_back_to_loops():
    assert resolve_key(None) is by_message_id and resolve_key("BODY") is by_body_digest
    fn = lambda m: m.body[:4]  # noqa: E731
    assert resolve_key(fn) is fn

    class Plain:  # only the two interface methods
        def __init__(self) -> None:
            self.seen: set[bytes] = set()

        def check_and_set(self, key):
            k = key if isinstance(key, bytes) else key.encode()
            if k in self.seen:
                return True
            self.seen.add(k)
            return False

        def erase(self, key):
            self.seen.discard(key)

    p = Plain()
    assert isinstance(p, Deduplicator)
    assert check_and_set_many(p, [b"a", "a", b"b"]) == [False, True, False]
    erase_many(p, [b"a"])
    assert check_and_set_many(p, [b"a"]) == [False]


def test_contains_many_in_process_and_fallback():
    from nsq_spark.dedup import contains_many
    for d in (OppositeBloomFilter(1024), BloomFilter(1000, 1e-6)):
        d.check_and_set(b"x")
        assert contains_many(d, [b"x", b"y"]) == [True, False]
        assert d.check_and_set(b"y") is False

    class Plain:
        def __init__(self) -> None:
            self.seen: set[bytes] = set()

        def check_and_set(self, key):
            if key in self.seen:
                return True
            self.seen.add(key)
            return False

        def erase(self, key):
            self.seen.discard(key)

    p = Plain()
    p.check_and_set(b"x")
    assert contains_many(p, [b"x", b"y"]) == [True, False]
    assert p.seen == {b"x"}  # the fallback erased what it marked


def test_memcached_address_follows_the_one_address_rule():
    pytest.importorskip("pymemcache")
    from nsq_spark.dedup.stores import MemcachedDeduplicator
    from nsq_spark.errors import InvalidAddressError

    with pytest.raises(InvalidAddressError, match="MemcachedDeduplicator client.*no port"):
        MemcachedDeduplicator("127.0.0.1")
    with pytest.raises(InvalidAddressError, match="IPv6 host needs brackets"):
        MemcachedDeduplicator("::1:11211")
    d = MemcachedDeduplicator("[::1]:11211")      # parsed; nothing is connected yet
    assert d.client.server == ("::1", 11211)
