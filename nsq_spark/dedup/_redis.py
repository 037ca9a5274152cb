"""Redis helpers shared by the Redis-backed structures (stores.py, bloom.py): the claim
values and the scripts that end or renew only our own claims."""

from __future__ import annotations

from typing import Any, Sequence

#: a claim's value starts with this; a committed key's value does not (it is ``1``)
CLAIM_PREFIX = b"c:"

# KEYS: claim keys; ARGV[1]: our claim value. Compare-and-delete: a claim another owner
# took over, and a committed key, are left alone.
LUA_CLAIM_KEYS_RELEASE = """
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
return 0
"""

# KEYS: claim keys; ARGV[1]: our claim value, ARGV[2]: the new lease (ms).
LUA_CLAIM_KEYS_RENEW = """
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
end
return 0
"""

# keys per script run: Redis serves nobody else while a script runs (~1 us a key)
SCRIPT_BATCH = 5000


def claim_value(token: int) -> bytes:
    """The value of a claim of the owner ``token`` (:class:`~nsq_spark.dedup.base.Owner`)."""
    return CLAIM_PREFIX + b"%x" % token


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client: a batch script touches many keys, which a
    cluster refuses (CROSSSLOT), so the batch paths fall back to pipelines."""
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover
        return False
    return isinstance(client, RedisCluster)


def run_on_keys(client: Any, script: Any, keys: Sequence[bytes], args: Sequence[Any],
                per_key: bool) -> None:
    """``script(keys, args)`` over ``keys``: one call (one round trip) per
    :data:`SCRIPT_BATCH` keys; with ``per_key`` (a Redis Cluster, whose keys may live on
    several slots) one call per key, pipelined. (A pipeline of scripts costs a ``SCRIPT
    EXISTS`` round trip of its own: direct calls where they can be.)"""
    if not keys:
        return
    if not per_key:
        for i in range(0, len(keys), SCRIPT_BATCH):
            script(keys=list(keys[i:i + SCRIPT_BATCH]), args=list(args))
        return
    pipe = client.pipeline(transaction=False)
    for k in keys:
        script(keys=[k], args=list(args), client=pipe)
    pipe.execute()
