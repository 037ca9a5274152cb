"""The deduplicator as the consumer uses it: the Reader's ``dedup=`` / ``dedup_key=``.

Claim, then commit (:class:`~nsq_spark.dedup.ClaimingDeduplicator`): the intake gate asks
:meth:`DedupGate.claim` for each read chunk, before anything is handed over, and gets
three lists back -- the messages claimed for us (handed over), the committed ones
(duplicates: finished unhandled, counted in :attr:`DedupGate.duplicates`) and the held
ones (someone else's live claim: requeued for about the lease's remaining time, counted
in :attr:`DedupGate.held`). The answers ledger tells it what became of each message
handed over: finished -> :meth:`DedupGate.commit`, requeued or given back ->
:meth:`DedupGate.release`, touched -> :meth:`DedupGate.renew`; it queues them, and the
ledger's flush sends them (:meth:`DedupGate.flush`: one call per kind and loop turn,
before the turn's FINs are written).

Why this order: a key marked when the message *arrived* (the older ``check_and_set``
gate) was lost with a consumer killed inside its handler -- nsqd redelivered the message
and the next consumer finished it as a duplicate. A claim instead ends with its lease
(about the connection's ``msg_timeout``), so the redelivery is requeued while the lease
lasts and handled after it.

A connection lost while handlers hold its messages: their claims stay (the handlers
still run; a success still commits, even though its FIN can no longer be sent), so the
redelivery nsqd makes after its timeout is held until the lease ends or is committed.

It knows neither the ledger nor the gate: both hold it, it holds nothing of theirs. A
failing deduplicator never loses a message: a failed claim lets the chunk through (every
message of it handed over), a failed commit or release is logged (copies may be handled
again, or held until their lease ends).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from .._log import get_logger

if TYPE_CHECKING:
    from ..dedup.base import ClaimingDeduplicator, Key, KeyFunc
    from ..message import Message

# a child of the Reader's historical logger: its level and handlers still apply
log = get_logger("nsq_spark.reader.intake")

__all__ = ["DedupGate"]


class DedupGate:
    """A claiming deduplicator and its key function."""

    def __init__(self, store: "ClaimingDeduplicator", key: Callable[["Message"], "Key | None"],
                 name: str) -> None:
        self.store = store
        self.key = key
        self.name = name
        self._log = log.bind(reader=name)
        self.duplicates = 0
        self.held = 0
        # queued for the next flush (keys, in order)
        self._commits: list[Key] = []
        self._releases: list[Key] = []
        self._renews: dict[int, list[Key]] = {}  # lease -> keys

    @classmethod
    def build(cls, dedup: Any, key: "KeyFunc | str | None", name: str) -> "DedupGate | None":
        """The gate for the Reader's ``dedup=`` / ``dedup_key=`` options (None: no dedup).
        ``dedup``: a claiming deduplicator, or one with only ``check_and_set`` / ``erase``
        (adapted, see :func:`nsq_spark.dedup.claiming`). ``key``: a function, ``"id"`` /
        ``"body"`` / ``"publish_id"``, or None (the deduplicator's own ``key_func``, else
        the message id)."""
        if dedup is None:
            return None
        from ..dedup import claiming, resolve_key  # only when used
        store = claiming(dedup)
        return cls(store, resolve_key(key if key is not None else getattr(dedup, "key_func", None)),
                   name)

    def claim(self, msgs: list["Message"], lease_ms: int, source: str
              ) -> tuple[list["Message"], list["Message"], list[tuple["Message", int]]]:
        """``(new, done, held)`` for a chunk: the messages claimed for us for
        ``lease_ms`` (and those without a key), the committed ones, and the held ones with
        the milliseconds left on their holder's lease. ``source``: the nsqd address, for
        the log. Every message that goes on with a key carries it as ``dedup_key``, so
        that its commit or release uses the key it was claimed under, whatever the
        handler does to the message."""
        key = self.key
        got = [key(m) for m in msgs]
        new: list[Message] = []
        if None in got:   # no key (no publish id): never a duplicate
            new = [m for m, k in zip(msgs, got) if k is None]
            msgs = [m for m, k in zip(msgs, got) if k is not None]
            keys: list[Key] = [k for k in got if k is not None]
        else:
            keys = got  # type: ignore[assignment]
        if not keys:
            return new, [], []
        for m, k in zip(msgs, keys):
            m.dedup_key = k
        try:
            claims = self.store.claim_many(keys, lease_ms)
        except Exception:
            self._log.for_nsqd(source).exception(
                "[%s] dedup claim failed on %d messages from %s; handling them "
                "anyway", self.name, len(msgs), source)
            return new + msgs, [], []
        from ..dedup.base import NEW, ClaimState  # only when used
        done: list[Message] = []
        held: list[tuple[Message, int]] = []
        app = new.append
        for m, c in zip(msgs, claims):
            if c is NEW:  # the structures' own answer for a new claim: no attribute read
                app(m)
                continue
            state = c.state
            if state is ClaimState.NEW:
                app(m)
            elif state is ClaimState.DONE:
                done.append(m)
            else:
                held.append((m, c.left_ms))
        self.duplicates += len(done)
        self.held += len(held)
        return new, done, held

    # -- what became of the messages handed over (queued; sent by flush) ---------------------

    def commit(self, m: "Message") -> None:
        """``m`` was handled (finished by its handler or the give-up hook)."""
        k = getattr(m, "dedup_key", None)
        if k is not None:
            self._commits.append(k)

    def commit_many(self, msgs: Sequence["Message"]) -> None:
        ks = [getattr(m, "dedup_key", None) for m in msgs]
        self._commits.extend([k for k in ks if k is not None])

    def release(self, m: "Message") -> None:
        """``m`` was requeued or given back unhandled: its redelivery must be handled."""
        k = getattr(m, "dedup_key", None)
        if k is not None:
            self._releases.append(k)

    def release_many(self, msgs: Sequence["Message"]) -> None:
        ks = [getattr(m, "dedup_key", None) for m in msgs]
        self._releases.extend([k for k in ks if k is not None])

    def renew(self, m: "Message", lease_ms: int) -> None:
        """``m`` was touched: its claim lasts ``lease_ms`` more."""
        k = getattr(m, "dedup_key", None)
        if k is not None:
            self._renews.setdefault(lease_ms, []).append(k)

    @property
    def pending(self) -> bool:
        return bool(self._commits or self._releases or self._renews)

    def flush(self) -> None:
        """Send what was queued: one call per kind (one round trip each to a shared
        store). Failures are logged, never raised: the FINs and REQs go out anyway."""
        if self._commits:
            keys, self._commits = self._commits, []
            try:
                self.store.commit_many(keys)
            except Exception:
                self._log.exception("[%s] dedup commit failed for %d handled messages: "
                                    "their copies may be handled again", self.name, len(keys))
        if self._releases:
            keys, self._releases = self._releases, []
            try:
                self.store.release_many(keys)
            except Exception:
                self._log.exception("[%s] dedup release failed for %d messages: their "
                                    "redeliveries wait until the claims' lease ends",
                                    self.name, len(keys))
        if self._renews:
            renews, self._renews = self._renews, {}
            for lease_ms, keys in renews.items():
                try:
                    self.store.renew_many(keys, lease_ms)
                except Exception:
                    self._log.exception("[%s] dedup claim renewal failed for %d touched "
                                        "messages", self.name, len(keys))
