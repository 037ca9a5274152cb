"""The pull queue: messages (or MessageBlocks) waiting for ``get_batch`` / ``get_blocks``,
or for the asyncio iterators (:mod:`nsq_spark._consumer.aiter`).

The loop thread puts what passed the intake gate (:meth:`PullQueue.put_messages`,
:meth:`PullQueue.put_blocks`); the caller's thread takes it out (the loop's own thread,
for the asyncio iterators, which :attr:`PullQueue.on_put` wakes). What is put is handed
over (the answers ledger is asked to count it in flight at once: the puller holds it from
then on, as far as nsqd and ``is_starved()`` are concerned) and stays so until answered.
Blocks queued or handed out and not answered are remembered here, so that ``close()``
requeues them (a Message is held by the ledger instead); when one connection closes on
purpose (``disconnect_from_nsqd``), what it delivered leaves the queue first
(:meth:`PullQueue.take_queued`), so that nothing requeued is handed out afterwards. Getters return at once once the
consumer's :class:`~nsq_spark._consumer.lifecycle.Lifecycle` is closing (:meth:`wake`
wakes those waiting). One lock (a Condition) guards it all, but
:meth:`PullQueue.take_one` (see there); nothing here knows the Reader.

:func:`iter_batches` is the pull API's blocking iterator over any ``get_batch``.

:class:`ReceivedPullQueue` is the queue of an instrumented Reader (chosen once, in the
Reader's constructor; a Reader without telemetry has a plain :class:`PullQueue` and pays
nothing): it reports what each getter *hands out* (``get_messages``, ``take_one``,
``get_blocks``), never what is merely queued, so prefetched messages that are requeued by
``close()`` or ``disconnect_from_nsqd`` without being handed out are never counted.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from .._log import get_logger
from ..errors import AlreadyRespondedError, ConfigError

if TYPE_CHECKING:
    from ..message import Message
    from ..protocol import MessageBlock
    from .answers import Answers, Link
    from .lifecycle import Lifecycle

__all__ = ["PullQueue", "ReceivedPullQueue", "iter_batches", "check_max_messages"]

_log = get_logger("nsq_spark.reader.pull")


class PullQueue:
    def __init__(self, answers: "Answers", lifecycle: "Lifecycle") -> None:
        self.answers = answers
        self.lifecycle = lifecycle
        self.cond = threading.Condition()
        self._q: deque[Any] = deque()  # lists of messages, or MessageBlocks
        self._head = 0  # messages of _q[0] already taken one at a time (take_one)
        self.queued = 0  # messages in _q (not counting those)
        # time.monotonic() when the oldest message queued arrived (or an earlier one: a
        # partial take keeps it): a batch's timeout runs from its first message's arrival
        self.since = 0.0
        self._blocks_out: set[MessageBlock] = set()
        # called on the loop thread after every put and on stop (the asyncio iterators'
        # wake-up; None for threads, which wait on ``cond``)
        self.on_put: Callable[[], None] | None = None

    # -- loop thread --------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        """Closing or closed: getters return at once."""
        return self.lifecycle.closing

    def put_messages(self, link: "Link", msgs: list["Message"]) -> None:
        self.answers.hand_over_held(link, msgs)
        with self.cond:
            if not self.queued:
                self.since = time.monotonic()
            self._q.append(msgs)
            self.queued += len(msgs)
            self.cond.notify()
        self.answers.flush()  # what the intake gate answered
        if self.on_put is not None:
            self.on_put()

    def put_blocks(self, link: "Link", blocks: list["MessageBlock"]) -> None:
        n = sum(map(len, blocks))
        self.answers.hand_over_blocks(link, blocks)
        with self.cond:
            if not self.queued:
                self.since = time.monotonic()
            self._blocks_out.update(blocks)
            self._q.extend(blocks)
            self.queued += n
            self.cond.notify()
        self.answers.flush()
        if self.on_put is not None:
            self.on_put()

    def drop_link(self, link: "Link") -> int:
        """Its connection closed: forget its blocks; returns how many messages they held."""
        with self.cond:
            gone = [b for b in self._blocks_out if b.responder is link]
            self._blocks_out.difference_update(gone)
        return sum(map(len, gone))

    def take_queued(self, link: "Link") -> tuple[list["Message"], list["MessageBlock"]]:
        """One connection closes on purpose: its messages and blocks still queued (not
        handed out) leave the queue, never to be handed out; the caller requeues them
        (the messages through the ledger's record, the blocks as returned)."""
        with self.cond:
            q = self._q
            if self._head:  # take_one took the first messages of the head list
                q[0] = q[0][self._head:]
                self._head = 0
            msgs: list[Message] = []
            blocks: list[MessageBlock] = []
            kept: deque[Any] = deque()
            for item in q:
                if isinstance(item, list):
                    mine = [m for m in item if m.responder is link]
                    if mine:
                        msgs.extend(mine)
                        item = [m for m in item if m.responder is not link]
                    if item:
                        kept.append(item)
                elif item.responder is link:
                    blocks.append(item)
                else:
                    kept.append(item)
            self._q = kept
            self._blocks_out.difference_update(blocks)
            self.queued -= len(msgs) + sum(map(len, blocks))
        return msgs, blocks

    def holds_blocks(self, link: "Link") -> bool:
        """Blocks of ``link`` handed out (or queued) and not answered yet."""
        with self.cond:
            return any(b.responder is link and not b._responded for b in self._blocks_out)

    def take_unanswered_blocks(self, link: "Link | None" = None) -> list["MessageBlock"]:
        """Every block not answered (the ledger requeues them), of ``link`` only when
        given (:meth:`take_queued` first), else of every connection: closing, and the
        queue is emptied."""
        if link is not None:
            with self.cond:
                blocks = [b for b in self._blocks_out if b.responder is link]
                self._blocks_out.difference_update(blocks)
            return [b for b in blocks if not b._responded]
        with self.cond:
            blocks = [b for b in self._blocks_out if not b._responded]
            self._blocks_out.clear()
            self._q.clear()
            self._head = self.queued = 0
        return blocks

    def split_blocks(self, blocks: list["MessageBlock"], chosen: Sequence[bool]
                     ) -> tuple[list["MessageBlock"], list["MessageBlock"]]:
        """Handed-out ``blocks`` as two lists of blocks, the ``chosen`` messages' and the
        others' (one flag per message, in order); the parts replace ``blocks`` among those
        handed out, so that each part is answered, and requeued on close, by itself."""
        if len(chosen) != sum(map(len, blocks)):
            raise ConfigError(f"split_blocks needs one flag per message: {len(chosen)} flags "
                              f"for {sum(map(len, blocks))} messages")
        yes: list[MessageBlock] = []
        no: list[MessageBlock] = []
        at = 0
        with self.cond:
            for b in blocks:
                if b._responded:
                    raise AlreadyRespondedError(f"{b!r} was already answered; split only "
                                                "blocks not answered yet")
            for b in blocks:
                flags = chosen[at:at + len(b)]
                at += len(b)
                mine = b.select(flags)
                rest = b.select([not f for f in flags])
                if b in self._blocks_out:  # else its connection closed meanwhile
                    self._blocks_out.discard(b)
                    self._blocks_out.update(mine)
                    self._blocks_out.update(rest)
                yes += mine
                no += rest
        return yes, no

    def wake(self) -> None:
        """The lifecycle moved: wake every waiting getter (they return at once from now
        on, as it is closing)."""
        with self.cond:
            self.cond.notify_all()
        if self.on_put is not None:
            self.on_put()

    # -- the caller's thread ------------------------------------------------------------

    def answered_blocks(self, blocks: Iterable["MessageBlock"]) -> None:
        with self.cond:
            self._blocks_out.difference_update(blocks)

    def _wait(self, timeout: float) -> bool:
        """With the lock held: wait up to ``timeout`` s for something to hand out."""
        deadline = time.monotonic() + timeout
        while self.queued == 0:
            if self.lifecycle.closing:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.cond.wait(remaining)
        return True

    def get_messages(self, max_messages: int, timeout: float) -> list["Message"]:
        with self.cond:
            if not self._wait(timeout):
                return []
            q = self._q
            if self._head:  # take_one took the first messages of the head list
                q[0] = q[0][self._head:]
                self._head = 0
            if self.queued <= max_messages:
                out: list[Message] = [m for b in q for m in b] if len(q) > 1 else q[0]
                q.clear()
                self.queued = 0
                return out
            out = []
            while len(out) < max_messages:
                b = q[0]
                need = max_messages - len(out)
                if len(b) <= need:
                    out.extend(b)
                    q.popleft()
                else:
                    out.extend(b[:need])
                    q[0] = b[need:]
            self.queued -= len(out)
            return out

    def take_one(self) -> "Message | None":
        """The next queued message, or None (no waiting; messages only).

        Without the lock: for the asyncio iterators, on the loop thread, which is the only
        thread that puts or takes then (the Reader refuses thread pullers in that mode).
        The lock cost more than the rest of a message's way to the loop body (1.4 us of
        2.6 us here)."""
        if not self.queued:
            return None
        head = self._q[0]
        m: Message = head[self._head]
        self._head += 1
        if self._head == len(head):
            self._q.popleft()
            self._head = 0
        self.queued -= 1
        return m

    def get_blocks(self, max_messages: int, timeout: float,
                   max_bytes: int | None = None) -> list["MessageBlock"]:
        """Up to ``max_messages`` messages as blocks; with ``max_bytes``, no more once
        their bodies reach it (the message that reaches it is the last one taken: at
        least one when any is queued). What is left stays queued, in order."""
        with self.cond:
            if not self._wait(timeout):
                return []
            q = self._q
            out: list[MessageBlock] = []
            room = max_messages
            budget = max_bytes
            while q and room and (budget is None or budget > 0):
                b = q[0]
                take = min(len(b), room)
                if budget is not None:
                    take = min(take, b.count_to_reach(budget))
                if take == len(b):
                    out.append(q.popleft())
                    head = b
                else:
                    head, tail = b.split(take)
                    if b in self._blocks_out:  # else its connection closed meanwhile
                        self._blocks_out.discard(b)
                        self._blocks_out.update((head, tail))
                    q[0] = tail
                    out.append(head)
                room -= take
                if budget is not None:
                    budget -= head.body_bytes()
            self.queued -= max_messages - room
            return out


class ReceivedPullQueue(PullQueue):
    """A :class:`PullQueue` that reports every non-empty hand-out: ``received(messages,
    start)`` for messages, ``received_blocks(blocks, start)`` for MessageBlocks, on the
    getter's thread after the lock is released (``start``: ``time.perf_counter()`` when
    the getter was called, its wait included). An empty hand-out reports nothing."""

    def __init__(self, answers: "Answers", lifecycle: "Lifecycle",
                 received: Callable[[list["Message"], float], None],
                 received_blocks: Callable[[list["MessageBlock"], float], None]) -> None:
        super().__init__(answers, lifecycle)
        self._received = received
        self._received_blocks = received_blocks

    def get_messages(self, max_messages: int, timeout: float) -> list["Message"]:
        start = time.perf_counter()
        out = super().get_messages(max_messages, timeout)
        if out:
            self._report(self._received, out, start)
        return out

    def take_one(self) -> "Message | None":
        start = time.perf_counter()
        m = super().take_one()
        if m is not None:
            self._report(self._received, [m], start)
        return m

    def _report(self, received: Callable[[Any, float], None], out: Any, start: float) -> None:
        """The messages have left the queue: a failing instrument (a tracer or meter
        provider that raises) is logged, and the caller still gets them, or they would
        stay in flight until nsqd's msg_timeout."""
        try:
            received(out, start)
        except Exception:
            _log.exception("telemetry failed on a pulled hand-out; the messages are "
                           "handed out all the same")

    def get_blocks(self, max_messages: int, timeout: float,
                   max_bytes: int | None = None) -> list["MessageBlock"]:
        start = time.perf_counter()
        out = super().get_blocks(max_messages, timeout, max_bytes)
        if out:
            self._report(self._received_blocks, out, start)
        return out


def iter_batches(get_batch: Callable[[int, float], list["Message"]], max_messages: int,
                 timeout: float) -> Iterator[list["Message"]]:
    """Non-empty batches of ``get_batch(max_messages, timeout)`` until one comes back empty
    (nothing for ``timeout`` seconds, or the consumer closed)."""
    while True:
        batch = get_batch(max_messages, timeout)
        if not batch:
            return
        yield batch


def check_max_messages(max_messages: object) -> int:
    """``max_messages`` of any pull call: an int >= 1, else ConfigError (a ValueError)."""
    if not isinstance(max_messages, int) or isinstance(max_messages, bool) or max_messages < 1:
        raise ConfigError(f"max_messages must be an int >= 1 (the most messages one call "
                          f"hands out), got {max_messages!r}")
    return max_messages
