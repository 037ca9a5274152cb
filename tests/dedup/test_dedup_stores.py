"""Exact stores and the Redis Bloom filter against real redis-server and memcached."""

from __future__ import annotations

import pickle
import threading
import uuid

import pytest

from nsq_spark.dedup import (MemcachedDeduplicator, RedisBloomFilter, RedisDeduplicator,
                             by_body_digest, from_spec)

pytestmark = pytest.mark.dedup

redis = pytest.importorskip("redis")
pymemcache = pytest.importorskip("pymemcache")

DAY = 86400


def uniq() -> str:
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture
def rclient(redis_server):
    c = redis.Redis.from_url(redis_server.url)
    yield c
    c.close()


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_store(kind, redis_server, memcached_server, **kw):
    if kind == "redis":
        return RedisDeduplicator(redis_server.url, prefix=uniq(), **kw)
    host, port = memcached_server.address
    return MemcachedDeduplicator(f"{host}:{port}", prefix=uniq(), **kw)


STORES = ["redis", "memcached"]


@pytest.mark.parametrize("kind", STORES)
def test_exact_check_and_set_and_erase(kind, redis_server, memcached_server):
    d = make_store(kind, redis_server, memcached_server, ttl=60)
    assert d.check_and_set(b"0123456789abcdef") is False
    assert d.check_and_set(b"0123456789abcdef") is True
    assert d.check_and_set("0123456789abcdef") is True
    raw = bytes(range(256))[:40]  # binary keys (body digests) work too, and stay distinct
    assert d.check_and_set(raw) is False
    assert d.check_and_set(raw) is True
    assert d.check_and_set(raw.hex()) is False  # the hex text is another key than the bytes
    d.erase(b"0123456789abcdef")
    assert d.check_and_set(b"0123456789abcdef") is False
    long_key = b"x" * 1000
    assert d.check_and_set(long_key) is False and d.check_and_set(long_key) is True
    assert d.shared is True


@pytest.mark.parametrize("window", [{"ttl": 60}, {"keep_days": 2}])
@pytest.mark.parametrize("kind", [*STORES, "redis-pipeline"])
def test_batch_in_order_with_repeats(kind, window, redis_server, memcached_server):
    d = make_store(kind.split("-")[0], redis_server, memcached_server, **window)
    if kind == "redis-pipeline":
        d._many_script = None  # the pipelined path (what a Redis Cluster client gets)
    batch = [b"a", b"b", b"a", b"c", b"b"]
    assert d.check_and_set_many(batch) == [False, False, True, False, True]
    assert d.check_and_set_many(batch) == [True] * 5
    assert d.check_and_set_many([]) == []
    d.erase_many([b"a", b"c"])
    assert d.check_and_set_many([b"a", b"b", b"c"]) == [False, True, False]


@pytest.mark.parametrize("kind", STORES)
def test_two_consumers_share_the_store_and_race_fairly(kind, redis_server, memcached_server):
    first = make_store(kind, redis_server, memcached_server, ttl=60)
    if kind == "redis":
        second = RedisDeduplicator(redis_server.url, prefix=first.prefix, ttl=60)
    else:
        second = MemcachedDeduplicator(memcached_server.address, prefix=first.prefix, ttl=60)
    ks = [b"k%04d" % i for i in range(300)]
    res: dict[int, list[bool]] = {}
    barrier = threading.Barrier(4)

    def run(i: int) -> None:
        d = first if i % 2 else second
        barrier.wait()
        if i < 2:
            res[i] = [d.check_and_set(k) for k in ks]
        else:  # batches race with single calls
            res[i] = [r for j in range(0, len(ks), 50) for r in d.check_and_set_many(ks[j:j + 50])]

    ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert [sum(not res[i][j] for i in range(4)) for j in range(len(ks))] == [1] * len(ks)


def test_redis_ttl_is_set_on_the_key(redis_server, rclient):
    d = RedisDeduplicator(redis_server.url, ttl=123, prefix=uniq())
    d.check_and_set(b"abc")
    assert 120 <= rclient.ttl(f"{d.prefix}:abc") <= 123


def test_redis_key_expires_after_ttl(redis_server):
    d = RedisDeduplicator(redis_server.url, ttl=1, prefix=uniq())
    assert d.check_and_set(b"e") is False
    assert d.check_and_set(b"e") is True
    import time
    deadline = time.monotonic() + 5
    while d.client.exists(f"{d.prefix}:e") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.check_and_set(b"e") is False  # forgotten after the window


def test_memcached_ttl_expires(memcached_server):
    import time
    d = MemcachedDeduplicator(memcached_server.address, ttl=1, prefix=uniq())
    assert d.check_and_set(b"e") is False
    assert d.check_and_set(b"e") is True
    deadline = time.monotonic() + 5
    seen = True
    while seen and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = d.client.get(d._encode(b"e", d._kprefix)) is not None
    assert d.check_and_set(b"e") is False


