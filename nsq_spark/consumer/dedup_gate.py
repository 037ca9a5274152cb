"""The deduplicator as the consumer uses it: the Reader's ``dedup=`` / ``dedup_key=``.

:class:`DedupGate` answers two questions and keeps one count: which messages of a chunk
were seen before (:meth:`DedupGate.split_seen`; the intake gate has the ledger finish
them), and "forget these" when messages are requeued (their redelivery must be handled,
not taken for a duplicate; the ledger calls it). It knows neither of them: both hold it,
it holds nothing of theirs. A failing deduplicator never loses a message: a failed check
lets the chunk through, a failed erase is logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence
from .._log import get_logger

if TYPE_CHECKING:
    from ..dedup.base import Deduplicator, Key, KeyFunc
    from ..message import Message

# a child of the Reader's historical logger: its level and handlers still apply
log = get_logger("nsq_spark.reader.intake")

__all__ = ["DedupGate"]


class DedupGate:
    """A deduplicator and its key function."""

    def __init__(self, dedup: "Deduplicator", key: Callable[["Message"], "Key | None"],
                 name: str) -> None:
        self.dedup = dedup
        self.key = key
        self.name = name
        self._log = log.bind(reader=name)
        self.duplicates = 0

    @classmethod
    def build(cls, dedup: "Deduplicator | None", key: "KeyFunc | str | None",
              name: str) -> "DedupGate | None":
        """The gate for the Reader's ``dedup=`` / ``dedup_key=`` options (None: no dedup).
        ``key``: a function, ``"id"`` / ``"body"``, or None (the deduplicator's own
        ``key_func``, else the message id)."""
        if dedup is None:
            return None
        if not callable(getattr(dedup, "check_and_set", None)) or \
                not callable(getattr(dedup, "erase", None)):
            raise TypeError("dedup must have check_and_set(key) and erase(key) "
                            "(see nsq_spark.dedup)")
        from ..dedup import resolve_key  # only when used
        return cls(dedup, resolve_key(key if key is not None else getattr(dedup, "key_func", None)),
                   name)

    def split_seen(self, msgs: list["Message"], source: str
                   ) -> tuple[list["Message"], list["Message"]]:
        """``(new, seen)``: the messages of a chunk not seen before, and those that were
        (counted in :attr:`duplicates`). ``source``: the nsqd address, for the log."""
        from ..dedup import check_and_set_many  # only when used
        key = self.key
        got = [key(m) for m in msgs]
        new: list[Message] = []
        if None in got:   # no key (no publish id): never a duplicate
            new = [m for m, k in zip(msgs, got) if k is None]
            msgs = [m for m, k in zip(msgs, got) if k is not None]
        keys = [k for k in got if k is not None]
        try:
            seen = check_and_set_many(self.dedup, keys) if keys else []
        except Exception:
            self._log.for_nsqd(source).exception(
                "[%s] dedup check failed on %d messages from %s; handling them "
                "anyway", self.name, len(msgs), source)
            return new + msgs, []
        if not any(seen):
            return new + msgs, []
        dups: list[Message] = []
        for m, dup in zip(msgs, seen):
            (dups if dup else new).append(m)
        self.duplicates += len(dups)
        return new, dups

    def forget(self, m: "Message") -> None:
        """``m`` was requeued: its redelivery must be handled, not taken for a duplicate."""
        k = self.key(m)
        if k is None:
            return
        try:
            self.dedup.erase(k)
        except Exception:
            self._log.exception(
                "[%s] dedup erase failed for message %s: its redelivery may be "
                "dropped as a duplicate", self.name, m.id.decode("ascii", "replace"))

    def forget_many(self, msgs: Sequence["Message"]) -> None:
        from ..dedup import erase_many  # only when used
        try:
            erase_many(self.dedup, [k for k in map(self.key, msgs) if k is not None])
        except Exception:
            self._log.exception("[%s] dedup erase failed for %d messages", self.name, len(msgs))
