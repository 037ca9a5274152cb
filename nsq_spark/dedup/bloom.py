"""Bloom filters: little memory per key, never forget -- and sometimes wrong.

A Bloom filter sized for ``capacity`` keys at ``error_rate`` answers "seen" for a key it
has NOT seen with probability ``error_rate`` (once ``capacity`` keys are in; less
before, more after). As a deduplicator that means: **a unique message is dropped
(FINished without being handled) with probability error_rate**. Choose it only when
losing that fraction of messages is acceptable; otherwise use the exact stores
(:class:`~nsq_spark.dedup.RedisDeduplicator`) or the
:class:`~nsq_spark.dedup.OppositeBloomFilter`, which never drops a unique message.

Bits cannot be cleared (other keys share them), so ``erase(key)`` records the key in a
small exact list of erased keys instead; the key's next ``check_and_set`` consumes that
record and answers "new". That is what makes a failed message be handled again when
nsqd redelivers it.

Claim, then commit (:class:`~nsq_spark.dedup.ClaimingDeduplicator`, what the Reader and
the Spark source use): since a committed key cannot be released, claims are kept apart
from the bits -- in a small table of leases in process (:class:`BloomFilter`), as Redis
keys with a lease beside the filter (:class:`RedisBloomFilter`) -- and only a handled
message's key is ever set in the filter. What a Bloom filter promises then:

* a consumer killed, or failing, inside its handler loses nothing (its claim expires or
  is released; the filter never saw the key), and a copy arriving meanwhile is requeued;
* it never forgets a committed key (until far over ``capacity``);
* it DOES say "committed" for a key it never saw with probability ``error_rate``: that
  unique message is finished unhandled -- a loss, by design, at that rate. No claim
  protocol can take that back; use an exact store when no message may be dropped.

Both classes derive the k bit positions the same way (BLAKE2b, double hashing), so their
arithmetic is the textbook one: ``m = -n ln p / (ln 2)^2`` bits, ``k = (m/n) ln 2``.
Written here rather than taken from a library because the Redis variant must compute the
very same positions client-side, and the in-process one needs an atomic check-and-set.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import OrderedDict
from hashlib import blake2b
from typing import Any, Callable, Iterable, Sequence

from .._log import get_logger
from .. import _validate as validate
from ..errors import ConfigError
from .._validate import MAX_MEMORY_BYTES, MAX_SECONDS
from ._redis import (LUA_CLAIM_KEYS_RELEASE, LUA_CLAIM_KEYS_RENEW, claim_value, is_cluster,
                     run_on_keys)
from .base import (DONE, NEW, Claim, ClaimTable, Key, KeyFunc, Owner, PicklableBySpec, held,
                   key_bytes, resolve_key)

log = get_logger(__name__)

__all__ = ["BloomFilter", "RedisBloomFilter", "bloom_parameters"]

_MAX_REDIS_BITS = 2 ** 32  # a Redis string holds at most 512 MiB


def bloom_parameters(capacity: int, error_rate: float) -> tuple[int, int]:
    """``(bits, hashes)`` for ``capacity`` keys at false-positive rate ``error_rate``."""
    validate.integer(capacity, "Bloom filter capacity", lo=1, unit="keys",
                     hint="the number of keys it must hold at error_rate")
    validate.number(error_rate, "Bloom filter error_rate", lo=0, hi=1, lo_open=True,
                    hi_open=True,
                    hint="the probability that a unique message is dropped as a duplicate")
    ln2 = math.log(2)
    bits = max(8, math.ceil(-capacity * math.log(error_rate) / (ln2 * ln2)))
    hashes = max(1, round(bits / capacity * ln2))
    return bits, hashes


def _positions(key: bytes, bits: int, hashes: int) -> list[int]:
    # Kirsch-Mitzenmacher double hashing from one 128-bit digest; h2 odd so that the
    # k positions differ whenever bits is a power of two.
    h = blake2b(key, digest_size=16).digest()
    h1 = int.from_bytes(h[:8], "little")
    h2 = int.from_bytes(h[8:], "little") | 1
    return [(h1 + i * h2) % bits for i in range(hashes)]


class BloomFilter:
    """In-process Bloom filter deduplicator.

    ``capacity``: keys it holds at ``error_rate``; past it, the false-positive rate climbs
    (a warning is logged once).
    ``error_rate``: probability that ``check_and_set`` says "seen" for a new key -- **the
    fraction of unique messages that will be dropped**. 0.001 costs ~14.4 bits a key,
    0.01 ~9.6 bits.
    ``key``: ``"id"`` (default), ``"body"`` or a function of the message (``key_func``).
    ``max_erased``: how many erased keys are remembered exactly until they come back
    (oldest dropped first; a dropped record only means that redelivery is dropped too).

    ``max_claims``, ``clock``: the claims' table (see the module doc), as for
    :class:`~nsq_spark.dedup.OppositeBloomFilter`.

    Thread-safe (one lock); process-local.
    """

    shared = False

    def __init__(self, capacity: int, error_rate: float = 0.001, *,
                 key: str | KeyFunc | None = None, max_erased: int = 65536,
                 max_claims: int = 1 << 16,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.error_rate = error_rate
        self.bits, self.hashes = bloom_parameters(capacity, error_rate)
        if self.bits // 8 > MAX_MEMORY_BYTES:
            raise ConfigError(
                f"BloomFilter(capacity={capacity}, error_rate={error_rate}) needs "
                f"{self.bits // 8:,} bytes, over the in-process cap of {MAX_MEMORY_BYTES:,} "
                "(nsq_spark._validate.MAX_MEMORY_BYTES): lower capacity, raise error_rate, or "
                "use RedisBloomFilter / an exact store")
        self.key_func: KeyFunc = resolve_key(key)
        self.max_erased = validate.integer(max_erased, "max_erased", lo=0, unit="keys")
        self.added = 0  # keys that were new when added (an estimate of the fill)
        self._buf = bytearray((self.bits + 7) // 8)
        self._rng = range(self.hashes)
        self._erased: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()
        self._warned = False
        validate.integer(max_claims, "max_claims", lo=1, unit="claims")
        self._claims = ClaimTable(max_claims, clock)

    def __repr__(self) -> str:
        return (f"BloomFilter(capacity={self.capacity}, error_rate={self.error_rate}, "
                f"bits={self.bits}, hashes={self.hashes})")

    def _cas(self, key: bytes) -> bool:
        # caller holds the lock. The positions of _positions(), computed inline: this is
        # the hot loop, and a list plus a call per key cost ~40%.
        buf, bits = self._buf, self.bits
        h = blake2b(key, digest_size=16).digest()
        h1 = int.from_bytes(h[:8], "little")
        h2 = int.from_bytes(h[8:], "little") | 1
        seen = True
        for i in self._rng:
            p = (h1 + i * h2) % bits
            byte, mask = p >> 3, 1 << (p & 7)
            b = buf[byte]
            if not b & mask:
                seen = False
                buf[byte] = b | mask
        if not seen:
            self.added += 1
            if self.added > self.capacity and not self._warned:
                self._warned = True
                log.warning("BloomFilter holds more than its capacity of %d keys: the rate of "
                            "unique messages dropped as duplicates is now above error_rate=%g; "
                            "give it a larger capacity", self.capacity, self.error_rate)
        if self._erased and key in self._erased:
            del self._erased[key]  # erased after a failure: this redelivery is handled
            return False
        return seen

    def check_and_set(self, key: Key) -> bool:
        """True when ``key`` is (probably) a duplicate; then or otherwise, remember it.
        A new key gets True with probability ``error_rate``."""
        key = key_bytes(key)
        with self._lock:
            return self._cas(key)

    def check_and_set_many(self, keys: Iterable[Key]) -> list[bool]:
        with self._lock:
            return [self._cas(key_bytes(k)) for k in keys]

    def erase(self, key: Key) -> None:
        """Make the next ``check_and_set(key)`` answer "new" (bits cannot be cleared)."""
        key = key_bytes(key)
        with self._lock:
            self._erased[key] = None
            self._erased.move_to_end(key)
            while len(self._erased) > self.max_erased:
                self._erased.popitem(last=False)

    def erase_many(self, keys: Iterable[Key]) -> None:
        for k in keys:
            self.erase(k)

    def contains_many(self, keys: Iterable[Key]) -> list[bool]:
        """Whether each key looks seen, without adding any."""
        return [k in self for k in keys]

    def __contains__(self, key: Key) -> bool:
        return self._looks_set(key_bytes(key))

    # -- claim, then commit (the module doc) ----------------------------------------------

    def claim_many(self, keys: Sequence[Key], lease_ms: int) -> list[Claim]:
        """DONE when the key looks committed (wrongly, at ``error_rate``), else NEW or
        HELD from the claims' table."""
        out: list[Claim] = []
        with self._lock:
            take = self._claims.take
            now = self._claims.clock()
            for k in keys:
                kb = key_bytes(k)
                out.append(DONE if self._looks_set(kb) else take(kb, lease_ms, now))
        return out

    def _looks_set(self, key: bytes) -> bool:
        if self._erased and key in self._erased:
            return False
        buf = self._buf
        return all(buf[p >> 3] & (1 << (p & 7)) for p in _positions(key, self.bits, self.hashes))

    def commit_many(self, keys: Sequence[Key]) -> None:
        """Into the filter (an erase record of the key is consumed); the claims end."""
        with self._lock:
            for k in keys:
                kb = key_bytes(k)
                self._claims.drop(kb)
                self._cas(kb)

    def release_many(self, keys: Sequence[Key]) -> None:
        with self._lock:
            for k in keys:
                self._claims.drop(key_bytes(k))

    def renew_many(self, keys: Sequence[Key], lease_ms: int) -> None:
        with self._lock:
            now = self._claims.clock()
            for k in keys:
                self._claims.renew(key_bytes(k), lease_ms, now)

    @property
    def memory_bytes(self) -> int:
        """Bytes held (the bit array and the objects around it; erased-key records not
        counted, they are transient)."""
        return sys.getsizeof(self._buf) + sys.getsizeof(self)


