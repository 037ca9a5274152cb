"""What a fetch task keeps out of its rows: the ``dedup`` option's duplicates and the
messages over ``maxAttempts`` (to the dead letters). Both are decided per chunk, before
its FIN, so neither can drop a message without a trace.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence

from .._log import get_logger
from ..envelope import PUBLISH_ENVELOPE_MAGIC, open_body
from .options import ReadOptions
from ._schema import messages_to_batch

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from nsq_spark.message import Message
    from nsq_spark.protocol import MessageBlock

log = get_logger(__name__)

__all__ = ["DeadLetterSplit", "Dedup", "DedupChunk", "check_dedup_spec", "dedup_store_error",
           "split_held"]


@dataclasses.dataclass
class DedupChunk:
    """A chunk through the ``dedup`` option: ``rb`` the rows of the ``keep`` messages
    (claimed for this task), ``drop`` the committed ones (FINished without a row), and
    ``held``: one flag per message of the chunk, True for a copy another task or
    consumer holds a live claim on (requeued after ``held_delay_ms``, never FINished nor
    spooled; all False when none)."""

    rb: "pa.RecordBatch"
    keep: list["Message"]
    drop: list["Message"]
    held: list[bool]
    held_delay_ms: int

    @property
    def any_held(self) -> bool:
        return self.held_delay_ms > 0


class Dedup:
    """The ``dedup`` option at fetch time: claim, then commit
    (:class:`~nsq_spark.dedup.ClaimingDeduplicator`), ordered so that it can only ever
    let a duplicate through, never lose a message:

    1. the chunk's keys are claimed in the shared store, for ``lease_ms`` (the
       connection's ``msgTimeout``, else nsqd's default 60 s), before anything is
       spooled. With the default key (the message ``id``) only a redelivery
       (``attempts > 1``) can have been claimed or committed by anyone, so only those
       cost a round trip; a first delivery is ours by construction. With ``key=body``
       every message is claimed;
    2. a committed key's message is FINished without a row; a held one (another task or
       consumer has a live claim) is requeued after what is left of that lease, neither
       spooled nor FINished; the rest are spooled and FINished;
    3. only then are the kept keys committed (one round trip). A chunk that fails
       before its FIN releases its claims.

    A task that dies between 1 and 3 loses nothing: its claims end with their lease, and
    the redelivery, held until then, is spooled by another task. A crash between the FIN
    and the commit lets a later copy through (a duplicate row).

    Keys are taken from the message as a Reader's handler sees it: a body in a publish
    envelope is looked at opened (``key=publish_id`` is its publish id, ``key=body`` the
    digest of the published body), so a Reader and a query sharing a store agree; the
    rows still come from the bodies as delivered (:mod:`.schema` opens them).
    """

    def __init__(self, spec: str, lease_ms: int) -> None:
        from nsq_spark.dedup import by_message_id, cached_from_spec, claiming

        self.spec = spec
        self.lease_ms = lease_ms
        store = cached_from_spec(spec)
        self.store = claiming(store)
        self.key = getattr(store, "key_func", None) or by_message_id
        self.by_id = self.key is by_message_id

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A store round trip; a failure becomes a DedupStoreError naming the option and
        the fix (the raw error of a redis client names neither)."""
        try:
            return fn(*args)
        except Exception as exc:
            raise dedup_store_error(self.spec, exc) from exc

    def split(self, messages: list["Message"]
              ) -> tuple[list["Message"], list["Message"], dict[int, int]]:
        """``(keep, drop, held)``: the messages claimed for us, the committed ones, and
        ``id(message) -> ms`` left on the holder's lease for the held ones. Every kept
        message carries its key as ``dedup_key`` (what :meth:`commit` commits)."""
        from nsq_spark.dedup import ClaimState

        key = self.key
        keyed = []
        for m in messages:
            k = key(_as_handled(m))
            if k is not None:  # no key (no publish id): never a duplicate, never claimed
                m.dedup_key = k
                keyed.append(m)
        cands = [m for m in keyed if m.attempts > 1] if self.by_id else keyed
        if not cands:
            return messages, [], {}
        claims = self._call(self.store.claim_many, [m.dedup_key for m in cands],
                            self.lease_ms)
        drop = {id(m) for m, c in zip(cands, claims) if c.state is ClaimState.DONE}
        held = {id(m): c.left_ms for m, c in zip(cands, claims)
                if c.state is ClaimState.HELD}
        if not drop and not held:
            return messages, [], {}
        return ([m for m in messages if id(m) not in drop and id(m) not in held],
                [m for m in messages if id(m) in drop], held)

    def batch(self, blocks: list["MessageBlock"], topic: str, channel: str) -> DedupChunk:
        """The chunk of ``blocks`` through steps 1-2 (the module doc of this class)."""
        from nsq_spark.dedup.base import HELD_MARGIN_MS

        messages = [m for b in blocks for m in b.messages()]
        keep, drop, held = self.split(messages)
        flags = [id(m) in held for m in messages] if held else []
        delay = max(held.values()) + HELD_MARGIN_MS if held else 0
        return DedupChunk(messages_to_batch(keep, topic, channel), keep, drop, flags, delay)

    def commit(self, messages: list["Message"]) -> None:
        """Step 3: the kept messages are durable and FINished."""
        keys = _keys(messages)
        if keys:
            self._call(self.store.commit_many, keys)

    def release(self, messages: list["Message"]) -> None:
        """The kept messages were not FINished (the chunk failed): their claims end, so
        that their redelivery is spooled at once rather than after the lease."""
        keys = _keys(messages)
        if keys:
            self._call(self.store.release_many, keys)

    # the name of step 3 before claims existed
    mark = commit