@pytest.mark.parametrize("kind", STORES)
def test_keyed_by_day_keeps_two_days(kind, redis_server, memcached_server):
    t0 = 1_800_000_000 // DAY * DAY  # a UTC midnight
    clock = Clock(t0 + 23 * 3600)  # 23:00 on day 0
    d = make_store(kind, redis_server, memcached_server, keep_days=2, clock=clock)
    assert d.check_and_set(b"m1") is False
    clock.t = t0 + DAY + 3600  # 01:00 next day: yesterday's store is still checked
    assert d.check_and_set(b"m1") is True
    assert d.check_and_set(b"m2") is False  # goes into day 1
    clock.t = t0 + 2 * DAY + 60  # day 2: day 0 is no longer checked, day 1 is
    assert d.check_and_set(b"m1") is False
    assert d.check_and_set(b"m2") is True
    d.erase(b"m2")  # erase reaches older days too
    assert d.check_and_set(b"m2") is False


def test_redis_day_sets_expire_at_the_end_of_their_last_day(redis_server, rclient):
    import time
    now = time.time()
    d = RedisDeduplicator(redis_server.url, keep_days=2, prefix=uniq())
    d.check_and_set(b"x")
    name = f"{{{d.prefix}}}:{time.strftime('%Y-%m-%d', time.gmtime(now))}"
    assert rclient.type(name) == b"set" and rclient.sismember(name, b"x")
    expected_end = int(now) // DAY * DAY + 2 * DAY
    assert abs(rclient.expiretime(name) - expected_end) <= 1


def test_pickles_as_its_spec(redis_server, memcached_server):
    host, port = memcached_server.address
    for spec in (f"{redis_server.url}?ttl=60&prefix={uniq()}",
                 f"memcached://{host}:{port}?ttl=60&prefix={uniq()}&key=body"):
        d = from_spec(spec)
        assert d.check_and_set(b"p") is False
        clone = pickle.loads(pickle.dumps(d))
        assert clone is not d and clone.check_and_set(b"p") is True
        if spec.startswith("memcached"):
            assert clone.key_func is by_body_digest
    with pytest.raises(TypeError, match="from_spec"):
        pickle.dumps(RedisDeduplicator(redis_server.url))


def test_unreachable_redis_fails_with_a_connection_error():
    from nsq_spark.testing import free_port
    d = RedisDeduplicator(f"redis://127.0.0.1:{free_port()}/0?socket_connect_timeout=1")
    with pytest.raises(redis.exceptions.ConnectionError):
        d.check_and_set(b"x")


# -- RedisBloomFilter ------------------------------------------------------------------

def test_redis_bloom_fallback_bit_array(redis_server, rclient):
    name = uniq()
    f = RedisBloomFilter(redis_server.url, name, capacity=10_000, error_rate=0.01, module=False)
    assert not f.uses_module
    assert rclient.strlen(f"{{{name}}}") == (f.bits + 7) // 8  # allocated at once
    ks = [b"r%06d" % i for i in range(10_000)]
    first = f.check_and_set_many(ks)
    assert sum(first) < 10_000 * 0.01 * 1.5
    assert all(f.check_and_set_many(ks))
    probes = [b"q%06d" % i for i in range(20_000)]
    fp = sum(f.contains_many(probes))
    assert 0.5 * 200 < fp < 1.5 * 200, fp  # ~ error_rate of new keys look seen
    assert b"r000005" in f and b"never" not in f
    # erase: the next check of that key answers "new", once
    assert f.check_and_set(b"r000001") is True
    f.erase(b"r000001")
    assert f.check_and_set(b"r000001") is False
    assert f.check_and_set(b"r000001") is True
    f.erase_many([b"r000002", b"r000003"])
    assert f.check_and_set_many([b"r000002", b"r000003", b"r000002"]) == [False, False, True]
    f._many_script = None  # the pipelined path (what a Redis Cluster client gets)
    f.erase(b"r000004")
    assert f.check_and_set_many([b"r000004", b"r000004", b"r000005"]) == [False, True, True]
    fresh = next(k for k in (b"fresh-%d" % i for i in range(100)) if k not in f)
    assert f.check_and_set_many([fresh, fresh]) == [False, True]


def test_redis_bloom_same_bits_as_in_process(redis_server):
    from nsq_spark.dedup import BloomFilter
    local = BloomFilter(2000, 0.01)
    remote = RedisBloomFilter(redis_server.url, uniq(), capacity=2000, error_rate=0.01, module=False)
    ks = [b"s%05d" % i for i in range(3000)]
    assert remote.check_and_set_many(ks) == local.check_and_set_many(ks)