# -- Redis -----------------------------------------------------------------------------

# Bit-array fallback: set k bits, "seen" if all were set already. KEYS: bits, erased-mark.
_LUA_BITS = """
local seen = 1
for i = 1, #ARGV do
  if redis.call('SETBIT', KEYS[1], ARGV[i], 1) == 0 then seen = 0 end
end
if redis.call('DEL', KEYS[2]) == 1 then return 0 end
return seen
"""

# RedisBloom module (BF.ADD answers 1 when the item was surely not there).
_LUA_MODULE = """
local added = redis.call('BF.ADD', KEYS[1], ARGV[1])
if redis.call('DEL', KEYS[2]) == 1 then return 0 end
return 1 - added
"""

# Batches: KEYS = filter, then one erase mark per key; ARGV = k, then k positions per key.
_LUA_BITS_MANY = """
local k = tonumber(ARGV[1])
local out = {}
for j = 1, #KEYS - 1 do
  local seen = 1
  local base = 1 + (j - 1) * k
  for i = 1, k do
    if redis.call('SETBIT', KEYS[1], ARGV[base + i], 1) == 0 then seen = 0 end
  end
  if redis.call('DEL', KEYS[j + 1]) == 1 then seen = 0 end
  out[j] = seen
end
return out
"""

# KEYS = filter, then one erase mark per key; ARGV = the items.
_LUA_MODULE_MANY = """
local out = {}
for j = 1, #ARGV do
  local seen = 1 - redis.call('BF.ADD', KEYS[1], ARGV[j])
  if redis.call('DEL', KEYS[j + 1]) == 1 then seen = 0 end
  out[j] = seen
end
return out
"""


