"""Build a deduplicator from one URL-like string (the Spark source's ``dedup`` option).

=========================================================================  =====================
spec                                                                       builds
=========================================================================  =====================
``redis://[:password@]host:port/db?ttl=3600&prefix=nsq-dedup&key=id``      RedisDeduplicator
``redis://host:port/0?keep_days=2``  (one set per UTC day, keep two)        RedisDeduplicator
``rediss://...`` (TLS), ``unix:///path/redis.sock?db=0&ttl=...``            RedisDeduplicator
``memcached://host:port?ttl=3600&prefix=nsq-dedup&key=body``                MemcachedDeduplicator
``redis-bloom://host:port/0?capacity=1000000&error_rate=0.001&name=n``      RedisBloomFilter
   (``rediss-bloom://`` for TLS; ``module=auto|true|false``, ``erase_ttl``)
``memory://opposite?size=1000000&digest_size=16``                           OppositeBloomFilter
``memory://opposite?rate=1000&window=60&probability=0.9``  (sized for you)  OppositeBloomFilter
``memory://bloom?capacity=1000000&error_rate=0.001``                        BloomFilter
=========================================================================  =====================

Bloom specs: ``error_rate`` is the probability that a *unique* message is reported as a
duplicate and dropped (FINished unhandled); ``capacity`` is the number of keys at which
that rate holds (beyond it the rate climbs). Use a Bloom filter only where losing that
fraction of messages is acceptable.

``key`` is ``id`` (NSQ message id: redeliveries; the default) or ``body`` (digest of the
body: publisher retries too); it becomes the deduplicator's ``key_func``. Redis URLs
take redis-py's own query options too (``socket_timeout=...``, ``ssl_cert_reqs=...``).
Unknown options are an error, so a typo does not silently change the window.

``memory://`` structures live in one process: in Spark every task (or Python worker)
would get its own, blind to the others -- the Spark source accepts only the shared
stores (``.shared`` is True for them).
"""

from __future__ import annotations

import threading
from typing import Any, overload
from urllib.parse import parse_qsl, urlencode, urlsplit

from .. import _validate as validate
from ..errors import ConfigError
from .base import Deduplicator

__all__ = ["from_spec", "cached_from_spec"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@overload
def _int(opts: dict[str, str], name: str, default: int) -> int: ...


@overload
def _int(opts: dict[str, str], name: str, default: None) -> int | None: ...


def _int(opts: dict[str, str], name: str, default: int | None) -> int | None:
    v = opts.pop(name, None)
    if v is None:
        return default
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"dedup option {name}={v!r} must be an integer") from None


def _float(opts: dict[str, str], name: str, default: float | None) -> float | None:
    v = opts.pop(name, None)
    if v is None:
        return default
    try:
        return float(v)
    except ValueError:
        raise ConfigError(f"dedup option {name}={v!r} must be a number") from None


def _no_more(opts: dict[str, str], spec: str, allowed: str) -> None:
    if opts:
        raise ConfigError(f"unknown dedup option(s) {sorted(opts)} in {spec!r}; allowed here: {allowed}")


