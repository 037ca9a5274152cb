"""Redis helpers shared by the Redis-backed structures (stores.py, bloom.py)."""

from __future__ import annotations

from typing import Any


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client: a batch script touches many keys, which a
    cluster refuses (CROSSSLOT), so the batch paths fall back to pipelines."""
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover
        return False
    return isinstance(client, RedisCluster)