# Claims. KEYS = the filter, then per key its claim key and its erase mark; ARGV = our
# claim value, lease (ms), k (0: the module), then per key the item (module) or its k bit
# positions. Answers per key: -1 new, 0 committed (looks set, not erased), n > 0 held.
_LUA_CLAIM = """
local claim, lease, k = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out = {}
for j = 1, (#KEYS - 1) / 2 do
  local done = redis.call('EXISTS', KEYS[2 * j + 1]) == 0
  if done then
    if k == 0 then
      done = redis.call('BF.EXISTS', KEYS[1], ARGV[3 + j]) == 1
    else
      local base = 3 + (j - 1) * k
      for i = 1, k do
        if redis.call('GETBIT', KEYS[1], ARGV[base + i]) == 0 then done = false; break end
      end
    end
  end
  if done then
    out[j] = 0
  elseif redis.call('SET', KEYS[2 * j], claim, 'NX', 'PX', lease) then
    out[j] = -1
  else
    local left = redis.call('PTTL', KEYS[2 * j])
    if left == -1 then left = tonumber(lease) elseif left < 1 then left = 1 end
    out[j] = left
  end
end
return out
"""

# Commit. KEYS as for a claim; ARGV = our claim value, k (0: the module), then per key the
# item or its positions. Into the filter, the erase mark consumed, our claim ended.
_LUA_COMMIT = """
local claim, k = ARGV[1], tonumber(ARGV[2])
for j = 1, (#KEYS - 1) / 2 do
  if k == 0 then
    redis.call('BF.ADD', KEYS[1], ARGV[2 + j])
  else
    local base = 2 + (j - 1) * k
    for i = 1, k do redis.call('SETBIT', KEYS[1], ARGV[base + i], 1) end
  end
  redis.call('DEL', KEYS[2 * j + 1])
  if redis.call('GET', KEYS[2 * j]) == claim then redis.call('DEL', KEYS[2 * j]) end
end
return 0
"""

