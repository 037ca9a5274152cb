"""The deduplication interfaces and the key functions.

A deduplicator remembers the keys of messages already handled. NSQ delivers at least
once, so the same message can arrive twice in two ways, and each needs its own key:

* a *redelivery* (timeout, REQ, lost connection) carries the same NSQ message id:
  key it with :func:`by_message_id`;
* a *publisher retry* (the PUB was sent again after an unclear answer) carries the same
  body under a new id: key it with :func:`by_body_digest`;
* a *copy of one publish* on another nsqd (replicated publishing), or a publisher's
  retry, carries the same publish id under a new message id, when the publisher stamped
  one (``Producer(publish_ids=True)``, implied by ``replicas``): key it with
  :func:`by_publish_id` (``dedup_key="publish_id"``);
* anything else (a business id inside the body, say): pass your own function of the
  message returning ``bytes`` or ``str``.

A key function may return None for a message it has no key for (:func:`by_publish_id`
for a message without a publish id): such a message is never taken for a duplicate.

Two interfaces:

* :class:`ClaimingDeduplicator`, what the consumer and the Spark source use: **claim,
  then commit**. A message's key is *claimed* with a lease (about nsqd's message timeout)
  before the message is handed over, *committed* (remembered for the dedup window) once
  it was handled, *released* when its handling failed or it was given back. A claim
  answers :data:`NEW` (ours now: hand the message over), :data:`DONE` (committed before:
  a duplicate) or ``held(ms)`` (claimed by someone else whose lease is live: requeue the
  copy for about that long, never finish it); an expired claim is taken over (NEW). A
  consumer killed inside its handler therefore loses nothing: its claim expires and the
  redelivery is handled. A claim is owned by the deduplicator object that made it (a
  token per object and process): release and renew touch only its own claims, and
  nothing un-commits a committed key.
* :class:`Deduplicator`, the older one-step interface (``check_and_set``, ``erase``): the
  key is marked when the message *arrives*, so a consumer that dies before handling it
  loses it (its redelivery is taken for a duplicate). Every structure of
  :mod:`nsq_spark.dedup` still has it; a user-made deduplicator that has only it is
  adapted by :func:`claiming` (:class:`LocalClaims`: claims kept in the process, commits
  through ``check_and_set``; see there what that can promise across processes).
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import math
import os
import secrets
import threading
import time
from typing import Any, Callable, Iterable, NamedTuple, Protocol, Sequence, Union, runtime_checkable

from .._log import get_logger

Key = Union[bytes, str]
KeyFunc = Callable[[Any], Union[Key, None]]  # None: no key, never a duplicate

__all__ = [
    "Deduplicator", "ClaimingDeduplicator", "Claim", "ClaimState", "NEW", "DONE", "held",
    "HELD_MARGIN_MS", "claiming", "LocalClaims", "ClaimTable", "Owner",
    "Key", "KeyFunc", "by_message_id", "by_body_digest", "by_publish_id",
    "resolve_key",
    "key_bytes", "check_and_set_many", "erase_many", "contains_many",
]

log = get_logger(__name__)


@runtime_checkable
class Deduplicator(Protocol):
    """The one-step interface (kept for users: every structure has it; the Reader and
    the Spark source use :class:`ClaimingDeduplicator`, and adapt a deduplicator that
    has only this one with :func:`claiming`); the documentation's Deduplication page
    (``docs/dedup.md``) says which structure fits which use.

    ``check_and_set(key)`` returns True when ``key`` was seen before (a duplicate: drop
    it) and False when it is new; either way the key is remembered afterwards, and the
    check and the set are one atomic step (two consumers racing on the same key: exactly
    one gets False). ``erase(key)`` forgets the key, so that a message whose handling
    failed is processed again when nsqd redelivers it.
    """

    def check_and_set(self, key: Key) -> bool: ...

    def erase(self, key: Key) -> None: ...


class ClaimState(enum.Enum):
    """What a claim found (:class:`Claim`)."""

    NEW = "new"    #: claimed by us now: hand the message over
    DONE = "done"  #: committed earlier: a duplicate, finish it unhandled
    HELD = "held"  #: claimed by someone else, lease live: requeue it, never finish it


class Claim(NamedTuple):
    """The answer of :meth:`ClaimingDeduplicator.claim_many` for one key; ``left_ms``:
    for HELD, the milliseconds left on the holder's lease (at least 1), else 0."""

    state: ClaimState
    left_ms: int = 0


#: the key is ours now
NEW = Claim(ClaimState.NEW)
#: the key was committed: a duplicate
DONE = Claim(ClaimState.DONE)