def from_spec(spec: str) -> Deduplicator:
    """A new deduplicator for ``spec`` (see the module doc for the forms). The shared
    ones remember ``spec`` so they pickle as it (rebuilt, reconnected, on unpickling)."""
    shown = validate.redact_url(spec)  # errors are logged: no password in them
    if not isinstance(spec, str) or "://" not in spec:
        raise ConfigError(f"dedup spec must look like 'redis://host:6379/0?ttl=3600', "
                         f"'memcached://host:11211?ttl=3600', 'redis-bloom://...', or "
                         f"'memory://opposite?size=...'; got {shown!r}")
    parts = urlsplit(spec.strip())
    scheme = parts.scheme.lower()
    opts: dict[str, str] = {}
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        opts[k.lower()] = v
    key = opts.pop("key", None)

    if scheme in ("redis", "rediss", "unix"):
        from .stores import RedisDeduplicator
        ttl = _int(opts, "ttl", 3600)
        keep_days = _int(opts, "keep_days", None)
        prefix = opts.pop("prefix", "nsq-dedup")
        d: Any = RedisDeduplicator(_redis_client(parts, opts), ttl, keep_days=keep_days,
                                   prefix=prefix, key=key)
    elif scheme in ("redis-bloom", "rediss-bloom", "redis+bloom", "rediss+bloom"):
        from .bloom import RedisBloomFilter
        capacity = _int(opts, "capacity", 1_000_000)
        error_rate = _float(opts, "error_rate", 0.001)
        name = opts.pop("name", "nsq-dedup-bloom")
        erase_ttl = _int(opts, "erase_ttl", 86400)
        module: Any = opts.pop("module", "auto").lower()
        if module in _TRUE:
            module = True
        elif module in _FALSE:
            module = False
        elif module != "auto":
            raise ConfigError(f"dedup option module={module!r}: use auto, true or false")
        base = parts._replace(scheme="rediss" if scheme.startswith("rediss") else "redis")
        d = RedisBloomFilter(_redis_client(base, opts), name, capacity, error_rate,  # type: ignore[arg-type]
                             key=key, module=module, erase_ttl=erase_ttl)
    elif scheme == "memcached":
        from .stores import MemcachedDeduplicator
        if not parts.hostname or parts.port is None:
            raise ConfigError(f"memcached dedup spec needs host:port, e.g. "
                             f"'memcached://127.0.0.1:11211?ttl=3600'; got {shown!r}")
        ttl = _int(opts, "ttl", 3600)
        keep_days = _int(opts, "keep_days", None)
        prefix = opts.pop("prefix", "nsq-dedup")
        timeout = _float(opts, "timeout", 5.0)
        _no_more(opts, shown, "ttl, keep_days, prefix, key, timeout")
        d = MemcachedDeduplicator((parts.hostname, parts.port), ttl, keep_days=keep_days,
                                  prefix=prefix, key=key, timeout=timeout)  # type: ignore[arg-type]
    elif scheme == "memory":
        kind = (parts.netloc or parts.path.strip("/")).lower()
        if kind in ("opposite", "opposite-bloom", "oppositebloom"):
            from .opposite import OppositeBloomFilter
            size = _int(opts, "size", None)
            ds_raw = opts.pop("digest_size", "16")
            digest_size = None if ds_raw.lower() in ("none", "key", "") else \
                _int({"digest_size": ds_raw}, "digest_size", None)
            rate, window = _float(opts, "rate", None), _float(opts, "window", None)
            prob = _float(opts, "probability", 0.9)
            if size is None:
                if rate is None or window is None:
                    raise ConfigError(f"memory://opposite needs size=N, or rate=events/s and "
                                     f"window=seconds (and probability=0.9); got {shown!r}")
                size = OppositeBloomFilter.size_for(rate, window, prob)  # type: ignore[arg-type]
            _no_more(opts, shown, "size, digest_size, rate, window, probability, key")
            d = OppositeBloomFilter(size, digest_size, key=key)
        elif kind == "bloom":
            from .bloom import BloomFilter
            bloom_capacity = _int(opts, "capacity", None)
            if bloom_capacity is None:
                raise ConfigError(f"memory://bloom needs capacity=N (and error_rate); got {shown!r}")
            error_rate = _float(opts, "error_rate", 0.001)
            _no_more(opts, shown, "capacity, error_rate, key")
            d = BloomFilter(bloom_capacity, error_rate, key=key)  # type: ignore[arg-type]
        else:
            raise ConfigError(f"unknown in-process structure {kind!r} in {shown!r}: "
                             "use memory://opposite or memory://bloom")
    else:
        raise ConfigError(f"unknown dedup scheme {scheme!r} in {shown!r}: use redis, rediss, unix, "
                         "memcached, redis-bloom, rediss-bloom or memory")
    if getattr(d, "shared", False):
        d.spec = spec
        d.rebuild = from_spec   # what pickling calls in a Spark task (see PicklableBySpec)
    built: Deduplicator = d
    return built


def _redis_client(parts: Any, rest: dict[str, str]) -> Any:
    import redis
    # what is left in the query belongs to redis-py (socket_timeout, ssl options, db ...);
    # redis-py would only fail at the first command on a misspelt one, so check now
    unknown = set(rest) - _redis_url_options()
    if unknown:
        raise ConfigError(f"bad Redis dedup spec: unknown option(s) {sorted(unknown)}; ours are "
                         "ttl, keep_days, prefix, key (redis-bloom: capacity, error_rate, name, "
                         "module, erase_ttl), the rest go to redis-py (socket_timeout, ...)")
    # by hand: urlunsplit drops the '//' of 'unix:///path' (empty host)
    url = f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{urlencode(rest)}" if rest else "")
    try:
        return redis.Redis.from_url(url)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"bad Redis dedup spec {validate.redact_url(url)!r}: {exc}") from None


def _redis_url_options() -> set[str]:
    import inspect

    import redis.connection as rc
    names = set(getattr(rc, "URL_QUERY_ARGUMENT_PARSERS", {}))
    for cls in ("AbstractConnection", "Connection", "SSLConnection", "UnixDomainSocketConnection"):
        init = getattr(getattr(rc, cls, None), "__init__", None)
        if init is not None:
            names |= set(inspect.signature(init).parameters)
    return names - {"self", "kwargs", "args"}


_cache: dict[str, Deduplicator] = {}
_cache_lock = threading.Lock()


def cached_from_spec(spec: str) -> Deduplicator:
    """One deduplicator per ``spec`` per process: Spark tasks running in the same Python
    worker reuse its connection pool instead of reconnecting every batch."""
    with _cache_lock:
        d = _cache.get(spec)
        if d is None:
            d = _cache[spec] = from_spec(spec)
        return d