# keys per claim or commit script run (each key: a few commands in the script)
_CLAIM_BATCH = 2000


class RedisBloomFilter(PicklableBySpec):
    """A Bloom filter in Redis, shared by every consumer that uses the same ``name``.

    Uses the RedisBloom module's ``BF.ADD`` when the server has it (``module="auto"``;
    ``True`` requires it, ``False`` never uses it), else a plain bit array in a Redis
    string, updated by a Lua script that sets the k bits and answers whether all were set
    -- one atomic step, so two consumers racing on one key cannot both see it as new.

    ``client``: a ``redis.Redis`` (or anything with its API), or a ``redis://`` URL.
    ``name``: Redis key name; the keys used are ``{name}`` (the filter),
    ``{name}:params`` (bits and hashes, checked so that consumers configured differently
    fail loudly instead of corrupting each other), ``{name}:erased:<key>`` (erase
    marks, expiring after ``erase_ttl`` seconds) and ``{name}:claim:<key>`` (claims: the
    owner's token, the lease as expiry; see the module doc). The braces are a Redis
    Cluster hash tag: every script's keys are in one slot.
    ``capacity``, ``error_rate``: as for :class:`BloomFilter` -- **error_rate is the
    fraction of unique messages dropped as duplicates.** The bit array is ``bits/8`` bytes,
    allocated at once, at most 512 MiB (2^32 bits). With the module, a full filter grows
    by adding sub-filters (RedisBloom's scaling) instead of degrading.
    ``key``: ``"id"`` (default), ``"body"`` or a function of the message (``key_func``).
    """

    shared = True

    def __init__(self, client: Any, name: str = "nsq-dedup-bloom", capacity: int = 1_000_000,
                 error_rate: float = 0.001, *, key: str | KeyFunc | None = None,
                 module: bool | str = "auto", erase_ttl: int = 86400) -> None:
        if isinstance(client, str):
            import redis
            client = redis.Redis.from_url(client)
        self.client = client
        self.name = name
        self.capacity = capacity
        self.error_rate = error_rate
        self.bits, self.hashes = bloom_parameters(capacity, error_rate)
        self.key_func: KeyFunc = resolve_key(key)
        self.erase_ttl = validate.integer(erase_ttl, "erase_ttl", lo=1, hi=MAX_SECONDS,
                                          unit="seconds")
        validate.text(name, "name", nonempty=True)
        self.spec: str | None = None  # set by from_spec, for pickling into Spark tasks
        self._key = f"{{{name}}}"
        self._erased_prefix = f"{{{name}}}:erased:".encode()
        self._claim_prefix = f"{{{name}}}:claim:".encode()
        self._owner = Owner()
        self._claim_script = client.register_script(_LUA_CLAIM)
        self._commit_script = client.register_script(_LUA_COMMIT)
        self._release_script = client.register_script(LUA_CLAIM_KEYS_RELEASE)
        self._renew_script = client.register_script(LUA_CLAIM_KEYS_RENEW)
        if module != "auto" and not isinstance(module, bool):
            raise ConfigError(f"module={module!r}: give 'auto', True (require RedisBloom) or "
                              "False (the bit-array fallback)")
        if module == "auto":
            module = self.server_has_module(client)
        elif module and not self.server_has_module(client):
            raise RuntimeError(f"Redis server at {_where(client)} has no RedisBloom module (BF.ADD);"
                               " load it (loadmodule redisbloom.so, or Redis 8+) or pass "
                               "module='auto'/False to use the bit-array fallback")
        self.uses_module = bool(module)
        self._many_script = None if is_cluster(client) else client.register_script(
            _LUA_MODULE_MANY if self.uses_module else _LUA_BITS_MANY)
        if self.uses_module:
            self._script = client.register_script(_LUA_MODULE)
            self._reserve()
        else:
            if self.bits > _MAX_REDIS_BITS:
                raise ConfigError(f"Bloom filter of {self.bits} bits exceeds Redis's 2^32-bit string; "
                                 "lower capacity or raise error_rate, or use the RedisBloom module")
            self._script = client.register_script(_LUA_BITS)
            self._init_bits()

    def __repr__(self) -> str:
        return (f"RedisBloomFilter(name={self.name!r}, capacity={self.capacity}, "
                f"error_rate={self.error_rate}, module={self.uses_module})")


    @staticmethod
    def server_has_module(client: Any) -> bool:
        """Whether the server knows ``BF.ADD`` (RedisBloom loaded, or Redis 8+)."""
        try:
            info = client.execute_command("COMMAND", "INFO", "BF.ADD")
        except Exception:  # noqa: BLE001 - an old server without COMMAND INFO: no module
            return False
        return bool(info) and any(x for x in (info if isinstance(info, list) else [info]))

    def _reserve(self) -> None:
        try:
            self.client.execute_command("BF.RESERVE", self._key, self.error_rate, self.capacity)
        except Exception as exc:  # noqa: BLE001
            if "exists" not in str(exc).lower():
                raise

    def _init_bits(self) -> None:
        params = f"{self.bits}:{self.hashes}"
        pkey = f"{{{self.name}}}:params"
        self.client.setnx(pkey, params)
        stored = self.client.get(pkey)
        if stored is not None and stored.decode() != params:
            raise ValueError(f"Redis Bloom filter {self.name!r} at {_where(self.client)} was created "
                             f"with bits:hashes={stored.decode()}, this one wants {params} "
                             "(different capacity/error_rate); use the same settings in every "
                             "consumer, or another name")
        # allocate the whole string now: no surprise growth (and latency) later
        if not self.client.exists(self._key):
            self.client.setbit(self._key, self.bits - 1, 0)

    def _args(self, key: bytes) -> tuple[list[Any], list[Any]]:
        keys = [self._key, self._erased_prefix + key]
        if self.uses_module:
            return keys, [key]
        return keys, _positions(key, self.bits, self.hashes)

    def check_and_set(self, key: Key) -> bool:
        """True when ``key`` is (probably) a duplicate; a new key gets True with
        probability ``error_rate``. One round trip."""
        keys, args = self._args(key_bytes(key))
        return bool(self._script(keys=keys, args=args) == 1)

    def check_and_set_many(self, keys: Iterable[Key]) -> list[bool]:
        """A batch in one round trip and one server-side script (each key atomic; a key
        repeated in the batch is a duplicate the second time)."""
        if self._many_script is not None:
            ks = [key_bytes(k) for k in keys]
            if not ks:
                return []
            out: list[bool] = []
            bits, hashes = self.bits, self.hashes
            for i in range(0, len(ks), 2000):  # keep each script run short
                part = ks[i:i + 2000]
                marks = [self._erased_prefix + k for k in part]
                if self.uses_module:
                    res = self._many_script(keys=[self._key, *marks], args=part)
                else:
                    args: list[int] = [hashes]
                    for k in part:
                        args += _positions(k, bits, hashes)
                    res = self._many_script(keys=[self._key, *marks], args=args)
                out += [r == 1 for r in res]
            return out
        pipe = self.client.pipeline(transaction=False)
        n = 0
        for one in keys:
            script_keys, script_args = self._args(key_bytes(one))
            self._script(keys=script_keys, args=script_args, client=pipe)
            n += 1
        if not n:
            return []
        return [r == 1 for r in pipe.execute()]

    def contains_many(self, keys: Iterable[Key]) -> list[bool]:
        """Whether each key looks seen, without adding any (one pipelined round trip;
        an erased key counts as not seen)."""
        pipe = self.client.pipeline(transaction=False)
        n = 0
        for k in keys:
            kb = key_bytes(k)
            if self.uses_module:
                pipe.execute_command("BF.EXISTS", self._key, kb)
            else:
                ops: list[Any] = []
                for p in _positions(kb, self.bits, self.hashes):
                    ops += ["GET", "u1", p]
                pipe.execute_command("BITFIELD_RO", self._key, *ops)
            pipe.exists(self._erased_prefix + kb)
            n += 1
        if not n:
            return []
        res = pipe.execute()
        out = []
        for i in range(0, len(res), 2):
            hit = res[i] == 1 if self.uses_module else all(res[i])
            out.append(hit and not res[i + 1])
        return out

    def __contains__(self, key: Key) -> bool:
        return self.contains_many([key])[0]

    def erase(self, key: Key) -> None:
        """Mark ``key`` so that its next ``check_and_set`` answers "new"."""
        self.client.set(self._erased_prefix + key_bytes(key), b"1", ex=self.erase_ttl)

    def erase_many(self, keys: Iterable[Key]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.set(self._erased_prefix + key_bytes(k), b"1", ex=self.erase_ttl)
        pipe.execute()

    # -- claim, then commit (the module doc) ----------------------------------------------

    def _claim_args(self, part: list[bytes]) -> tuple[list[bytes], list[Any]]:
        """KEYS (filter, then claim key and erase mark per key) and the per-key ARGV
        tail (the item, or its k positions) of a claim or commit script."""
        keys: list[bytes] = [self._key.encode()]
        for k in part:
            keys += (self._claim_prefix + k, self._erased_prefix + k)
        if self.uses_module:
            return keys, list(part)
        tail: list[Any] = []
        for k in part:
            tail += _positions(k, self.bits, self.hashes)
        return keys, tail

    def claim_many(self, keys: Sequence[Key], lease_ms: int) -> list[Claim]:
        """One script run (one round trip) per 2,000 keys; DONE when the key looks set
        (wrongly, at ``error_rate``) and was not erased."""
        ks = [key_bytes(k) for k in keys]
        mine = claim_value(self._owner.token())
        k = 0 if self.uses_module else self.hashes
        out: list[Claim] = []
        for i in range(0, len(ks), _CLAIM_BATCH):
            skeys, tail = self._claim_args(ks[i:i + _CLAIM_BATCH])
            res = self._claim_script(keys=skeys, args=[mine, lease_ms, k, *tail])
            out += [NEW if r == -1 else DONE if r == 0 else held(int(r)) for r in res]
        return out

    def commit_many(self, keys: Sequence[Key]) -> None:
        """Into the filter (an erase mark consumed); our claims end. One round trip per
        2,000 keys."""
        ks = [key_bytes(k) for k in keys]
        mine = claim_value(self._owner.token())
        k = 0 if self.uses_module else self.hashes
        for i in range(0, len(ks), _CLAIM_BATCH):
            skeys, tail = self._claim_args(ks[i:i + _CLAIM_BATCH])
            self._commit_script(keys=skeys, args=[mine, k, *tail])

    def release_many(self, keys: Sequence[Key]) -> None:
        """Our claims end (compare-and-delete); the filter is never touched."""
        run_on_keys(self.client, self._release_script,
                    [self._claim_prefix + key_bytes(k) for k in keys],
                    [claim_value(self._owner.token())], False)  # one slot: {name}

    def renew_many(self, keys: Sequence[Key], lease_ms: int) -> None:
        run_on_keys(self.client, self._renew_script,
                    [self._claim_prefix + key_bytes(k) for k in keys],
                    [claim_value(self._owner.token()), lease_ms], False)

    def memory_bytes(self) -> int:
        """What Redis reports for the filter key (``MEMORY USAGE``)."""
        return int(self.client.memory_usage(self._key, samples=0) or 0)

    def clear(self) -> None:
        """Delete the filter (and its parameters) from Redis, then recreate it empty."""
        self.client.delete(self._key, f"{{{self.name}}}:params")
        if self.uses_module:
            self._reserve()
        else:
            self._init_bits()


def _where(client: Any) -> str:
    try:
        kw = client.connection_pool.connection_kwargs
        return f"{kw.get('host', '?')}:{kw.get('port', '?')}"
    except AttributeError:
        return "?"
