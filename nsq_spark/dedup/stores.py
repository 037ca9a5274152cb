"""Exact deduplication stores with a TTL: Redis and memcached.

Shared by every consumer (processes, hosts, Spark tasks) that points at the same server
and prefix. Exact: never a false "seen" (a unique message is never dropped); a key is
remembered for the TTL, so memory grows with (rate x window). Each check is one atomic
server operation: Redis ``SET key 1 NX EX ttl``, memcached ``add`` -- when two consumers
race on one key, exactly one is told "new".

Two ways to bound the window:

* ``ttl`` (seconds, default 3600): every key expires ``ttl`` seconds after it was first
  seen.
* ``keep_days=N`` ("one set per day, keep N days"): keys go into a store per UTC day;
  a check looks at today's and the previous ``N - 1`` days' stores, and adds the key to
  today's. Each day's store expires at the end of its N-th day, so a key is remembered
  at least ``N - 1`` full days and at most ``N`` days, and a duplicate across midnight
  is still caught. In Redis a day is one SET (``SADD``; a Lua script checks the older
  days and adds atomically), which holds keys more compactly than one key with its own
  TTL each and expires as a whole.

Claim, then commit (:class:`~nsq_spark.dedup.ClaimingDeduplicator`, what the Reader and
the Spark source use). A claim is a key holding the owner's token, with the lease as its
expiry; a committed key holds ``1`` for the window (the value ``check_and_set`` always
wrote, so both interfaces read each other's keys):

* **Redis**: claim = ``SET key c:<token> NX PX lease`` (a script runs a chunk's keys and
  reads the holder's ``PTTL`` for a HELD answer, one round trip); commit = ``SET key 1
  EX ttl`` (pipelined); release = compare-and-delete in Lua (``GET == c:<token>`` then
  ``DEL``), renew = compare-and-``PEXPIRE``. With ``keep_days`` the claims are keys of
  their own (``{prefix}:claim:<key>``, the lease as expiry) beside the day sets, a claim
  looks at the days first, and a commit adds to today's set and ends our claim.
* **memcached**: claim = ``add`` of the claim with the lease as expiry, the owner's token
  in the item's flags (a committed key has flags 0), one round trip; for the keys it
  could not add, the meta command ``mg <key> f t`` reads the holder and the time left
  (a second round trip, only then). memcached counts expiry
  in whole seconds: a lease is rounded up to the next second and may end up to one
  second early. Commit = ``set`` of ``1`` with the window's expiry; release =
  ``mg <key> f c`` then the meta delete ``md <key> C<cas>`` (deletes only the item we
  read: our claim); renew = ``mg`` then a meta set with ``C<cas>``. The meta commands
  need memcached 1.6 or later and a pymemcache ``Client`` or ``PooledClient`` (what an
  address builds). With ``keep_days`` the claims are items of their own
  (``<prefix>:claim:<key>``), the days' items are checked first, and a commit sets
  today's item (the claim then ends with its lease).

Release and renew never touch a committed key nor a claim another owner took over.
"""

from __future__ import annotations

import time
from hashlib import blake2b
from typing import Any, Callable, Iterable, Sequence

from nsq_spark import _validate as validate
from nsq_spark._addresses import parse_address
from nsq_spark.errors import NSQError
from nsq_spark._validate import MAX_SECONDS

from ._redis import (CLAIM_PREFIX, LUA_CLAIM_KEYS_RELEASE, LUA_CLAIM_KEYS_RENEW, SCRIPT_BATCH,
                     claim_value, run_on_keys)
from ._redis import is_cluster as _is_cluster
from .base import (DONE, NEW, Claim, Key, KeyFunc, Owner, PicklableBySpec, held, key_bytes,
                   resolve_key)

__all__ = ["RedisDeduplicator", "MemcachedDeduplicator"]

DAY = 86400

