"""The intake gate: every delivery passes here before a handler or a puller sees it.

The pool hands each read chunk here (:meth:`Intake.on_messages`, :meth:`Intake.on_blocks`);
what passes goes on to the chosen sink (the handler strategy or the pull queue, set once
by the Reader when it starts). In this order, per read chunk:

1. **closing**: a chunk that arrives after ``close()`` began (nsqd sent it before our
   RDY 0 / CLS took effect) is requeued at once, without delay or backoff;
2. **envelopes** (messages only, unless ``open_envelopes=False``): a body in a publish
   envelope (:mod:`nsq_spark.envelope`, version 3) is opened, checked: ``body`` becomes
   the published body, ``publish_id`` and ``trace`` are set. A damaged one (cut short, a
   CRC-32 that does not match) is handed over whole, as a plain body with no
   ``publish_id``, counted in ``damaged_envelopes`` and logged (WARNING, at most once a
   minute with the count): never cut, never a key, never dropped. Versions 1 and 2 stay
   in the body as before (telemetry opens version 2);
3. **dedup** (messages only): each key is claimed for the connection's ``msg_timeout``
   (:mod:`~nsq_spark._consumer.dedup_gate`): a committed key's message is finished
   without being handed over (``duplicates``); one another consumer holds a live claim
   on is requeued after about what is left of that lease, without backoff, never
   finished (``held``); the rest are ours and go on. A failing deduplicator lets every
   message through;
4. **max_tries**: a message delivered more than ``max_tries`` times goes to the
   ``giving_up`` hook and is then finished; if the hook raises it is requeued (pynsq's
   rule), so it comes back to the hook on its next delivery (``given_up``). The
   deliveries this gate requeued as held (step 3) do not count: a copy waiting for
   another consumer's lease is not given up for having waited (remembered in this
   process for the last :data:`HELD_REMEMBERED` held messages).

Messages the gate answers itself were never handed over, so they are not in flight;
``giving_up`` is handed its message like a handler (and may answer it, now or later after
``enable_async()``, as :class:`nsq_spark.contrib.dead_letter.DeadLetter` does). The gate asks the
answers ledger for every answer (it writes no record of a connection), reads the
consumer's :class:`~nsq_spark._consumer.lifecycle.Lifecycle`, and gets the hook and the
sinks as callables; it runs on the loop thread, once per chunk, and scans a chunk once
(one plain loop over the attempts) when nothing in it is over ``max_tries``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from .._log import get_logger
from ..envelope import PUBLISH_ENVELOPE_MAGIC, open_body
from ..errors import NSQError

if TYPE_CHECKING:
    from ..message import Message
    from ..protocol import MessageBlock
    from .answers import Answers, Link
    from .dedup_gate import DedupGate
    from .lifecycle import Lifecycle

# a child of the Reader's historical logger: its level and handlers still apply
log = get_logger("nsq_spark.reader.intake")

__all__ = ["Intake", "MessageSink", "BlockSink"]

MessageSink = Callable[["Link", list["Message"]], None]
BlockSink = Callable[["Link", list["MessageBlock"]], None]


def _any_over(msgs: list["Message"], max_tries: int) -> bool:
    # a plain loop: measured 29 ns/message here, max(map(attrgetter)) 80, any(genexpr) 65
    for m in msgs:
        if m.attempts > max_tries:
            return True
    return False


#: seconds between two WARNING lines about damaged envelopes (the count is in each)
DAMAGED_LOG_INTERVAL = 60.0

#: held messages whose held deliveries the max_tries step discounts (the oldest forgotten
#: first: a forgotten one counts all its deliveries, as nsqd does)
HELD_REMEMBERED = 1 << 16


def open_publish_envelopes(msgs: list["Message"]) -> list[tuple["Message", str]]:
    """Open the publish envelopes of ``msgs`` in place (see the module doc, step 2); the
    damaged ones with the reason, left whole. About 17 ns a message when none has an
    envelope (one byte looked at: a first byte of zero is rare in any other body)."""
    damaged: list[tuple[Message, str]] = []
    magic = PUBLISH_ENVELOPE_MAGIC
    for m in msgs:
        body = m.body
        if body and not body[0] and body[:5] == magic:
            e = open_body(body)
            if e.damaged is not None:
                damaged.append((m, e.damaged))
                continue
            m.body = e.body
            m.publish_id = e.publish_id
            if e.traceparent is not None:
                m.trace = (e.traceparent, e.tracestate)
    return damaged


def _not_started(link: "Link", chunk: list[Any]) -> None:
    """The sink before one is chosen: a delivery then is a bug, never a silent drop."""
    raise NSQError(f"{len(chunk)} messages from {link.address} arrived before the consumer "
                   "chose where they go (a handler strategy or the pull queue)")


class Intake:
    """The gate of one consumer.

    Args:
        answers: the ledger that answers what the gate keeps back.
        lifecycle: the consumer's; read once per chunk.
        max_tries: deliveries after which a message is given up; 0: never.
        giving_up: ``f(message)``, the hook for given-up messages.
        dedup: the deduplicator gate, or None.
        open_envelopes: open publish envelopes (step 2 of the module doc).

    Attributes:
        to_messages: where messages that pass go (the handler strategy or the pull
            queue's ``put_messages``); set once when the consumer starts.
        to_blocks: the same for MessageBlocks (the pull queue's ``put_blocks``).
    """

    def __init__(self, answers: "Answers", lifecycle: "Lifecycle", max_tries: int,
                 giving_up: Callable[["Message"], Any], name: str,
                 dedup: "DedupGate | None" = None, open_envelopes: bool = True) -> None:
        self.answers = answers
        self.lifecycle = lifecycle
        self.max_tries = max_tries
        self.giving_up = giving_up
        self.name = name
        self._log = log.bind(reader=name)
        self.dedup = dedup
        self.open_envelopes = open_envelopes
        self.given_up = 0
        self.damaged_envelopes = 0
        self._damaged_logged_at: float | None = None
        self._damaged_unlogged = 0
        self.to_messages: MessageSink = _not_started
        self.to_blocks: BlockSink = _not_started
        # (nsqd address, message id) -> deliveries requeued as held (step 3)
        self._held_times: dict[tuple[str, bytes], int] = {}

    # -- deliveries from the pool (loop thread, once per read chunk) ----------------------

    def on_messages(self, link: "Link", msgs: list["Message"]) -> None:
        msgs = self.messages(link, msgs)
        if msgs:
            self.to_messages(link, msgs)
        else:
            self.answers.flush()  # what the gate answered

    def on_blocks(self, link: "Link", blocks: list["MessageBlock"]) -> None:
        blocks = self.blocks(link, blocks)
        if blocks:
            self.to_blocks(link, blocks)
        else:
            self.answers.flush()

    # -- the gate ---------------------------------------------------------------------------

    def messages(self, link: "Link", msgs: list["Message"]) -> list["Message"]:
        """The messages of a chunk that go on to the handler or puller."""
        if self.lifecycle.closing:
            self.answers.give_back(link, msgs)
            return []
        if self.open_envelopes:
            damaged = open_publish_envelopes(msgs)
            if damaged:
                self._damaged(link, damaged)
        if self.dedup is not None:
            msgs = self._claim(link, msgs)
        max_tries = self.max_tries
        held_times = self._held_times
        if max_tries and _any_over(msgs, max_tries):
            keep = []
            for m in msgs:
                attempts = m.attempts
                if held_times:
                    attempts -= held_times.get((link.address, m.id), 0)
                if attempts > max_tries:
                    self._give_up(link, m)
                else:
                    keep.append(m)
            msgs = keep
        if held_times:  # these are ours now: no longer waiting
            address = link.address
            for m in msgs:
                held_times.pop((address, m.id), None)
        return msgs

    def _claim(self, link: "Link", msgs: list["Message"]) -> list["Message"]:
        """Step 3: the messages claimed for us; the gate answers the others."""
        assert self.dedup is not None
        new, done, held = self.dedup.claim(msgs, link.msg_timeout_ms, link.address)
        if done:
            self.answers.finish_unhanded(link, done)
            if self._held_times:
                for m in done:
                    self._held_times.pop((link.address, m.id), None)
        if held:
            from ..dedup.base import HELD_MARGIN_MS  # only when used
            # back after the holder's lease: its handler committed (then a duplicate) or
            # failed or died (then ours); the wait is capped as a requeue's default is
            cap = self.answers.max_requeue_delay_ms
            self.answers.requeue_unhanded(
                link, [(m, min(left + HELD_MARGIN_MS, cap)) for m, left in held])
            self._count_held(link.address, held)
        return new

    def _count_held(self, address: str, held: list[tuple["Message", int]]) -> None:
        times = self._held_times
        for m, _ in held:
            k = (address, m.id)
            times[k] = times.pop(k, 0) + 1  # to the end: the oldest go first
        while len(times) > HELD_REMEMBERED:
            del times[next(iter(times))]

    def blocks(self, link: "Link", blocks: list["MessageBlock"]) -> list["MessageBlock"]:
        """The same rules for MessageBlocks (no dedup: blocks go to the Spark source,
        which deduplicates by id downstream)."""
        if self.lifecycle.closing:
            self.answers.give_back_blocks(link, blocks)
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

    def _damaged(self, link: "Link", damaged: list[tuple["Message", str]]) -> None:
        self.damaged_envelopes += len(damaged)
        self._damaged_unlogged += len(damaged)
        now = time.monotonic()
        last = self._damaged_logged_at
        if last is not None and now - last < DAMAGED_LOG_INTERVAL:
            return
        m, reason = damaged[0]
        self._log.for_nsqd(link.address).warning(
            "[%s] %d message(s) with a damaged publish envelope since the last report, "
            "handed over whole as plain bodies (no publish_id): message %s from %s: %s",
            self.name, self._damaged_unlogged, m.id.decode("ascii", "replace"), link.address,
            reason)
        self._damaged_logged_at = now
        self._damaged_unlogged = 0

    def _give_up(self, link: "Link", m: "Message") -> None:
        # the hook is handed the message like a handler (it may answer it itself)
        self.given_up += 1
        answers = self.answers
        answers.hand_over(link, (m,))
        try:
            self.giving_up(m)
        except Exception:
            # as pynsq: the message goes back to nsqd (finishing it would drop a message the
            # application failed to put aside); giving_up() gets it again next delivery
            self._log.for_nsqd(link.address).exception(
                "[%s] giving_up() failed for message %s from %s; requeueing it",
                self.name, m.id.decode("ascii", "replace"), link.address)
            answers.settle(link, m, False)
            return
        if m.delegated and not m.responded:
            # enable_async(): the hook answers later (e.g. once a dead-letter copy is
            # acknowledged), as a handler may; held, so close() requeues it if it never does
            answers.hold_one(link, m)
            return
        answers.settle(link, m, True)
