"""The opposite of a Bloom filter: bounded memory, never a false "seen", forgets.

A Bloom filter may say "seen" for a key it never saw (a false positive: a unique message
dropped) but never forgets. This structure makes the other trade: a fixed array of N
buckets, each holding the fingerprint of the *last* key hashed to it. A key is "seen" only
when its bucket holds exactly its fingerprint, so

* it never says "seen" for a key it has not seen -- exactly so when it stores the keys
  themselves (``digest_size=None``, or keys that are exactly ``digest_size`` bytes long,
  such as NSQ message ids and body digests with the default 16); otherwise it stores a
  ``b``-byte digest, and a new key is reported seen only if its digest equals the one
  in its bucket, probability at most ``2**(-8*b)`` per check (16 bytes, the default:
  2^-128, never in practice; 4 bytes: 2^-32, about one false "seen" per 4 billion checks
  of new keys). A shortened digest thus turns "never" into "rarely" -- each false
  "seen" drops a unique message -- in exchange for memory;
* it forgets: a key survives ``x`` later inserts with probability ``(1 - 1/N) ** x``,
  so a duplicate that arrives late can be missed (processed twice -- which at-least-once
  consumers must tolerate anyway).

Sizing comes from that arithmetic; see :meth:`OppositeBloomFilter.size_for`.

Claim, then commit (:class:`~nsq_spark.dedup.ClaimingDeduplicator`, what the Reader
uses): committed keys live in the buckets as above; claims live beside them in a small
table of leases (:class:`~nsq_spark.dedup.base.ClaimTable`, at most ``max_claims``,
normally the messages in flight), so that a message whose handler fails or never
returns is never remembered as handled, and a copy arriving meanwhile is requeued. A
release only drops a claim: it can never un-commit a key.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from hashlib import blake2b
from typing import Callable, Iterable, Sequence

from .. import _validate as validate
from ..errors import ConfigError
from .._validate import MAX_MEMORY_BYTES
from .base import DONE, NEW, Claim, ClaimTable, Key, KeyFunc, key_bytes, resolve_key

__all__ = ["OppositeBloomFilter"]


class OppositeBloomFilter:
    """In-process, bounded-memory deduplicator that never reports a false duplicate.

    ``size``: number of buckets N (one remembered key each). Memory is ``size *
    digest_size`` bytes in one preallocated ``bytearray`` (plus ~100 bytes), or with
    ``digest_size=None`` one pointer per bucket plus the key objects themselves (for a
    16-byte NSQ id about 57 bytes a bucket). Use :meth:`size_for` to choose N.

    ``digest_size``: bytes stored per bucket (1..64; default 16): keys of exactly that
    length are stored as they are (exact), others as a BLAKE2b digest of that length.
    Shorter saves memory and allows false "seen" answers -- a unique message dropped --
    with probability at most ``2**(-8*digest_size)`` per check; ``None`` stores every key
    object itself (exact, fastest, most memory).

    ``key``: the key function the Reader applies to each message -- ``"id"`` (NSQ message
    id, redeliveries; the default), ``"body"`` (body digest, publisher retries) or a
    function of the message. Exposed as ``key_func``.

    ``max_claims``: the most claims (leases of messages being handled) kept at once;
    ``clock``: seconds, monotonic (tests move it). See the module doc.

    Thread-safe: every method is atomic (one lock; under the GIL a lock per stripe
    measured no faster, and the batch methods take the lock once per batch).
    Process-local: Spark tasks or several consumer processes do not share it -- use
    :class:`~nsq_spark.dedup.RedisDeduplicator` there.
    """

    shared = False  # other processes do not see what this one remembers

    def __init__(self, size: int, digest_size: int | None = 16, *,
                 key: str | KeyFunc | None = None, max_claims: int = 1 << 16,
                 clock: Callable[[], float] = time.monotonic) -> None:
        validate.integer(size, "OppositeBloomFilter size", lo=1, unit="buckets",
                         hint="OppositeBloomFilter.size_for(rate, window, probability) "
                         "computes one")
        validate.integer(digest_size, "digest_size", lo=1, hi=64, unit="bytes",
                         none="store the keys themselves")
        per_bucket = digest_size or 8  # key mode: one pointer a bucket, keys not counted
        if size * per_bucket > MAX_MEMORY_BYTES:
            raise ConfigError(
                f"OppositeBloomFilter(size={size}, digest_size={digest_size}) needs "
                f"{size * per_bucket:,} bytes, over the in-process cap of "
                f"{MAX_MEMORY_BYTES:,} (nsq_spark._validate.MAX_MEMORY_BYTES): lower size or "
                "digest_size, or use an exact store (RedisDeduplicator)")
        self.size = size
        self.digest_size = digest_size
        self.key_func: KeyFunc = resolve_key(key)
        self._lock = threading.Lock()
        if digest_size is None:
            self._slots: list[bytes | None] = [None] * size
            self._buf = bytearray()
        else:
            self._slots = []
            self._buf = bytearray(size * digest_size)  # zeros: "empty"
        self._empty = bytes(digest_size or 0)  # an empty bucket
        validate.integer(max_claims, "max_claims", lo=1, unit="claims")
        self._claims = ClaimTable(max_claims, clock)

    def __repr__(self) -> str:
        return (f"OppositeBloomFilter(size={self.size}, digest_size={self.digest_size}, "
                f"key={getattr(self.key_func, '__name__', self.key_func)!r})")

    # -- the interface ------------------------------------------------------------------
    #
    # Bucket index: Python's own hash of the key bytes (SipHash, cached on the bytes
    # object, randomised per process -- harmless for a structure that lives in one
    # process). Fingerprint: the key itself when it is exactly digest_size bytes (NSQ
    # message ids and by_body_digest keys with the default 16: exact, and no second hash),
    # else a BLAKE2b digest of digest_size bytes. Index and fingerprint come from
    # independent hashes, so every stored bit counts against false "seen" answers.

    def _fingerprint(self, key: bytes) -> bytes:
        ds = self.digest_size
        if len(key) == ds and key != self._empty:
            return key
        return blake2b(key, digest_size=ds).digest()  # type: ignore[arg-type]

    def check_and_set(self, key: Key) -> bool:
        """True when ``key`` is remembered (a duplicate); otherwise remember it, False."""
        if type(key) is not bytes:
            key = key_bytes(key)
        ds = self.digest_size
        if ds is None:
            i = hash(key) % self.size
            slots = self._slots
            with self._lock:
                if slots[i] == key:
                    return True
                slots[i] = key
                return False
        fp = key if len(key) == ds and key != self._empty else blake2b(key, digest_size=ds).digest()
        o = hash(key) % self.size * ds
        buf = self._buf
        with self._lock:
            if buf.startswith(fp, o):  # compares in place, no slice copy
                return True
            buf[o:o + ds] = fp
            return False

    def erase(self, key: Key) -> None:
        """Forget ``key`` if its bucket still holds it (a later key that overwrote the
        bucket is left alone). For messages whose handling failed."""
        key = key_bytes(key)
        ds = self.digest_size
        if ds is None:
            i = hash(key) % self.size
            with self._lock:
                if self._slots[i] == key:
                    self._slots[i] = None
            return
        fp = self._fingerprint(key)
        o = hash(key) % self.size * ds
        with self._lock:
            if self._buf.startswith(fp, o):
                self._buf[o:o + ds] = self._empty

    def __contains__(self, key: Key) -> bool:
        """Whether ``key`` is remembered, without remembering it."""
        key = key_bytes(key)
        ds = self.digest_size
        if ds is None:
            return self._slots[hash(key) % self.size] == key
        return self._buf.startswith(self._fingerprint(key), hash(key) % self.size * ds)

    def check_and_set_many(self, keys: Iterable[Key]) -> list[bool]:
        """``check_and_set`` for a batch, in order, atomically as a whole (cheaper per
        key than single calls: one lock, local names)."""
        out: list[bool] = []
        app = out.append
        size = self.size
        ds = self.digest_size
        with self._lock:
            if ds is None:
                slots = self._slots
                for key in keys:
                    if type(key) is not bytes:
                        key = key_bytes(key)
                    i = hash(key) % size
                    if slots[i] == key:
                        app(True)
                    else:
                        slots[i] = key
                        app(False)
                return out
            buf = self._buf
            starts = buf.startswith
            empty = self._empty
            for key in keys:
                if type(key) is not bytes:
                    key = key_bytes(key)
                fp = key if len(key) == ds and key != empty else blake2b(key, digest_size=ds).digest()
                o = hash(key) % size * ds
                if starts(fp, o):
                    app(True)
                else:
                    buf[o:o + ds] = fp
                    app(False)
        return out

    def contains_many(self, keys: Iterable[Key]) -> list[bool]:
        """Whether each key is remembered, without remembering any."""
        return [k in self for k in keys]

    def erase_many(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self.erase(key)

    # -- claim, then commit (the module doc) ----------------------------------------------

    def _holds(self, key: bytes) -> bool:
        """Whether ``key``'s bucket holds it (committed); the caller holds the lock."""
        ds = self.digest_size
        if ds is None:
            return self._slots[hash(key) % self.size] == key
        fp = key if len(key) == ds and key != self._empty else blake2b(key, digest_size=ds).digest()
        return self._buf.startswith(fp, hash(key) % self.size * ds)

    def claim_many(self, keys: Sequence[Key], lease_ms: int) -> list[Claim]:
        """DONE for a committed key, else NEW (claimed for ``lease_ms``, or an expired
        claim taken over) or HELD (a live claim): see
        :class:`~nsq_spark.dedup.ClaimingDeduplicator`."""
        out: list[Claim] = []
        app = out.append
        size = self.size
        ds = self.digest_size
        empty = self._empty
        slots, starts = self._slots, self._buf.startswith
        with self._lock:
            claims = self._claims
            take = claims.take
            deadlines = claims._deadlines
            room = claims.max_claims - len(deadlines)
            now = claims.clock()
            until = now + lease_ms / 1000.0
            for key in keys:
                if type(key) is not bytes:
                    key = key_bytes(key)
                # committed? (inline _holds: this loop is per message)
                if ds is None:
                    if slots[hash(key) % size] == key:
                        app(DONE)
                        continue
                else:
                    fp = key if len(key) == ds and key != empty else \
                        blake2b(key, digest_size=ds).digest()
                    if starts(fp, hash(key) % size * ds):
                        app(DONE)
                        continue
                if room > 0 and key not in deadlines:  # the common case: a new claim
                    deadlines[key] = until
                    room -= 1
                    app(NEW)
                else:
                    app(take(key, lease_ms, now))
                    room = claims.max_claims - len(deadlines)
        return out

    def commit_many(self, keys: Sequence[Key]) -> None:
        """The keys were handled: into their buckets; their claims end."""
        ds = self.digest_size
        size = self.size
        with self._lock:
            drop = self._claims._deadlines.pop
            for key in keys:
                if type(key) is not bytes:
                    key = key_bytes(key)
                drop(key, None)
                if ds is None:
                    self._slots[hash(key) % size] = key
                    continue
                fp = key if len(key) == ds and key != self._empty else \
                    blake2b(key, digest_size=ds).digest()
                o = hash(key) % size * ds
                self._buf[o:o + ds] = fp

    def release_many(self, keys: Sequence[Key]) -> None:
        """Our claims on ``keys`` end (a committed key stays committed)."""
        drop = self._claims.drop
        with self._lock:
            for key in keys:
                drop(key if type(key) is bytes else key_bytes(key))

    def renew_many(self, keys: Sequence[Key], lease_ms: int) -> None:
        """Our live claims on ``keys`` last ``lease_ms`` more (a TOUCH)."""
        with self._lock:
            claims = self._claims
            now = claims.clock()
            for key in keys:
                claims.renew(key if type(key) is bytes else key_bytes(key), lease_ms, now)

    @property
    def claims(self) -> int:
        """Live and expired claims held now (they end at commit or release)."""
        return len(self._claims)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._claims = ClaimTable(self._claims.max_claims, self._claims.clock)
            if self.digest_size is None:
                self._slots[:] = [None] * self.size
            else:
                self._buf[:] = bytes(len(self._buf))  # same size: in place

    # -- memory and sizing --------------------------------------------------------------

    @property
    def memory_bytes(self) -> int:
        """Bytes held now, Python object overhead included (in key mode: the list plus
        every distinct stored key object)."""
        if self.digest_size is not None:
            return sys.getsizeof(self._buf) + sys.getsizeof(self)
        seen: set[int] = set()
        total = sys.getsizeof(self._slots) + sys.getsizeof(self)
        for k in self._slots:
            if k is not None and id(k) not in seen:
                seen.add(id(k))
                total += sys.getsizeof(k)
        return total

    @staticmethod
    def probability_remembered(size: int, inserts: int) -> float:
        """Probability that a key is still remembered after ``inserts`` more keys went
        into ``size`` buckets: ``(1 - 1/size) ** inserts`` (each insert lands elsewhere
        with probability 1 - 1/N). Its complement is the chance it was overwritten."""
        validate.integer(size, "size", lo=1, unit="buckets")
        validate.number(inserts, "inserts", lo=0)
        if size == 1:
            return 1.0 if inserts == 0 else 0.0
        return math.exp(inserts * math.log1p(-1.0 / size))

    @staticmethod
    def inserts_until_forgotten(size: int, probability: float) -> int:
        """The fewest later inserts after which a key has been overwritten with at least
        ``probability``: 459 for 100 buckets and 0.99."""
        validate.integer(size, "size", lo=1, unit="buckets")
        validate.number(probability, "probability", lo=0, hi=1, lo_open=True, hi_open=True)
        if size == 1:
            return 1
        x = math.ceil(math.log1p(-probability) / math.log1p(-1.0 / size))
        # guard the float rounding at the boundary
        while x > 0 and 1 - OppositeBloomFilter.probability_remembered(size, x - 1) >= probability:
            x -= 1
        while 1 - OppositeBloomFilter.probability_remembered(size, x) < probability:
            x += 1
        return x

    @staticmethod
    def size_for(rate_per_second: float, window_seconds: float, probability: float) -> int:
        """Buckets needed so that a duplicate arriving ``window_seconds`` after the
        original, with ``rate_per_second`` other keys inserted meanwhile, is still caught
        with ``probability``: the smallest N with ``(1 - 1/N) ** (rate * window) >=
        probability``, i.e. ``N = 1 / (1 - probability ** (1 / (rate * window)))``.

        1,000 events/s and one hour: 34,168,399 buckets to catch 90% of such late
        duplicates; 1,563,461 buckets catch only 10% (with those, the key has been
        overwritten with 90% probability). Memory grows like ``rate * window /
        -ln(probability)``: redeliveries (which arrive within nsqd's ``msg_timeout``,
        60 s by default) are cheap to catch, hour-late publisher retries are not -- use an
        exact store or a Bloom filter for those (the table on the Deduplication page,
        ``docs/dedup.md``). More than
        :data:`~nsq_spark._validate.MAX_MEMORY_BYTES` buckets raise a ConfigError.
        """
        validate.number(rate_per_second, "size_for rate_per_second", lo=0, lo_open=True,
                        unit="keys per second")
        validate.seconds(window_seconds, "size_for window_seconds")
        validate.number(probability, "size_for probability", lo=0, hi=1, lo_open=True,
                        hi_open=True, hint="the chance that a duplicate arriving "
                        "window_seconds later is caught")
        x = rate_per_second * window_seconds
        needed = 1.0 / -math.expm1(math.log(probability) / x)
        if not needed <= MAX_MEMORY_BYTES:  # even at 1 byte a bucket: over the memory cap
            raise ConfigError(
                f"size_for(rate_per_second={rate_per_second}, window_seconds={window_seconds}, "
                f"probability={probability}) needs {needed:.3g} buckets, over the in-process "
                f"cap of {MAX_MEMORY_BYTES:,} bytes (nsq_spark._validate.MAX_MEMORY_BYTES); use "
                "an exact store (RedisDeduplicator) for such windows")
        n = math.ceil(needed)
        n = max(n, 1)
        while n > 1 and OppositeBloomFilter.probability_remembered(n - 1, round(x)) >= probability:
            n -= 1
        while OppositeBloomFilter.probability_remembered(n, round(x)) < probability:
            n += 1
        return n