# KEYS[1] = today's set, KEYS[2..] = the older days' sets; ARGV = member, expire-at (unix s)
_LUA_DAYS = """
for i = 2, #KEYS do
  if redis.call('SISMEMBER', KEYS[i], ARGV[1]) == 1 then return 1 end
end
local added = redis.call('SADD', KEYS[1], ARGV[1])
if added == 1 then redis.call('EXPIREAT', KEYS[1], ARGV[2]) end
return 1 - added
"""


# Batches: one script call per batch instead of one command per key (the client-side
# cost of packing and parsing N commands dominates a pipeline). 1 = seen, 0 = new.
# KEYS = the batch's keys; ARGV[1] = ttl
_LUA_SETNX_MANY = """
local out = {}
for i = 1, #KEYS do
  if redis.call('SET', KEYS[i], '1', 'NX', 'EX', ARGV[1]) then out[i] = 0 else out[i] = 1 end
end
return out
"""

# KEYS = today's set, then the older days'; ARGV[1] = expire-at, ARGV[2..] = members
_LUA_DAYS_MANY = """
local out = {}
local added_any = false
for j = 2, #ARGV do
  local seen = 0
  for i = 2, #KEYS do
    if redis.call('SISMEMBER', KEYS[i], ARGV[j]) == 1 then seen = 1; break end
  end
  if seen == 0 then
    if redis.call('SADD', KEYS[1], ARGV[j]) == 1 then added_any = true else seen = 1 end
  end
  out[j - 1] = seen
end
if added_any then redis.call('EXPIREAT', KEYS[1], ARGV[1]) end
return out
"""


# Claims, TTL mode. KEYS = the keys; ARGV[1] = our claim value, ARGV[2] = lease (ms).
# Answers per key: -1 new (ours now), 0 committed, n > 0 held by someone for n ms more.
_LUA_CLAIM = """
local out = {}
for i = 1, #KEYS do
  if redis.call('SET', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
    out[i] = -1
  else
    local v = redis.call('GET', KEYS[i])
    if string.sub(v, 1, 2) == 'c:' then
      local left = redis.call('PTTL', KEYS[i])
      if left == -1 then left = tonumber(ARGV[2]) elseif left < 1 then left = 1 end
      out[i] = left
    else
      out[i] = 0
    end
  end
end
return out
"""

# Commit, TTL mode. KEYS = the keys; ARGV[1] = ttl (s). A script, not a pipeline of SETs:
# packing and parsing one command per key cost the client more than the rest of the
# consumer (bench_consume msg-dedup:redis, redis-py 8: 11.3 us of CPU a message with the
# pipeline, 3.4 with the script).
_LUA_COMMIT = """
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], '1', 'EX', ARGV[1])
end
return 0
"""

# Claims, keep_days mode. KEYS = the n day sets (today first), then one claim key per
# member; ARGV = our claim value, lease (ms), n, then the members. Answers as above.
_LUA_DAYS_CLAIM = """
local n = tonumber(ARGV[3])
local out = {}
for j = 1, #KEYS - n do
  local done = false
  for i = 1, n do
    if redis.call('SISMEMBER', KEYS[i], ARGV[3 + j]) == 1 then done = true; break end
  end
  if done then
    out[j] = 0
  elseif redis.call('SET', KEYS[n + j], ARGV[1], 'NX', 'PX', ARGV[2]) then
    out[j] = -1
  else
    local left = redis.call('PTTL', KEYS[n + j])
    if left == -1 then left = tonumber(ARGV[2]) elseif left < 1 then left = 1 end
    out[j] = left
  end
end
return out
"""

# Commit, keep_days mode. KEYS = today's set, then one claim key per member; ARGV = our
# claim value, expire-at (unix s), then the members. Our claims end.
_LUA_DAYS_COMMIT = """
for j = 2, #KEYS do
  redis.call('SADD', KEYS[1], ARGV[1 + j])
  if redis.call('GET', KEYS[j]) == ARGV[1] then redis.call('DEL', KEYS[j]) end
end
if #KEYS > 1 then redis.call('EXPIREAT', KEYS[1], ARGV[2]) end
return 0
"""

