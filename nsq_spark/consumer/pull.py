"""The pull queue: messages (or MessageBlocks) waiting for ``get_batch`` / ``get_blocks``.

The loop thread puts what passed the intake gate (:meth:`PullQueue.put_messages`,
:meth:`PullQueue.put_blocks`); the caller's thread takes it out. What is put is handed
over, so it is counted in flight at once (the puller holds it from then on, as far as nsqd
and ``is_starved()`` are concerned) and stays so until answered. Blocks queued or handed
out and not answered are remembered here, so that ``close()`` requeues them (a Message
is remembered by its connection's ``outstanding`` instead). One lock (a Condition) guards
it all; nothing here knows the Reader.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from ..message import Message
    from ..protocol import MessageBlock
    from .answers import Answers, Link

__all__ = ["PullQueue"]


class PullQueue:
    def __init__(self, answers: "Answers") -> None:
        self.answers = answers
        self.cond = threading.Condition()
        self._q: deque[Any] = deque()  # lists of messages, or MessageBlocks
        self.queued = 0  # messages in _q
        self.stopped = False  # closing or closed: getters return at once
        self._blocks_out: set[MessageBlock] = set()

    # -- loop thread --------------------------------------------------------------------

    def put_messages(self, link: "Link", msgs: list["Message"]) -> None:
        link.rdy.in_flight += len(msgs)
        out = link.outstanding
        for m in msgs:
            out[m.id] = m
        with self.cond:
            self._q.append(msgs)
            self.queued += len(msgs)
            self.cond.notify()
        self.answers.flush()  # what the intake gate answered

    def put_blocks(self, link: "Link", blocks: list["MessageBlock"]) -> None:
        if not blocks:  # the intake gate kept them all back
            self.answers.flush()
            return
        n = sum(map(len, blocks))
        link.rdy.in_flight += n
        with self.cond:
            self._blocks_out.update(blocks)
            self._q.extend(blocks)
            self.queued += n
            self.cond.notify()
        self.answers.flush()

    def drop_link(self, link: "Link") -> int:
        """Its connection closed: forget its blocks; returns how many messages they held."""
        with self.cond:
            gone = [b for b in self._blocks_out if b.responder is link]
            self._blocks_out.difference_update(gone)
        return sum(map(len, gone))

    def take_unanswered_blocks(self) -> list["MessageBlock"]:
        """Closing: every block not answered, marked answered; the queue emptied."""
        with self.cond:
            blocks = [b for b in self._blocks_out if not b._responded]
            self._blocks_out.clear()
            self._q.clear()
            self.queued = 0
        for b in blocks:
            b._responded = True
        return blocks

    def stop(self) -> None:
        """Wake every waiting getter; from now on they return at once."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    # -- the caller's thread ------------------------------------------------------------

    def answered_blocks(self, blocks: Iterable["MessageBlock"]) -> None:
        with self.cond:
            self._blocks_out.difference_update(blocks)

    def _wait(self, timeout: float) -> bool:
        """With the lock held: wait up to ``timeout`` s for something to hand out."""
        deadline = time.monotonic() + timeout
        while self.queued == 0:
            if self.stopped:
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

    def get_blocks(self, max_messages: int, timeout: float) -> list["MessageBlock"]:
        with self.cond:
            if not self._wait(timeout):
                return []
            q = self._q
            out: list[MessageBlock] = []
            room = max_messages
            while q and room:
                b = q[0]
                if len(b) <= room:
                    out.append(q.popleft())
                    room -= len(b)
                else:
                    head, tail = b.split(room)
                    if b in self._blocks_out:  # else its connection closed meanwhile
                        self._blocks_out.discard(b)
                        self._blocks_out.update((head, tail))
                    q[0] = tail
                    out.append(head)
                    room = 0
            self.queued -= max_messages - room
            return out