#: milliseconds added to a held copy's requeue delay, so that it comes back after the
#: holder's lease has ended (nsqd looks at its deferred messages every 100 ms by default)
HELD_MARGIN_MS = 100


def held(left_ms: float) -> Claim:
    """Claimed by someone else for ``left_ms`` more milliseconds (at least 1)."""
    return Claim(ClaimState.HELD, max(1, math.ceil(left_ms)))


@runtime_checkable
class ClaimingDeduplicator(Protocol):
    """The claim-then-commit port: what the Reader's dedup gate and the Spark source's
    ``dedup`` option use (the module doc says why). Every method takes a batch and
    costs one lock, or one round trip to a shared store, per call; keys are ``bytes``
    or ``str`` (compared as UTF-8 bytes).

    ``claim_many(keys, lease_ms)``: one :class:`Claim` per key, in order, each atomic
    (two consumers claiming one key: exactly one gets NEW); a key repeated in the batch is
    HELD the second time (we hold it). A live claim of this very object is HELD too
    (another handler of this process has the key).
    ``commit_many(keys)``: the messages were handled: remember the keys for the dedup
    window (the claims end), whoever holds a claim on them.
    ``release_many(keys)``: the handling failed, or the message was given back
    unhandled: end *our* claims (a claim taken over by someone else, and a committed key,
    are left alone).
    ``renew_many(keys, lease_ms)``: a TOUCH: our live claims last ``lease_ms`` more.
    """

    def claim_many(self, keys: Sequence[Key], lease_ms: int) -> list[Claim]: ...

    def commit_many(self, keys: Sequence[Key]) -> None: ...

    def release_many(self, keys: Sequence[Key]) -> None: ...

    def renew_many(self, keys: Sequence[Key], lease_ms: int) -> None: ...


_CLAIM_METHODS = ("claim_many", "commit_many", "release_many", "renew_many")


class Owner:
    """The owner token of a deduplicator's claims in a shared store: random, one per
    object and process (a forked child gets its own at its first call, so that parent
    and child never take each other's claims for their own)."""

    __slots__ = ("_pid", "_token", "bits")

    def __init__(self, bits: int = 64) -> None:
        self.bits = bits
        self._pid = -1
        self._token = 0

    def token(self) -> int:
        """A nonzero integer of ``bits`` bits."""
        pid = os.getpid()
        if pid != self._pid:
            self._pid = pid
            self._token = secrets.randbits(self.bits) or 1
        return self._token


