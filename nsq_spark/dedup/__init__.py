"""Deduplication for NSQ's at-least-once delivery.

Three structures with three different promises:

=======================  ======================  ==========================  ==============
structure                where                   may wrongly say "seen"?     forgets?
=======================  ======================  ==========================  ==============
OppositeBloomFilter      in process              no (see ``digest_size``)    yes, as other
                                                                             keys overwrite
RedisDeduplicator,       Redis / memcached,      no                          after the TTL
MemcachedDeduplicator    shared by consumers                                 (memory grows
                                                                             with the window)
BloomFilter,             in process / Redis,     yes, at the configured      no (until the
RedisBloomFilter         shared                  error rate: a unique        capacity is
                                                 message is DROPPED          exceeded)
=======================  ======================  ==========================  ==============

Each has two interfaces (:mod:`nsq_spark.dedup.base`): **claim, then commit**
(:class:`ClaimingDeduplicator`: ``claim_many(keys, lease_ms)`` -> NEW / DONE / held,
``commit_many``, ``release_many``, ``renew_many``), which the Reader and the Spark source
use, so that a consumer killed inside its handler loses nothing; and the older one-step
``check_and_set(key) -> bool`` (True when the key was seen before) / ``erase(key)``,
kept for programs that call it. :func:`claiming` adapts a user-made deduplicator that has
only the older one.

Keys: :func:`by_message_id` (redeliveries), :func:`by_publish_id` (the copies of one
publish: replicas, retries), :func:`by_body_digest` (equal content) or a function of the
message. :func:`from_spec` builds any of them from a URL-like string
(the Spark option).

The Redis and memcached classes import their client library only when used.
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import (DONE, NEW, Claim, ClaimingDeduplicator, ClaimState, Deduplicator, Key, KeyFunc,
                   LocalClaims, by_body_digest, by_message_id, by_publish_id, check_and_set_many,
                   claiming, contains_many, erase_many, held, key_bytes, resolve_key)
from .opposite import OppositeBloomFilter

_LAZY = {
    "BloomFilter": "nsq_spark.dedup.bloom",
    "RedisBloomFilter": "nsq_spark.dedup.bloom",
    "bloom_parameters": "nsq_spark.dedup.bloom",
    "RedisDeduplicator": "nsq_spark.dedup.stores",
    "MemcachedDeduplicator": "nsq_spark.dedup.stores",
    "from_spec": "nsq_spark.dedup.spec",
    "cached_from_spec": "nsq_spark.dedup.spec",
}

__all__ = [
    "Deduplicator", "ClaimingDeduplicator", "Claim", "ClaimState", "NEW", "DONE", "held",
    "claiming", "LocalClaims", "Key", "KeyFunc", "by_message_id", "by_body_digest", "by_publish_id",
    "resolve_key", "key_bytes", "check_and_set_many", "erase_many", "contains_many", "OppositeBloomFilter",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nsq_spark.dedup' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