def test_redis_bloom_mismatched_settings_fail_loudly(redis_server):
    name = uniq()
    RedisBloomFilter(redis_server.url, name, capacity=1000, error_rate=0.01, module=False)
    with pytest.raises(ValueError, match="same settings"):
        RedisBloomFilter(redis_server.url, name, capacity=5000, error_rate=0.01, module=False)


def test_redis_bloom_consumers_race_fairly(redis_server):
    name = uniq()
    fs = [RedisBloomFilter(redis_server.url, name, capacity=100_000, error_rate=1e-6, module=False)
          for _ in range(3)]
    ks = [b"c%04d" % i for i in range(300)]
    res: dict[int, list[bool]] = {}
    barrier = threading.Barrier(3)

    def run(i: int) -> None:
        barrier.wait()
        res[i] = [fs[i].check_and_set(k) for k in ks]

    ts = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert [sum(not res[i][j] for i in range(3)) for j in range(len(ks))] == [1] * len(ks)


def test_redis_bloom_module_path(redis_server, rclient):
    if not RedisBloomFilter.server_has_module(rclient):
        pytest.skip("this redis-server has no RedisBloom module (BF.ADD); Debian's redis-server "
                    "7 does not ship it -- the bit-array fallback is tested above")
    f = RedisBloomFilter(redis_server.url, uniq(), capacity=10_000, error_rate=0.01)
    assert f.uses_module
    assert f.check_and_set(b"a") is False and f.check_and_set(b"a") is True
    f.erase(b"a")
    assert f.check_and_set(b"a") is False


def test_redis_bloom_module_required_but_missing(redis_server, rclient):
    if RedisBloomFilter.server_has_module(rclient):
        pytest.skip("this server has RedisBloom")
    with pytest.raises(RuntimeError, match="RedisBloom"):
        RedisBloomFilter(redis_server.url, uniq(), capacity=100, module=True)


def test_redis_bloom_from_spec_and_pickle(redis_server):
    port = redis_server.port
    spec = (f"redis-bloom://127.0.0.1:{port}/0?capacity=1000&error_rate=0.01&name={uniq()}"
            "&module=auto&key=body")
    f = from_spec(spec)
    assert isinstance(f, RedisBloomFilter) and f.key_func is by_body_digest
    assert (f.capacity, f.error_rate, f.uses_module) == (1000, 0.01, False)
    assert f.check_and_set(b"z") is False
    assert pickle.loads(pickle.dumps(f)).check_and_set(b"z") is True


def test_memcached_with_a_plain_or_hash_client(memcached_server):
    from pymemcache.client.base import Client
    from pymemcache.client.hash import HashClient
    for client in (Client(memcached_server.address), HashClient([memcached_server.address])):
        d = MemcachedDeduplicator(client, ttl=60, prefix=uniq())
        assert d.check_and_set_many([b"a", b"b", b"a"]) == [False, False, True]
        assert d.check_and_set(b"b") is True
        client.close()


def test_memcached_ttl_beyond_30_days_is_sent_as_a_timestamp(memcached_server):
    # memcached reads expiry values above 30 days as unix times: 40 days sent as is would
    # mean 1970, an item expired at once, and the duplicate would get through
    d = MemcachedDeduplicator(memcached_server.address, ttl=40 * DAY, prefix=uniq())
    assert d.check_and_set(b"long") is False
    assert d.check_and_set(b"long") is True


@pytest.mark.parametrize("window", [{"ttl": 60}, {"keep_days": 2}])
def test_redis_batches_larger_than_one_script_run(window, redis_server):
    d = make_store("redis", redis_server, None, **window)
    ks = [b"L%06d" % i for i in range(12_000)]
    first = d.check_and_set_many(ks + ks[:3])
    assert first == [False] * 12_000 + [True] * 3
    assert d.check_and_set_many(ks[-5:]) == [True] * 5


@pytest.mark.parametrize("window", [{"ttl": 60}, {"keep_days": 2}])
@pytest.mark.parametrize("kind", STORES)
def test_contains_many_does_not_remember(kind, window, redis_server, memcached_server):
    from nsq_spark.dedup import contains_many
    d = make_store(kind, redis_server, memcached_server, **window)
    d.check_and_set_many([b"a", bytes(range(20))])
    assert contains_many(d, [b"a", b"b", bytes(range(20)), b"a"]) == [True, False, True, True]
    assert d.check_and_set(b"b") is False  # the look did not mark it
    assert contains_many(d, []) == []


def test_redis_bloom_contains_many_sees_erase_marks(redis_server):
    f = RedisBloomFilter(redis_server.url, uniq(), capacity=1000, error_rate=1e-6, module=False)
    f.check_and_set_many([b"a", b"b"])
    f.erase(b"b")
    assert f.contains_many([b"a", b"b", b"c"]) == [True, False, False]
    assert f.check_and_set(b"c") is False  # contains_many did not add it