_SCRIPT_BATCH = SCRIPT_BATCH


def _claims_of(answers: Iterable[Any]) -> list[Claim]:
    """The scripts' answers (-1, 0, ms left) as Claims."""
    return [NEW if r == -1 else DONE if r == 0 else held(int(r)) for r in answers]


def _day_starts(now: float, keep_days: int) -> list[int]:
    """Start (unix seconds, UTC) of today and the keep_days - 1 days before, newest first."""
    today = int(now) // DAY * DAY
    return [today - i * DAY for i in range(keep_days)]


def _day_name(day_start: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(day_start))


def _check_window(ttl: int | None, keep_days: int | None, prefix: Any) -> None:
    validate.text(prefix, "prefix", nonempty=True)
    if keep_days is not None:
        validate.integer(keep_days, "keep_days", lo=1, hi=3650, unit="days",
                         hint="days of stores kept")
    else:
        validate.integer(ttl, "ttl", lo=1, hi=MAX_SECONDS, unit="seconds",
                         hint="how long a key is remembered")


class RedisDeduplicator(PicklableBySpec):
    """Exact deduplicator in Redis, shared by all consumers using the same ``prefix``.

    ``client``: a ``redis.Redis`` or a ``redis://``/``rediss://``/``unix://`` URL.
    ``ttl``: seconds a key is remembered (``SET NX EX``), default 3600. Ignored with
    ``keep_days``.
    ``keep_days``: one Redis SET per UTC day, the last ``keep_days`` days checked (see the
    module doc). Set names: ``{prefix}:YYYY-MM-DD`` (the braces are a Redis Cluster hash
    tag that keeps all days on one slot, as the script needs; Cluster is not tested here).
    ``prefix``: key namespace, default ``"nsq-dedup"``; with ``ttl`` a key is stored as
    ``<prefix>:<key>``. Give each topic/channel pair its own prefix.
    ``key``: ``"id"`` (default), ``"body"`` or a function of the message (``key_func``).
    ``clock``: seconds since the epoch (tests move the day with it).

    Memory (measured at 1M keys, see bench/RESULTS.md): about 110 bytes a key with
    ``ttl`` (the default prefix and a 16-byte id), about 70 with ``keep_days``.
    """

    shared = True

    def __init__(self, client: Any, ttl: int = 3600, *, keep_days: int | None = None,
                 prefix: str = "nsq-dedup", key: str | KeyFunc | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        _check_window(ttl, keep_days, prefix)
        if isinstance(client, str):
            import redis
            client = redis.Redis.from_url(client)
        self.client = client
        self.ttl = ttl
        self.keep_days = keep_days
        self.prefix = prefix
        self.key_func: KeyFunc = resolve_key(key)
        self.clock = clock
        self.spec: str | None = None  # set by from_spec, for pickling into Spark tasks
        self._kprefix = f"{prefix}:".encode()
        self._days_script = client.register_script(_LUA_DAYS) if keep_days else None
        self._cluster = _is_cluster(client)
        self._many_script = None if self._cluster else client.register_script(
            _LUA_DAYS_MANY if keep_days else _LUA_SETNX_MANY)
        # claims (the module doc); with keep_days in the days' hash slot
        self._owner = Owner()
        self._ckprefix = f"{{{prefix}}}:claim:".encode() if keep_days else self._kprefix
        self._claim_script = client.register_script(
            _LUA_DAYS_CLAIM if keep_days else _LUA_CLAIM)
        self._commit_script = client.register_script(
            _LUA_DAYS_COMMIT if keep_days else _LUA_COMMIT)
        self._release_script = client.register_script(LUA_CLAIM_KEYS_RELEASE)
        self._renew_script = client.register_script(LUA_CLAIM_KEYS_RENEW)

    def __repr__(self) -> str:
        window = f"keep_days={self.keep_days}" if self.keep_days else f"ttl={self.ttl}"
        return f"RedisDeduplicator(prefix={self.prefix!r}, {window})"


    def _day_keys(self) -> tuple[list[str], int]:
        days = _day_starts(self.clock(), self.keep_days or 1)
        keys = [f"{{{self.prefix}}}:{_day_name(d)}" for d in days]
        return keys, days[0] + (self.keep_days or 1) * DAY

    def check_and_set(self, key: Key) -> bool:
        """True when ``key`` was seen within the window; else remember it, False."""
        k = key_bytes(key)
        if self._days_script is None:
            return self.client.set(self._kprefix + k, b"1", nx=True, ex=self.ttl) is None
        keys, expire_at = self._day_keys()
        return bool(self._days_script(keys=keys, args=[k, expire_at]) == 1)

    def check_and_set_many(self, keys: Iterable[Key]) -> list[bool]:
        """A batch in one round trip and one server-side script, in order (each key
        atomic; a key repeated in the batch is a duplicate the second time)."""
        if self._many_script is not None:
            ks = [key_bytes(k) for k in keys]
            if not ks:
                return []
            out: list[bool] = []
            kp = self._kprefix
            if self._days_script is not None:
                dkeys, expire_at = self._day_keys()
            for i in range(0, len(ks), _SCRIPT_BATCH):  # keep each script run short
                part = ks[i:i + _SCRIPT_BATCH]
                if self._days_script is None:
                    res = self._many_script(keys=[kp + k for k in part], args=[self.ttl])
                else:
                    res = self._many_script(keys=dkeys, args=[expire_at, *part])
                out += [r == 1 for r in res]
            return out
        pipe = self.client.pipeline(transaction=False)
        n = 0
        if self._days_script is None:
            for key in keys:
                pipe.set(self._kprefix + key_bytes(key), b"1", nx=True, ex=self.ttl)
                n += 1
            return [r is None for r in pipe.execute()] if n else []
        dkeys, expire_at = self._day_keys()
        for key in keys:
            self._days_script(keys=dkeys, args=[key_bytes(key), expire_at], client=pipe)
            n += 1
        return [r == 1 for r in pipe.execute()] if n else []

    def contains_many(self, keys: Iterable[Key]) -> list[bool]:
        """Whether each key was seen (committed) within the window, without remembering
        any (one round trip; a claim alone is not "seen")."""
        ks = [key_bytes(k) for k in keys]
        if not ks:
            return []
        pipe = self.client.pipeline(transaction=False)
        if self._days_script is None:
            for k in ks:
                pipe.get(self._kprefix + k)
            return [v is not None and not v.startswith(CLAIM_PREFIX) for v in pipe.execute()]
        dkeys = self._day_keys()[0]
        for k in ks:
            for day_key in dkeys:
                pipe.sismember(day_key, k)
        res = pipe.execute()
        n = len(dkeys)
        return [any(res[i * n:(i + 1) * n]) for i in range(len(ks))]

    def erase(self, key: Key) -> None:
        """Forget ``key`` (from every kept day's set)."""
        self.erase_many([key])

    def erase_many(self, keys: Iterable[Key]) -> None:
        ks = [key_bytes(k) for k in keys]
        if not ks:
            return
        if self._days_script is None:
            self.client.delete(*[self._kprefix + k for k in ks])
            return
        pipe = self.client.pipeline(transaction=False)
        for day_key in self._day_keys()[0]:
            pipe.srem(day_key, *ks)
        pipe.execute()

    # -- claim, then commit (the module doc) --------------------------------------------

    def claim_many(self, keys: Sequence[Key], lease_ms: int) -> list[Claim]:
        """One round trip per 5,000 keys (one per key, pipelined, on a Redis Cluster)."""
        ks = [key_bytes(k) for k in keys]
        if not ks:
            return []
        mine = claim_value(self._owner.token())
        script = self._claim_script
        step = 1 if self._cluster else _SCRIPT_BATCH
        calls: list[tuple[list[bytes], list[Any]]] = []
        if self.keep_days:
            dkeys = self._day_keys()[0]
            ckp = self._ckprefix
            for i in range(0, len(ks), step):
                part = ks[i:i + step]
                calls.append(([*(d.encode() for d in dkeys), *(ckp + k for k in part)],
                              [mine, lease_ms, len(dkeys), *part]))
        else:
            kp = self._kprefix
            for i in range(0, len(ks), step):
                calls.append(([kp + k for k in ks[i:i + step]], [mine, lease_ms]))
        if len(calls) == 1 or not self._cluster:
            out: list[Claim] = []
            for ckeys, args in calls:
                out += _claims_of(script(keys=ckeys, args=args))
            return out
        pipe = self.client.pipeline(transaction=False)
        for ckeys, args in calls:
            script(keys=ckeys, args=args, client=pipe)
        return [c for res in pipe.execute() for c in _claims_of(res)]

    def commit_many(self, keys: Sequence[Key]) -> None:
        """Remember the keys for the window, whoever holds a claim on them (one round
        trip); with ``keep_days`` into today's set, and our claims end."""
        ks = [key_bytes(k) for k in keys]
        if not ks:
            return
        if not self.keep_days:
            kp = self._kprefix
            run_on_keys(self.client, self._commit_script, [kp + k for k in ks], [self.ttl],
                        self._cluster)
            return
        dkeys, expire_at = self._day_keys()
        mine = claim_value(self._owner.token())
        ckp = self._ckprefix
        step = 1 if self._cluster else _SCRIPT_BATCH
        for i in range(0, len(ks), step):
            part = ks[i:i + step]
            self._commit_script(keys=[dkeys[0], *(ckp + k for k in part)],
                                args=[mine, expire_at, *part])

    def release_many(self, keys: Sequence[Key]) -> None:
        """Our claims end (compare-and-delete: others' claims and committed keys stay)."""
        ckp = self._ckprefix
        run_on_keys(self.client, self._release_script, [ckp + key_bytes(k) for k in keys],
                    [claim_value(self._owner.token())], self._cluster)

    def renew_many(self, keys: Sequence[Key], lease_ms: int) -> None:
        """Our live claims last ``lease_ms`` more."""
        ckp = self._ckprefix
        run_on_keys(self.client, self._renew_script, [ckp + key_bytes(k) for k in keys],
                    [claim_value(self._owner.token()), lease_ms], self._cluster)



# -- memcached --------------------------------------------------------------------------

_MC_MAX_KEY = 250
_MC_MAX_RELATIVE = 30 * DAY  # memcached reads larger expiry values as unix timestamps
_MC_CLAIM = b"c"  # a claim's value (its owner is in the flags); a committed key's is 1


class MemcachedDeduplicator(PicklableBySpec):
    """Exact deduplicator in memcached (``add`` with an expiry), shared by all consumers.

    ``client``: a pymemcache client (use a thread-safe ``PooledClient`` or
    ``HashClient`` if several threads share it), or an address ``"host:port"`` /
    ``(host, port)`` -- then a ``PooledClient`` is made.
    ``ttl``: seconds a key is remembered, default 3600 (above 30 days it is sent as an
    absolute time, as memcached requires). Ignored with ``keep_days``.
    ``keep_days``: keys per UTC day, the last ``keep_days`` days checked (older days with
    one ``get_many``, then ``add`` to today's). Each day's keys expire at the end of its
    ``keep_days``-th day.
    ``prefix``: key namespace (default ``"nsq-dedup"``).
    ``key``: ``"id"`` (default), ``"body"`` or a function of the message (``key_func``).

    Keys: memcached takes printable ASCII without spaces, at most 250 bytes. Alphanumeric
    keys (NSQ message ids) are used as they are; any other key (raw body digests, ...)
    is sent hex-encoded after a ``#``, and one too long for that as ``#`` + a 256-bit
    BLAKE2b digest.

    Caveat: memcached evicts least-recently-used items when its memory is full, before
    their expiry. Eviction makes it forget (a duplicate may get through), never invent a
    duplicate. Give it memory for rate x window keys (~50-100 bytes each).
    """

    shared = True

    def __init__(self, client: Any, ttl: int = 3600, *, keep_days: int | None = None,
                 prefix: str = "nsq-dedup", key: str | KeyFunc | None = None,
                 clock: Callable[[], float] = time.time, timeout: float = 5.0) -> None:
        _check_window(ttl, keep_days, prefix)
        validate.seconds(timeout, "timeout")
        if isinstance(client, (str, tuple)):
            from pymemcache.client.base import PooledClient
            client = PooledClient(_mc_address(client), connect_timeout=timeout, timeout=timeout,
                                  max_pool_size=16)
        self.client = client
        self.ttl = ttl
        self.keep_days = keep_days
        self.prefix = prefix
        self.key_func: KeyFunc = resolve_key(key)
        self.clock = clock
        self.spec: str | None = None
        self._kprefix = f"{prefix}:".encode()
        self._ckprefix = f"{prefix}:claim:".encode() if keep_days else self._kprefix
        self._owner = Owner(bits=32)  # in the items' 32-bit flags

    def __repr__(self) -> str:
        window = f"keep_days={self.keep_days}" if self.keep_days else f"ttl={self.ttl}"
        return f"MemcachedDeduplicator(prefix={self.prefix!r}, {window})"


    def _encode(self, k: bytes, head: bytes) -> bytes:
        room = _MC_MAX_KEY - len(head)
        if k.isalnum() and len(k) <= room:
            return head + k
        if 2 * len(k) + 1 <= room:
            return head + b"#" + k.hex().encode()
        return head + b"#" + blake2b(k, digest_size=32).hexdigest().encode()

    def _expire(self, seconds: int, now: float) -> int:
        seconds = max(1, seconds)
        return seconds if seconds <= _MC_MAX_RELATIVE else int(now) + seconds

    def check_and_set(self, key: Key) -> bool:
        """True when ``key`` was seen within the window; else remember it, False."""
        k = key_bytes(key)
        now = self.clock()
        if not self.keep_days:
            stored = self.client.add(self._encode(k, self._kprefix), b"1",
                                     expire=self._expire(self.ttl, now), noreply=False)
            return not stored
        days = _day_starts(now, self.keep_days)
        heads = [self._kprefix + _day_name(d).encode() + b":" for d in days]
        older = [self._encode(k, h) for h in heads[1:]]
        if older and self.client.get_many(older):
            return True
        expire = self._expire(days[0] + self.keep_days * DAY - int(now), now)
        return not self.client.add(self._encode(k, heads[0]), b"1", expire=expire, noreply=False)

    def check_and_set_many(self, keys: Iterable[Key]) -> list[bool]:
        """A batch: the ``add`` commands go out in one write and the answers are read
        back in order (pymemcache's own multi-command path), so one round trip."""
        ks = [key_bytes(k) for k in keys]
        if not ks:
            return []
        now = self.clock()
        if not self.keep_days:
            head, expire = self._kprefix, self._expire(self.ttl, now)
            seen_before: set[bytes] = set()
        else:
            days = _day_starts(now, self.keep_days)
            heads = [self._kprefix + _day_name(d).encode() + b":" for d in days]
            head, expire = heads[0], self._expire(days[0] + self.keep_days * DAY - int(now), now)
            older = {self._encode(k, h): k for k in set(ks) for h in heads[1:]}
            seen_before = {older[e] for e in self.client.get_many(list(older))} if older else set()
        # the first occurrence of each key goes to the server; repeats are duplicates
        first: dict[bytes, bytes] = {}
        for k in ks:
            if k not in seen_before and k not in first:
                first[k] = self._encode(k, head)
        stored = self._add_many(list(first.values()), expire)
        out: list[bool] = []
        asked: set[bytes] = set()
        for k in ks:
            if k in seen_before or k in asked:
                out.append(True)
            else:
                asked.add(k)
                out.append(not stored[first[k]])
        return out

    def _add_many(self, mkeys: list[bytes], expire: int) -> dict[bytes, bool]:
        if not mkeys:
            return {}
        values = dict.fromkeys(mkeys, b"1")
        pool = getattr(self.client, "client_pool", None)  # PooledClient
        if pool is not None and hasattr(self.client.client_class, "_store_cmd"):
            with pool.get_and_release(destroy_on_fail=True) as c:
                res = c._store_cmd(b"add", values, expire, False)
        elif hasattr(self.client, "_store_cmd"):  # base Client
            res = self.client._store_cmd(b"add", values, expire, False)
        else:  # another client type (HashClient, ...): one add at a time
            res = {k: self.client.add(k, b"1", expire=expire, noreply=False) for k in mkeys}
        return {k: bool(v) for k, v in res.items()}

    def contains_many(self, keys: Iterable[Key]) -> list[bool]:
        """Whether each key was seen within the window, without remembering any (one
        ``get_many``)."""
        ks = [key_bytes(k) for k in keys]
        if not ks:
            return []
        if not self.keep_days:
            heads = [self._kprefix]
        else:
            heads = [self._kprefix + _day_name(d).encode() + b":"
                     for d in _day_starts(self.clock(), self.keep_days)]
        enc = {k: [self._encode(k, h) for h in heads] for k in set(ks)}
        found = self.client.get_many([e for es in enc.values() for e in es])
        # a claim (value c) is not "seen"
        return [any(found.get(e, _MC_CLAIM) != _MC_CLAIM for e in enc[k]) for k in ks]

    def erase(self, key: Key) -> None:
        """Forget ``key`` (every kept day's entry)."""
        k = key_bytes(key)
        if not self.keep_days:
            self.client.delete(self._encode(k, self._kprefix), noreply=False)
            return
        for d in _day_starts(self.clock(), self.keep_days):
            self.client.delete(self._encode(k, self._kprefix + _day_name(d).encode() + b":"),
                               noreply=False)

    def erase_many(self, keys: Iterable[Key]) -> None:
        for k in keys:
            self.erase(k)

    # -- claim, then commit (the module doc) --------------------------------------------

    def _meta(self, cmds: list[bytes]) -> list[bytes]:
        """Meta commands (memcached >= 1.6) in one write, one answer line each."""
        pool = getattr(self.client, "client_pool", None)
        if pool is not None and hasattr(self.client.client_class, "_misc_cmd"):
            with pool.get_and_release(destroy_on_fail=True) as c:
                got: list[bytes] = c._misc_cmd(cmds, b"meta", False)
                return got
        if hasattr(self.client, "_misc_cmd"):
            got = self.client._misc_cmd(cmds, b"meta", False)
            return got
        raise NSQError(f"MemcachedDeduplicator claims need a pymemcache Client or "
                       f"PooledClient (meta commands), not {type(self.client).__name__}; "
                       "give an address ('host:port') or one of those")

    def _lease_s(self, lease_ms: int, now: float) -> int:
        return self._expire(-(-lease_ms // 1000), now)  # whole seconds, rounded up

    def claim_many(self, keys: Sequence[Key], lease_ms: int) -> list[Claim]:
        """One round trip when no key was claimed before, a second to read the holders
        of those that were (and with ``keep_days`` one before, for the days)."""
        ks = [key_bytes(k) for k in keys]
        if not ks:
            return []
        now = self.clock()
        done: set[bytes] = set()
        if self.keep_days:
            heads = [self._kprefix + _day_name(d).encode() + b":"
                     for d in _day_starts(now, self.keep_days)]
            days = {self._encode(k, h): k for k in set(ks) for h in heads}
            done = {days[e] for e in self.client.get_many(list(days))}
        first = [k for k in dict.fromkeys(ks) if k not in done]
        owner = self._owner.token()
        secs = self._lease_s(lease_ms, now)
        mks = [self._encode(k, self._ckprefix) for k in first]
        # add the claims (mode E); only where that failed, read who holds the key (the
        # common case, nothing claimed before, is one round trip)
        tail = b" 1 T%d F%d ME\r\nc\r\n" % (secs, owner)
        stored = self._meta([b"ms " + mk + tail for mk in mks]) if mks else []
        found: dict[bytes, Claim] = dict.fromkeys(first, NEW)
        taken = [(k, mk) for k, mk, line in zip(first, mks, stored) if line[:2] != b"HD"]
        states = self._meta([b"mg %s f t\r\n" % mk for _, mk in taken]) if taken else []
        for (k, _), line in zip(taken, states):
            state = line.split()
            flags = ttl = None
            for tok in state[1:]:
                if tok[:1] == b"f":
                    flags = int(tok[1:])
                elif tok[:1] == b"t":
                    ttl = int(tok[1:])
            if state[:1] != [b"HD"]:  # gone since the add (expired, released): try later
                found[k] = held(1000)
            elif not flags:
                found[k] = DONE
            else:
                found[k] = held(lease_ms if ttl is None or ttl < 0 else max(ttl, 1) * 1000)
        out: list[Claim] = []
        asked: set[bytes] = set()
        for k in ks:
            if k in done:
                out.append(DONE)
            elif k in asked:  # a repeat: we hold it, or the first answer holds
                c = found[k]
                out.append(held(lease_ms) if c is NEW else c)
            else:
                asked.add(k)
                out.append(found[k])
        return out

    def commit_many(self, keys: Sequence[Key]) -> None:
        """``set`` of ``1`` for the window (with ``keep_days``: today's item; the claims
        end with their lease), whoever holds a claim. One round trip."""
        ks = [key_bytes(k) for k in keys]
        if not ks:
            return
        now = self.clock()
        if not self.keep_days:
            head, expire = self._kprefix, self._expire(self.ttl, now)
        else:
            today = _day_starts(now, self.keep_days)[0]
            head = self._kprefix + _day_name(today).encode() + b":"
            expire = self._expire(today + self.keep_days * DAY - int(now), now)
        # meta sets: pymemcache's set_many checks and packs each key in Python, ~0.7 us
        # of CPU a message more (bench_consume msg-dedup:memcached)
        tail = b" 1 T%d\r\n1\r\n" % expire
        self._meta([b"ms " + mk + tail for mk in dict.fromkeys(self._encode(k, head) for k in ks)])

    def _ours(self, keys: Sequence[Key]) -> list[tuple[bytes, bytes]]:
        """(item key, cas) of the claims on ``keys`` that are ours."""
        mks = list(dict.fromkeys(self._encode(key_bytes(k), self._ckprefix) for k in keys))
        if not mks:
            return []
        owner = b"f%d" % self._owner.token()
        out = []
        for mk, line in zip(mks, self._meta([b"mg %s f c\r\n" % mk for mk in mks])):
            toks = line.split()
            if toks[:1] == [b"HD"] and owner in toks[1:]:
                out.append((mk, next(t[1:] for t in toks[1:] if t[:1] == b"c")))
        return out

    def release_many(self, keys: Sequence[Key]) -> None:
        """Our claims end: read them (flags = our token), then delete each only if it is
        still the item read (``md <key> C<cas>``)."""
        ours = self._ours(keys)
        if ours:
            self._meta([b"md %s C%s\r\n" % (mk, cas) for mk, cas in ours])

    def renew_many(self, keys: Sequence[Key], lease_ms: int) -> None:
        """Our live claims last ``lease_ms`` more (a meta set with ``C<cas>``)."""
        ours = self._ours(keys)
        if ours:
            secs = self._lease_s(lease_ms, self.clock())
            owner = self._owner.token()
            self._meta([b"ms %s 1 C%s T%d F%d\r\nc\r\n" % (mk, cas, secs, owner)
                        for mk, cas in ours])



def _mc_address(addr: str | tuple[str, int]) -> tuple[str, int]:
    """The one address rule (:mod:`nsq_spark._addresses`) for the memcached server."""
    host, port = parse_address(addr, "MemcachedDeduplicator client", "127.0.0.1:11211")
    return (host, port)