class _Published:
    """A message as a handler sees it once its publish envelope is opened: the published
    body; every other attribute the message's own."""

    __slots__ = ("_message", "body")

    def __init__(self, message: "Message", body: bytes) -> None:
        self._message, self.body = message, body

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)


def _as_handled(m: "Message") -> Any:
    """``m``, or for a body in an intact publish envelope a view with the published body
    (and ``m.publish_id`` set): what the key functions look at. The one envelope rule
    (:func:`nsq_spark.envelope.open_body`): a damaged one is a plain body, no id."""
    body = m.body
    if not body or body[0] or body[:5] != PUBLISH_ENVELOPE_MAGIC:
        return m
    e = open_body(body)
    if e.version != 3:
        return m
    m.publish_id = e.publish_id
    return _Published(m, e.body)


def _keys(messages: list["Message"]) -> list[Any]:
    return [k for k in (getattr(m, "dedup_key", None) for m in messages) if k is not None]


class HeldAnswers(Protocol):
    """What :func:`split_held` needs of a Reader (the fetch task's ReaderPort has it)."""

    def split_blocks(self, blocks: Iterable["MessageBlock"], chosen: Sequence[bool]
                     ) -> tuple[list["MessageBlock"], list["MessageBlock"]]: ...

    def requeue_blocks(self, blocks: Iterable["MessageBlock"], delay_ms: int | None = None,
                       backoff: bool = True) -> None: ...


def split_held(reader: HeldAnswers, blocks: list["MessageBlock"], d: DedupChunk
               ) -> list["MessageBlock"]:
    """Requeue the held messages of ``blocks`` (no backoff: nothing failed) and return
    the blocks of the rest, to spool and FINish."""
    if not d.any_held:
        return blocks
    held, rest = reader.split_blocks(blocks, d.held)
    reader.requeue_blocks(held, delay_ms=d.held_delay_ms, backoff=False)
    log.info("%d messages held by another consumer's dedup claim: requeued for %d ms",
             sum(map(len, held)), d.held_delay_ms)
    return rest


def dedup_store_error(spec: str, exc: BaseException) -> Exception:
    """The ``dedup`` option's store failed: a DedupStoreError that names the option, the
    store with its password hidden, this host, the cause and the fix."""
    from urllib.parse import urlsplit

    from nsq_spark.errors import DedupStoreError
    from nsq_spark._validate import redact_url

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
        from ._spool import DeadLetters

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
