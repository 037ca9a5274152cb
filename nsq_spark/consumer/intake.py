"""The intake gate: every delivery passes here before a handler or a puller sees it.

In this order, per read chunk:

1. **closing**: a chunk that arrives after ``close()`` began (nsqd sent it before our
   RDY 0 / CLS took effect) is requeued at once, without delay or backoff;
2. **dedup** (messages only): keys the deduplicator has seen are finished without being
   handed over (``duplicates``); a failing deduplicator lets every message through;
3. **max_tries**: a message delivered more than ``max_tries`` times goes to the
   ``giving_up`` hook and is then finished; if the hook raises it is requeued (pynsq's
   rule), so it comes back to the hook on its next delivery (``given_up``).

Messages the gate answers itself were never handed over, so they are not in flight;
``giving_up`` is handed its message like a handler (and may answer it). The gate
gets the answers ledger and the hook as collaborators; it runs on the loop thread, once
per chunk, and scans a chunk once (one plain loop over the attempts) when nothing in it is
over ``max_tries``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from ..message import Message
    from ..protocol import MessageBlock
    from .answers import Answers, Link

# a child of the Reader's historical logger: its level and handlers still apply
log = logging.getLogger("nsq_spark.reader.intake")

__all__ = ["Intake", "DedupGate"]



def _any_over(msgs: list["Message"], max_tries: int) -> bool:
    # a plain loop: measured 29 ns/message here, max(map(attrgetter)) 80, any(genexpr) 65
    for m in msgs:
        if m.attempts > max_tries:
            return True
    return False


class DedupGate:
    """A deduplicator and its key function, as the gate and the ledger use it."""

    def __init__(self, dedup: Any, key: Callable[["Message"], Any], name: str) -> None:
        self.dedup = dedup
        self.key = key
        self.name = name
        self.duplicates = 0

    @classmethod
    def build(cls, dedup: Any, key: Any, name: str) -> "DedupGate | None":
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

    def drop_seen(self, link: "Link", msgs: list["Message"], answers: "Answers"
                  ) -> list["Message"]:
        """``msgs`` less those seen before, which are finished."""
        from ..dedup import check_and_set_many  # only when used
        key = self.key
        try:
            seen = check_and_set_many(self.dedup, [key(m) for m in msgs])
        except Exception:
            log.exception("[%s] dedup check failed on %d messages from %s; handling them "
                          "anyway", self.name, len(msgs), link.address)
            return msgs
        keep = []
        for m, dup in zip(msgs, seen):
            if dup:
                m.responded = True
                answers.finish_arrived(link, m)
                self.duplicates += 1
            else:
                keep.append(m)
        return keep

    def forget(self, m: "Message") -> None:
        """``m`` was requeued: its redelivery must be handled, not taken for a duplicate."""
        try:
            self.dedup.erase(self.key(m))
        except Exception:
            log.exception("[%s] dedup erase failed for message %s: its redelivery may be "
                          "dropped as a duplicate", self.name, m.id.decode("ascii", "replace"))

    def forget_many(self, msgs: Sequence["Message"]) -> None:
        from ..dedup import erase_many
        try:
            erase_many(self.dedup, [self.key(m) for m in msgs])
        except Exception:
            log.exception("[%s] dedup erase failed for %d messages", self.name, len(msgs))


class Intake:
    """The gate of one consumer.

    Args:
        answers: the ledger that answers what the gate keeps back.
        max_tries: deliveries after which a message is given up; 0: never.
        giving_up: ``f(message)``, the hook for given-up messages.
        dedup: the deduplicator, or None.
    """

    def __init__(self, answers: "Answers", max_tries: int,
                 giving_up: Callable[["Message"], Any], name: str,
                 dedup: DedupGate | None = None) -> None:
        self.answers = answers
        self.max_tries = max_tries
        self.giving_up = giving_up
        self.name = name
        self.dedup = dedup
        self.closing = False
        self.given_up = 0

    def messages(self, link: "Link", msgs: list["Message"]) -> list["Message"]:
        """The messages of a chunk that go on to the handler or puller."""
        if self.closing:
            for m in msgs:
                m.responded = True
            self.answers.give_back(link, [m.id for m in msgs])
            return []
        if self.dedup is not None:
            msgs = self.dedup.drop_seen(link, msgs, self.answers)
        max_tries = self.max_tries
        if max_tries and _any_over(msgs, max_tries):
            keep = []
            for m in msgs:
                if m.attempts > max_tries:
                    self._give_up(link, m)
                else:
                    keep.append(m)
            msgs = keep
        return msgs

    def blocks(self, link: "Link", blocks: list["MessageBlock"]) -> list["MessageBlock"]:
        """The same rules for MessageBlocks (no dedup: blocks go to the Spark source,
        which deduplicates by id downstream)."""
        if self.closing:
            for b in blocks:
                b._responded = True
                self.answers.give_back(link, b.ids())
            return []
        max_tries = self.max_tries
        if max_tries and any(b.max_attempts > max_tries for b in blocks):
            kept: list[MessageBlock] = []
            for b in blocks:
                if b.max_attempts <= max_tries:
                    kept.append(b)
                    continue
                keep = [a <= max_tries for a in b.attempts()]
                for m, ok in zip(b.messages(), keep):
                    if not ok:
                        self._give_up(link, m)
                kept.extend(b.select(keep))
            blocks = kept
        return blocks

    def _give_up(self, link: "Link", m: "Message") -> None:
        # the hook is handed the message like a handler (it may answer it itself)
        self.given_up += 1
        link.rdy.in_flight += 1
        try:
            self.giving_up(m)
        except Exception:
            # as pynsq: the message goes back to nsqd (finishing it would drop a message the
            # application failed to put aside); giving_up() gets it again next delivery
            log.exception("[%s] giving_up() failed for message %s from %s; requeueing it",
                          self.name, m.id.decode("ascii", "replace"), link.address)
            if not m.responded:
                m.responded = True
                self.answers.requeue(link, m, None, True)
            return
        if not m.responded:
            m.responded = True
            self.answers.finish(link, m)