class ClaimTable:
    """Claims kept in one process: key -> the lease's deadline (the clock's seconds).
    Not thread-safe: its owner calls it under its own lock (the structures do).

    Bounded: at most ``max_claims`` claims. When full, expired claims go first; if all
    are live, the oldest is dropped (logged once): its message may then be handled twice
    -- never lost, as a dropped claim only lets a copy through. Claims are normally few
    (the messages in flight: handlers running), so the bound is only reached when
    handlers neither succeed nor fail for a lease after lease.
    """

    def __init__(self, max_claims: int = 1 << 16,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_claims = max_claims
        self.clock = clock
        self._deadlines: dict[bytes, float] = {}
        self.dropped = 0  # live claims dropped for room
        self._warned = False

    def __len__(self) -> int:
        return len(self._deadlines)

    def __contains__(self, key: bytes) -> bool:
        return key in self._deadlines

    def take(self, key: bytes, lease_ms: int, now: float) -> Claim:
        """NEW (ours now, also an expired claim taken over) or HELD (a live claim)."""
        d = self._deadlines
        deadline = d.get(key)
        if deadline is not None:
            if deadline > now:
                return held((deadline - now) * 1000.0)
            del d[key]  # expired: taken over (and moved to the end of the order)
        elif len(d) >= self.max_claims:
            self._make_room(now)
        d[key] = now + lease_ms / 1000.0
        return NEW

    def _make_room(self, now: float) -> None:
        d = self._deadlines
        # insertion order is about deadline order (leases are about equal): the expired
        # ones are at the front; a few at a time, so that a full table of live claims
        # costs each new claim a bounded look
        for k in [k for k in itertools.islice(d, 64) if d[k] <= now]:
            del d[k]
        if len(d) >= self.max_claims:
            del d[next(iter(d))]
            self.dropped += 1
            if not self._warned:
                self._warned = True
                log.warning("more than %d live dedup claims in this process: the oldest "
                            "was dropped (its message may be handled twice); handlers "
                            "that neither finish nor fail keep their claims", self.max_claims)

    def drop(self, key: bytes) -> None:
        self._deadlines.pop(key, None)

    def renew(self, key: bytes, lease_ms: int, now: float) -> None:
        """A live claim lasts ``lease_ms`` from ``now``; an expired or unknown one is left."""
        d = self._deadlines
        deadline = d.get(key)
        if deadline is not None and deadline > now:
            del d[key]
            d[key] = now + lease_ms / 1000.0


class LocalClaims:
    """The claim-then-commit port over a deduplicator that has only ``check_and_set`` /
    ``erase`` (and maybe ``contains_many`` or ``__contains__``): what :func:`claiming`
    makes of a user-made one.

    Claims are kept in this object (a :class:`ClaimTable`); a key is DONE when the
    deduplicator contains it, and committed by ``check_and_set`` once handled; release
    only forgets our claim (nothing was marked). So, within one process (one Reader, or
    every Reader given this adapter), it promises what the claiming structures promise:
    a consumer that fails or loses its connection inside the handler loses nothing, a
    copy arriving while the first is handled is requeued, not finished. Across processes
    sharing the deduplicator's store it cannot: claims are not shared, so two processes
    may handle one message at the same time (a duplicate, never a loss); and when the
    deduplicator has no ``contains`` method, the check marks the key for an instant
    (``check_and_set``, then ``erase`` for a new key), in which another process checking
    the same key takes it for a duplicate -- the one way left to drop a copy. Implement
    :class:`ClaimingDeduplicator` (or use a structure of :mod:`nsq_spark.dedup`) for
    those promises across processes.
    """

    def __init__(self, dedup: Deduplicator, max_claims: int = 1 << 16,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.dedup = dedup
        self.key_func: KeyFunc | None = getattr(dedup, "key_func", None)
        self.claims = ClaimTable(max_claims, clock)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LocalClaims({self.dedup!r})"

    def _contains(self, keys: list[bytes]) -> list[bool]:
        d: Any = self.dedup
        own = getattr(d, "contains_many", None)
        if own is not None:
            found: list[bool] = list(own(keys))
            return found
        if getattr(type(d), "__contains__", None) is not None:
            return [k in d for k in keys]
        return contains_many(d, keys)

    def claim_many(self, keys: Sequence[Key], lease_ms: int) -> list[Claim]:
        ks = [key_bytes(k) for k in keys]
        unique = list(dict.fromkeys(ks))  # a repeat must not mark-and-find itself
        done = {k for k, c in zip(unique, self._contains(unique)) if c}
        with self._lock:
            now = self.claims.clock()
            take = self.claims.take
            return [DONE if k in done else take(k, lease_ms, now) for k in ks]

    def commit_many(self, keys: Sequence[Key]) -> None:
        ks = [key_bytes(k) for k in keys]
        check_and_set_many(self.dedup, ks)
        with self._lock:
            for k in ks:
                self.claims.drop(k)

    def release_many(self, keys: Sequence[Key]) -> None:
        with self._lock:
            for k in keys:
                self.claims.drop(key_bytes(k))

    def renew_many(self, keys: Sequence[Key], lease_ms: int) -> None:
        with self._lock:
            now = self.claims.clock()
            for k in keys:
                self.claims.renew(key_bytes(k), lease_ms, now)


def claiming(dedup: Any) -> ClaimingDeduplicator:
    """``dedup`` as the claim-then-commit port: itself when it has the four methods of
    :class:`ClaimingDeduplicator` (every structure of :mod:`nsq_spark.dedup` does), a
    :class:`LocalClaims` adapter when it has only ``check_and_set`` and ``erase``;
    TypeError otherwise."""
    if all(callable(getattr(dedup, n, None)) for n in _CLAIM_METHODS):
        port: ClaimingDeduplicator = dedup
        return port
    if callable(getattr(dedup, "check_and_set", None)) and callable(getattr(dedup, "erase", None)):
        return LocalClaims(dedup)
    missing = [n for n in _CLAIM_METHODS if not callable(getattr(dedup, n, None))]
    raise TypeError(f"a deduplicator needs claim_many, commit_many, release_many and "
                    f"renew_many (nsq_spark.dedup.ClaimingDeduplicator; missing: "
                    f"{', '.join(missing)}), or at least check_and_set(key) and erase(key); "
                    f"got {type(dedup).__name__}")


def key_bytes(key: Key) -> bytes:
    """Keys are compared as bytes; ``str`` keys are UTF-8 encoded."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"a deduplication key must be bytes or str, not {type(key).__name__}; "
                    "make the key function return bytes or str")


def by_message_id(msg: Any) -> bytes:
    """The NSQ message id: catches redeliveries (timeout, requeue, lost connection),
    which carry the same id. Does not catch a publisher's retry (new id)."""
    mid: bytes = msg.id
    return mid


def by_body_digest(msg: Any) -> bytes:
    """A 16-byte BLAKE2b digest of the body: catches a publisher's retries (same body,
    new id) and redeliveries alike, but also drops two *distinct* messages whose bodies
    are byte-for-byte equal -- use it only when equal bodies mean the same event.
    (128 bits: two different bodies share a digest with probability ~2^-128.)"""
    return hashlib.blake2b(msg.body, digest_size=16).digest()


def by_publish_id(msg: Any) -> bytes | None:
    """The publish id (:attr:`nsq_spark.Message.publish_id`): catches the copies of one
    publish on several nsqds (``Producer(replicas=N)``), a publisher's retries (also
    those its spool resends after a crash) and redeliveries alike, while two publishes of
    equal bytes stay two messages. None (never a duplicate) for a message whose publisher
    stamped no id, or whose envelope was damaged."""
    pid: bytes | None = msg.publish_id
    return pid


_NAMED_KEYS: dict[str, KeyFunc] = {
    "id": by_message_id, "message_id": by_message_id, "msg_id": by_message_id,
    "body": by_body_digest, "body_digest": by_body_digest, "digest": by_body_digest,
    "publish_id": by_publish_id, "publish": by_publish_id,
}


def resolve_key(key: str | KeyFunc | None) -> KeyFunc:
    """``"id"`` -> :func:`by_message_id`, ``"body"`` -> :func:`by_body_digest`,
    ``"publish_id"`` -> :func:`by_publish_id`, a callable is returned as is, None means
    ``"id"``."""
    if key is None:
        return by_message_id
    if callable(key):
        return key
    if isinstance(key, str):
        try:
            return _NAMED_KEYS[key.strip().lower()]
        except KeyError:
            pass
    raise ValueError(f"unknown deduplication key {key!r}: use 'id' (NSQ message id, catches "
                     "redeliveries), 'publish_id' (the publisher's stamp: catches replicas "
                     "and retries), 'body' (digest of the body, catches publisher retries) "
                     "or a function of the message returning bytes or str")


def check_and_set_many(dedup: Deduplicator, keys: Iterable[Key]) -> list[bool]:
    """``check_and_set`` for a batch (in order; a key repeated inside the batch is a
    duplicate the second time). Uses the deduplicator's own bulk method when it has one
    (the Redis and memcached stores pipeline the batch in one round trip)."""
    bulk = getattr(dedup, "check_and_set_many", None)
    if bulk is not None:
        seen: list[bool] = bulk(keys)
        return seen
    cas = dedup.check_and_set
    return [cas(k) for k in keys]


def erase_many(dedup: Deduplicator, keys: Iterable[Key]) -> None:
    """``erase`` for a batch, with the deduplicator's bulk method when it has one."""
    bulk = getattr(dedup, "erase_many", None)
    if bulk is not None:
        bulk(keys)
        return
    for k in keys:
        dedup.erase(k)


def contains_many(dedup: Deduplicator, keys: Iterable[Key]) -> list[bool]:
    """Whether each key is remembered, *without* remembering the new ones (one round trip
    for the Redis and memcached stores). A deduplicator without a ``contains_many``
    method is asked with ``check_and_set`` and the new keys are erased again -- which
    briefly marks them, so prefer structures that have the method (all of ours do)."""
    own = getattr(dedup, "contains_many", None)
    if own is not None:
        contained: list[bool] = own(keys)
        return contained
    ks = list(keys)
    seen = check_and_set_many(dedup, ks)
    erase_many(dedup, [k for k, s in zip(ks, seen) if not s])
    return seen


class PicklableBySpec:
    """For stores that hold server connections: they travel to Spark tasks as the spec
    string they were built from and reconnect there. ``from_spec`` hands each store its
    ``spec`` and itself as ``rebuild`` (so this module need not import the spec parser:
    no import cycle)."""

    spec: str | None = None
    rebuild: Callable[[str], Any] | None = None

    def __reduce__(self) -> Any:
        if self.spec is None or self.rebuild is None:
            raise TypeError(f"{type(self).__name__} holds server connections and cannot be "
                            "pickled; build it with nsq_spark.dedup.from_spec(...) to make it "
                            "picklable")
        return (self.rebuild, (self.spec,))
