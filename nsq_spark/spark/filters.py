"""What a fetch task keeps out of its rows: the ``dedup`` option's duplicates and the
messages over ``maxAttempts`` (to the dead letters). Both are decided per chunk, before
its FIN, so neither can drop a message without a trace.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

from .._log import get_logger
from .options import ReadOptions
from .schema import messages_to_batch

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from nsq_spark.message import Message
    from nsq_spark.protocol import MessageBlock

log = get_logger(__name__)

__all__ = ["DeadLetterSplit", "Dedup", "check_dedup_spec", "dedup_store_error"]


class Dedup:
    """The ``dedup`` option at fetch time, ordered so that it can only ever let a
    duplicate through, never lose a message:

    1. candidates are checked against the shared store -- checked, not marked: a key that
       was absent is erased again right away. With the default key (the message ``id``)
       only messages delivered before (``attempts > 1``) can be redeliveries, so only those
       cost a round trip; with ``key=body`` every message is checked;
    2. the survivors are spooled and FINished; the seen ones are FINished without spooling;
    3. only then are the survivors' keys marked as seen (one pipelined round trip).

    A crash between 2 and 3 lets a later redelivery through (a duplicate); nothing is
    marked seen before it is durable, so nothing is dropped that was not delivered.
    """

    def __init__(self, spec: str) -> None:
        from nsq_spark.dedup import by_message_id, cached_from_spec

        self.spec = spec
        self.store = cached_from_spec(spec)
        self.key = getattr(self.store, "key_func", None) or by_message_id
        self.by_id = self.key is by_message_id

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A store round trip; a failure becomes a DedupStoreError naming the option and
        the fix (the raw error of a redis client names neither)."""
        try:
            return fn(*args)
        except Exception as exc:
            raise dedup_store_error(self.spec, exc) from exc

    def split(self, messages: list["Message"]) -> tuple[list["Message"], list["Message"]]:
        from nsq_spark.dedup import check_and_set_many, erase_many

        key = self.key
        cands = [m for m in messages if m.attempts > 1] if self.by_id else messages
        if not cands:
            return messages, []
        keys = [key(m) for m in cands]
        flags = self._call(check_and_set_many, self.store, keys)
        self._call(erase_many, self.store, [k for k, seen in zip(keys, flags) if not seen])
        seen = {id(m) for m, f in zip(cands, flags) if f}
        if not seen:
            return messages, []
        return ([m for m in messages if id(m) not in seen],
                [m for m in messages if id(m) in seen])

    def batch(self, blocks: list["MessageBlock"], topic: str, channel: str
              ) -> tuple["pa.RecordBatch", list["Message"], list["Message"]]:
        """The record batch of the messages of ``blocks`` not seen before; the kept and
        the dropped messages."""
        keep, drop = self.split([m for b in blocks for m in b.messages()])
        return messages_to_batch(keep, topic, channel), keep, drop

    def mark(self, messages: list["Message"]) -> None:
        from nsq_spark.dedup import check_and_set_many

        if messages:
            self._call(check_and_set_many, self.store, [self.key(m) for m in messages])


def dedup_store_error(spec: str, exc: BaseException) -> Exception:
    """The ``dedup`` option's store failed: a DedupStoreError that names the option, the
    store with its password hidden, this host, the cause and the fix."""
    from urllib.parse import urlsplit

    from nsq_spark.errors import DedupStoreError
    from nsq_spark.validate import redact_url

    cause = f"{type(exc).__name__}: {exc}"
    try:
        password = urlsplit(spec).password
    except ValueError:
        password = None
    if password:  # a client may echo its connection arguments
        cause = cause.replace(password, "***")
    return DedupStoreError(
        f"option 'dedup' ({redact_url(spec)}): the deduplication store failed from host "
        f"{os.uname().nodename}: {cause}; check that it runs and is reachable from every "
        "executor (address, port, password), or remove the option 'dedup'")


def check_dedup_spec(spec: str) -> None:
    """At query start: the spec must build a store shared by all executors."""
    from nsq_spark.dedup import from_spec

    from .options import NSQOptionError

    try:
        store = from_spec(spec)
    except Exception as exc:
        raise NSQOptionError(f"option 'dedup': {exc}") from exc
    if not getattr(store, "shared", False):
        raise NSQOptionError(
            f"option 'dedup': {spec!r} lives inside one process; Spark tasks run in many, so "
            "use a shared store (redis://host:port/0?ttl=..., memcached://host:port?ttl=...)")


class DeadLetterSplit:
    """``maxAttempts``: rows delivered more often than it are taken out of the result
    and written to ``deadLetterPath`` (before the FIN), counted and logged."""

    def __init__(self, opts: ReadOptions, label: str) -> None:
        from .spool import DeadLetters

        self.max_attempts = opts.max_attempts
        self.store = (DeadLetters(opts.dead_letter_path)
                      if self.max_attempts and opts.dead_letter_path else None)
        self.label = f"{opts.topic}.{opts.channel}-{label}"
        self.count = 0

    def split(self, rb: "pa.RecordBatch") -> tuple["pa.RecordBatch", "pa.RecordBatch | None"]:
        if not self.max_attempts or rb.num_rows == 0:
            return rb, None
        import pyarrow.compute as pc

        over = pc.greater(rb.column("attempts"), self.max_attempts)
        if not pc.any(over).as_py():
            return rb, None
        return rb.filter(pc.invert(over)), rb.filter(over)

    def write(self, dead: "pa.RecordBatch") -> None:
        if self.store is None:  # pragma: no cover - options require a path
            raise RuntimeError("maxAttempts without a dead-letter path")
        path = self.store.write(dead, self.label)
        self.count += dead.num_rows
        log.warning("%d messages delivered more than maxAttempts=%d times went to the "
                    "dead-letter file %s (ids %s)", dead.num_rows, self.max_attempts, path,
                    dead.column("id").to_pylist()[:10])
