"""The deduplication interface and the key functions.

A deduplicator answers one question atomically: "have I seen this key before?", and
remembers the key in the same step. NSQ delivers at least once, so the same message can
arrive twice in two ways, and each needs its own key:

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
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable, Protocol, Union, runtime_checkable

Key = Union[bytes, str]
KeyFunc = Callable[[Any], Union[Key, None]]  # None: no key, never a duplicate

__all__ = [
    "Deduplicator", "Key", "KeyFunc", "by_message_id", "by_body_digest", "by_publish_id",
    "resolve_key",
    "key_bytes", "check_and_set_many", "erase_many", "contains_many",
]


@runtime_checkable
class Deduplicator(Protocol):
    """What the Reader (``Reader(dedup=...)``) and the Spark source (the ``dedup`` option)
    use; the documentation's Deduplication page (``docs/dedup.md``) says which structure
    fits which use.

    ``check_and_set(key)`` returns True when ``key`` was seen before (a duplicate: drop
    it) and False when it is new; either way the key is remembered afterwards, and the
    check and the set are one atomic step (two consumers racing on the same key: exactly
    one gets False). ``erase(key)`` forgets the key, so that a message whose handling
    failed is processed again when nsqd redelivers it.
    """

    def check_and_set(self, key: Key) -> bool: ...

    def erase(self, key: Key) -> None: ...


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
