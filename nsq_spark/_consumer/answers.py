"""The answers ledger: FIN / REQ / TOUCH from any thread, in flight counted once.

Every answer to a delivered message passes here, whoever gives it: a handler's return
value, ``message.finish()`` from a worker thread, the pull API's bulk ``finish()``, the
intake gate (duplicates, give-ups, deliveries during close), ``close()`` requeueing what
is left. The ledger

* owns the record of each connection (:class:`Link`): its connection, RDY state, queued
  answers and the messages handed out and not answered. Only the ledger writes it; the
  pool, the intake gate, the handler strategies and the pull queue call it with whole
  chunks (:meth:`Answers.hand_over`, :meth:`Answers.settle_chunk`, ...), as go-nsq's
  ``Conn`` owns its answers and in-flight count and the consumer only observes;
* writes the rule "an answer queued = marked responded = out of flight = counted once"
  in one place (:meth:`Answers._finish`, :meth:`Answers._requeue`, and the chunk loops
  beside them);
* counts in flight in one place, ``ConnRdy.in_flight`` of the message's connection
  (read by :meth:`~nsq_spark._consumer.rdy.RdyPolicy.is_starved` and the RDY tick): a
  message is in flight from the moment it is handed to a handler or a puller until it is
  answered (taken off here, at once, not when the answer reaches the socket); answers to
  messages never handed over (the intake gate's) do not touch it;
* queues answers per connection and sends them in one write per connection and loop turn
  (:meth:`Answers.flush`); an answer for a connection that closed meanwhile is counted in
  ``dropped_responses``, never sent to another connection (ids belong to a connection);
* feeds the backoff policy one result per turn (``on_result(success)``): any failure
  (a REQ with backoff) in the turn makes it a failure;
* tells the deduplicator gate, when there is one, what became of each message handed
  over -- finished: committed, requeued or given back: released, touched: renewed --,
  and has it send that (one call per kind) at the start of each flush, before the FINs of
  the turn are written (:mod:`~nsq_spark._consumer.dedup_gate` says why). Messages the
  gate itself kept back (duplicates, held copies) are answered here too
  (:meth:`Answers.finish_unhanded`, :meth:`Answers.requeue_unhanded`), never in flight.

Loop thread only, except :meth:`Answers.answer` (through a :class:`Link`, the Responder of
a message) and the bulk calls, which any thread may call. The ledger knows nothing of its
owner nor of the parts that call it: it gets the loop bridge, a callable for the backoff
results and the deduplicator gate.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from .._log import get_logger
from ..errors import AlreadyRespondedError, NSQError
from .._handshake import Negotiated
from .rdy import ConnRdy

if TYPE_CHECKING:
    from .._loop import LoopBridge
    from ..message import Message
    from ..protocol import MessageBlock
    from .connection_port import ConsumerConnection
    from .dedup_gate import DedupGate

# a child of the Reader's historical logger: its level and handlers still apply
log = get_logger("nsq_spark.reader.answers")

__all__ = ["Answers", "Link", "FIN", "REQ", "TOUCH"]

FIN, REQ, TOUCH = 0, 1, 2


class Link:
    """One nsqd connection of a consumer, and the Responder of the messages it delivered
    (their answers go through the ledger, which sends them on this connection).

    Read by anyone, written by the ledger only (:class:`Answers`)."""

    __slots__ = ("answers", "address", "host", "port", "conn", "rdy", "subscribed", "fins",
                 "fin_blocks", "reqs", "dirty", "outstanding", "__weakref__")

    def __init__(self, answers: "Answers", host: str, port: int, address: str) -> None:
        self.answers = answers
        self.host = host
        self.port = port
        self.address = address
        self.conn: ConsumerConnection | None = None
        # the policy's state once subscribed (a detached one before: counts nothing)
        self.rdy: ConnRdy[Link] = ConnRdy(address, handle=self)
        self.subscribed = False
        self.fins: list[bytes] = []  # FINs queued during this loop turn
        self.fin_blocks: list[MessageBlock] = []  # block FINs queued during this loop turn
        self.reqs: list[tuple[bytes, int]] = []  # REQs queued during this loop turn
        self.dirty = False
        # messages handed out of the loop's hands and not answered (async handlers,
        # pulled): close() requeues them
        self.outstanding: dict[bytes, Message] = {}

    # Responder protocol: any thread
    def on_finish(self, msg: "Message") -> None:
        self.answers.answer(self, msg, FIN, None, True)

    def on_requeue(self, msg: "Message", delay_ms: int | None, backoff: bool) -> None:
        self.answers.answer(self, msg, REQ, delay_ms, backoff)

    def on_touch(self, msg: "Message") -> None:
        self.answers.answer(self, msg, TOUCH, None, False)

    @property
    def msg_timeout_ms(self) -> int:
        """The message timeout nsqd set for this connection (IDENTIFY), in ms: how long a
        message it delivered may go unanswered, and so the lease of its dedup claims."""
        conn = self.conn
        # before IDENTIFY answered (no delivery yet): nsqd's default
        return conn.msg_timeout if conn is not None else Negotiated.msg_timeout

    def __repr__(self) -> str:
        return f"<nsqd {self.address}>"


class Answers:
    """The ledger of one consumer.

    Args:
        bridge: the consumer's loop.
        requeue_delay_ms, max_requeue_delay_ms: the default requeue delay is
            ``requeue_delay_ms * attempts``, at most ``max_requeue_delay_ms``.
        on_result: ``f(success)``, once per flush that sent answers counting for backoff.
        dedup: the deduplicator gate, or None: a finished message is committed in it, a
            requeued one released (its redelivery is handled, not taken for a
            duplicate), a touched one renewed.
    """

    def __init__(self, bridge: "LoopBridge", name: str, requeue_delay_ms: int,
                 max_requeue_delay_ms: int, on_result: Callable[[bool], None] | None = None,
                 dedup: "DedupGate | None" = None) -> None:
        self.bridge = bridge
        self.name = name
        self.requeue_delay_ms = requeue_delay_ms
        self.max_requeue_delay_ms = max_requeue_delay_ms
        self.on_result = on_result
        self.dedup = dedup
        self.finished = 0
        self.requeued = 0
        self.dropped_responses = 0  # answers for a connection that had closed
        self.oks = 0  # successes and failures since the last flush (backoff results)
        self.fails = 0
        self._dirty: list[Link] = []
        self._flush_scheduled = False
        # cross-thread answers: appended by any thread, drained by one loop callback
        self._xq: deque[tuple[Link, Message, int, Any, bool]] = deque()
        self._x_scheduled = False

    # -- any thread ---------------------------------------------------------------------

    def answer(self, link: Link, msg: "Message", kind: int, delay: Any, backoff: bool) -> None:
        """One answer (``msg.responded`` already set by the Message), from any thread."""
        bridge = self.bridge
        if bridge.on_loop_thread():
            self._answer_on_loop(link, msg, kind, delay, backoff)
            return
        loop = bridge.loop
        if loop is None or loop.is_closed():
            raise NSQError(f"[{self.name}] the Reader is closed; message "
                           f"{msg.id.decode('ascii', 'replace')} will be redelivered by nsqd "
                           "after its timeout")
        self._xq.append((link, msg, kind, delay, backoff))
        if not self._x_scheduled:
            self._x_scheduled = True
            try:
                loop.call_soon_threadsafe(self.drain_cross_thread)
            except RuntimeError:  # the loop closed meanwhile
                self._x_scheduled = False
                raise NSQError(f"[{self.name}] the Reader is closed; the message will be "
                               "redelivered by nsqd after its timeout") from None

    def bulk(self, messages: Iterable["Message"], kind: int, delay: Any, backoff: bool
             ) -> None:
        """FIN or REQ many messages at once (the pull API), from any thread: all checked,
        then all sent, or none (AlreadyRespondedError, or NSQError for a message another
        consumer delivered or a closed consumer)."""
        msgs = list(messages)
        for m in msgs:  # per message: inline checks, no call
            r = m.responder
            if m.responded or r.__class__ is not Link or r.answers is not self:  # type: ignore[union-attr,unused-ignore]
                if m.responded:
                    raise AlreadyRespondedError(f"message {m.id!r} was already answered; "
                                                "nothing of this batch was sent")
                raise NSQError(f"message {m.id!r} was not delivered by this Reader")
        if not msgs:
            return
        self._check_usable()
        for m in msgs:
            m.responded = True
        if kind == FIN:
            self.bridge.call(self.finish_many, msgs)
        else:
            self.bridge.call(self.requeue_many, msgs, delay, backoff)

    def bulk_blocks(self, blocks: Iterable["MessageBlock"], kind: int, delay: Any,
                    backoff: bool, answered: Callable[[list["MessageBlock"]], None]) -> None:
        """:meth:`bulk` for MessageBlocks; ``answered(blocks)`` once they are claimed."""
        claimed = list(blocks)
        for b in claimed:
            if b._responded:
                raise AlreadyRespondedError(f"{b!r} was already answered; nothing of this "
                                            "call was sent")
            if not self._mine(b.responder):
                raise NSQError(f"{b!r} was not delivered by this Reader")
        if not claimed:
            return
        self._check_usable()
        for b in claimed:
            b._responded = True
        answered(claimed)
        if kind == FIN:
            self.bridge.call(self.finish_blocks, claimed)
        else:
            self.bridge.call(self.requeue_blocks, claimed, delay, backoff)

    def _mine(self, responder: Any) -> bool:
        return isinstance(responder, Link) and responder.answers is self

    def _check_usable(self) -> None:
        if not self.bridge.usable:
            raise NSQError(self.bridge.closed_message)

    # -- loop thread --------------------------------------------------------------------

    def drain_cross_thread(self) -> None:
        self._x_scheduled = False  # first: an append racing with the drain schedules anew
        q = self._xq
        pop = q.popleft
        while q:
            link, msg, kind, delay, backoff = pop()
            self._answer_on_loop(link, msg, kind, delay, backoff)

    def _answer_on_loop(self, link: Link, msg: "Message", kind: int, delay: Any,
                        backoff: bool) -> None:
        if kind == TOUCH:
            conn = link.conn
            if conn is not None and not conn.closed:
                conn.touch(msg.id)
            if self.dedup is not None:
                self.dedup.renew(msg, link.msg_timeout_ms)
                self.schedule_flush()
            return
        if link.outstanding:
            link.outstanding.pop(msg.id, None)
        if kind == FIN:
            self._finish(link, msg)
        else:
            self._requeue(link, msg, delay, backoff)
        self.schedule_flush()

    # -- the record of a connection (the pool) -------------------------------------------

    def link(self, host: str, port: int, address: str) -> Link:
        """A new connection's record (not connected yet)."""
        return Link(self, host, port, address)

    def attach(self, link: Link, conn: "ConsumerConnection | None") -> None:
        """``link`` now answers on ``conn`` (None: its connect failed)."""
        link.conn = conn

    def subscribed(self, link: Link, rdy: "ConnRdy[Link]") -> None:
        """``link`` subscribed; ``rdy`` is its state in the RDY policy from now on."""
        link.rdy = rdy
        link.subscribed = True

    # -- handing over (the strategies, the pull queue, the intake gate) --------------------

    def hand_over(self, link: Link, msgs: Sequence["Message"]) -> None:
        """``msgs`` go to the application: in flight from now on."""
        link.rdy.in_flight += len(msgs)

    def hand_over_each(self, link: Link, msgs: Sequence["Message"],
                       call: Callable[["Message"], Any],
                       other: Callable[[Link, "Message", Any, "Exception | None"], None]
                       ) -> None:
        """Hand ``msgs`` over one at a time to ``call`` (a per-message handler) and settle
        each by its result; then flush.

        A message is in flight from the moment it is handed over (``is_starved()`` inside
        ``call`` sees the messages handed so far, as pynsq shows). Unless ``call`` answered
        it, or delegated it (``enable_async()``: then it is held), a result True or None
        finishes it and False requeues it (default delay, with backoff); an exception, or
        any other result (an awaitable), goes to ``other(link, m, result, exc)``, the
        strategy's. The finished ones leave flight together at the end of the chunk, in
        the loop turn their FINs are written: one counter update per chunk, and the loop
        is inline (a generator or a second pass cost 10 and 35 ns per message here)."""
        st = link.rdy
        out = link.outstanding
        done: list[bytes] = []  # this chunk's FINs by result (answers through Message
        fin = done.append       # may add to link.fins meanwhile)
        for m in msgs:
            st.in_flight += 1
            try:
                r = call(m)
            except Exception as exc:
                other(link, m, None, exc)
                continue
            if m.responded:
                continue
            if m.delegated:
                out[m.id] = m
                if r is not None and r is not True and r is not False:
                    other(link, m, r, None)
                continue
            if r is True or r is None:
                m.responded = True
                fin(m.id)
            elif r is False:
                m.responded = True
                self._requeue(link, m, None, True)
            else:
                other(link, m, r, None)
        if done:
            link.fins.extend(done)
            st.in_flight -= len(done)
            self.oks += len(done)
            if self.dedup is not None:
                self._commit_ids(msgs, done)
        self._mark(link)
        self.flush()

    def _commit_ids(self, msgs: Sequence["Message"], ids: Sequence[bytes]) -> None:
        """The messages of ``msgs`` finished as ``ids`` (a chunk's result) are committed."""
        assert self.dedup is not None
        if len(ids) == len(msgs):  # the whole chunk finished: no set to build
            self.dedup.commit_many(msgs)
            return
        finished = set(ids)
        self.dedup.commit_many([m for m in msgs if m.id in finished])

    def hold(self, link: Link, msgs: Sequence["Message"]) -> None:
        """Handed-over ``msgs`` stay with the application beyond this chunk (async handlers,
        pulled): remembered, so that close() requeues those left unanswered."""
        out = link.outstanding
        for m in msgs:
            out[m.id] = m

    def hold_one(self, link: Link, m: "Message") -> None:
        link.outstanding[m.id] = m

    def hand_over_held(self, link: Link, msgs: Sequence["Message"]) -> None:
        """:meth:`hand_over` and :meth:`hold` at once (pulled, coroutine handlers)."""
        link.rdy.in_flight += len(msgs)
        out = link.outstanding
        for m in msgs:
            out[m.id] = m

    def hand_over_blocks(self, link: Link, blocks: Sequence["MessageBlock"]) -> None:
        """Every message of ``blocks`` is in flight from now on (the pull queue remembers
        the blocks themselves)."""
        link.rdy.in_flight += sum(map(len, blocks))

    # -- settling what was handed over ----------------------------------------------------

    def settle(self, link: Link, m: "Message", ok: bool) -> None:
        """A handed-over message's result (a handler's, an async one's, a give-up hook's):
        FIN if ``ok``, else REQ with the default delay and backoff; nothing if it was
        answered already. Queued: the caller flushes (or :meth:`schedule_flush`)."""
        if link.outstanding:
            link.outstanding.pop(m.id, None)
        if m.responded:
            return
        m.responded = True
        if ok:
            self._finish(link, m)
        else:
            self._requeue(link, m, None, True)

    def settle_chunk(self, link: Link, msgs: Sequence["Message"], ok: bool) -> None:
        """A chunk's result: every message of ``msgs`` not answered yet and not delegated
        (``enable_async()``: left to the application, and held) is finished if ``ok``,
        requeued with backoff otherwise; then the ledger is flushed."""
        out = link.outstanding
        fin = link.fins.append
        start = len(link.fins)
        n_fin = 0
        if ok and not out:  # the common case: nothing held, nothing to pop
            for m in msgs:
                if not m.responded:
                    if m.delegated:
                        out[m.id] = m
                    else:
                        m.responded = True
                        fin(m.id)
                        n_fin += 1
        else:
            todo = []
            for m in msgs:
                if m.responded:
                    out.pop(m.id, None)
                elif m.delegated:
                    out[m.id] = m
                else:
                    m.responded = True
                    out.pop(m.id, None)
                    todo.append(m)
            if not ok:
                for m in todo:
                    self._requeue(link, m, None, True)
            else:
                for m in todo:
                    fin(m.id)
                n_fin = len(todo)
        if n_fin:
            # out of flight with their FINs queued, in the same loop turn they are written:
            # one counter update per chunk instead of one per message
            link.rdy.in_flight -= n_fin
            self.oks += n_fin
            if self.dedup is not None:
                self._commit_ids(msgs, link.fins[start:])
        self._mark(link)
        self.flush()

    # -- answering what was never handed over (the intake gate) ----------------------------

    def finish_unhanded(self, link: Link, msgs: Sequence["Message"]) -> None:
        """FIN messages never handed over (duplicates, give-ups): not in flight."""
        for m in msgs:
            m.responded = True
            link.fins.append(m.id)
        self._mark(link)

    def requeue_unhanded(self, link: Link, msgs: Sequence[tuple["Message", int]]) -> None:
        """REQ messages never handed over after their delay (ms), no backoff: the copies
        the dedup gate found held by another consumer's live claim. Not in flight, no
        failure: nothing of them counts toward backoff."""
        for m, _ in msgs:
            m.responded = True
        link.reqs.extend([(m.id, delay) for m, delay in msgs])
        self._mark(link)

    def give_back(self, link: Link, msgs: Sequence["Message"]) -> None:
        """REQ at once, no backoff, nothing forgotten: messages that arrived while closing
        and were never looked at."""
        for m in msgs:
            m.responded = True
        link.reqs.extend([(m.id, 0) for m in msgs])
        self._mark(link)

    def give_back_blocks(self, link: Link, blocks: Sequence["MessageBlock"]) -> None:
        """:meth:`give_back` for MessageBlocks."""
        for b in blocks:
            b._responded = True
            link.reqs.extend([(mid, 0) for mid in b.ids()])
        self._mark(link)

    # -- the ledger's own rule ---------------------------------------------------------------

    def _finish(self, link: Link, m: "Message") -> None:
        """FIN a handed-over message (``m.responded`` set by the caller)."""
        link.rdy.in_flight -= 1
        link.fins.append(m.id)
        self.oks += 1
        if self.dedup is not None:
            self.dedup.commit(m)
        self._mark(link)

    def _requeue(self, link: Link, m: "Message", delay: Any, backoff: bool) -> None:
        """REQ a handed-over message (``m.responded`` set by the caller); ``delay`` None or
        negative: the default policy."""
        link.rdy.in_flight -= 1
        if delay is None or delay < 0:
            delay = min(self.requeue_delay_ms * m.attempts, self.max_requeue_delay_ms)
        link.reqs.append((m.id, int(delay)))
        if backoff:
            self.fails += 1
        if self.dedup is not None:
            self.dedup.release(m)
        self._mark(link)

    def finish_many(self, msgs: Sequence["Message"]) -> None:
        """FIN handed-over messages of any connections (the pull API's bulk answer); the
        bookkeeping is per run of messages of one connection, not per message."""
        last: Link | None = None
        n = 0
        pop: Any = None
        fin: Any = None
        for m in msgs:
            link: Link = m.responder  # type: ignore[assignment]
            if link is not last:
                if last is not None:
                    last.rdy.in_flight -= n
                    self._mark(last)
                last, n = link, 0
                pop, fin = link.outstanding.pop, link.fins.append
            pop(m.id, None)
            fin(m.id)
            n += 1
        if last is not None:
            last.rdy.in_flight -= n
            self._mark(last)
        self.oks += len(msgs)
        if self.dedup is not None:
            self.dedup.commit_many(msgs)
        self.flush()

    def requeue_many(self, msgs: Sequence["Message"], delay: Any, backoff: bool) -> None:
        for m in msgs:
            link: Link = m.responder  # type: ignore[assignment]
            link.outstanding.pop(m.id, None)
            self._requeue(link, m, delay, backoff)
        self.flush()

    def finish_blocks(self, blocks: Sequence["MessageBlock"]) -> None:
        for b in blocks:
            link: Link = b.responder  # type: ignore[assignment]
            link.rdy.in_flight -= len(b)
            link.fin_blocks.append(b)
            self._mark(link)
        self.oks += sum(map(len, blocks))
        self.flush()

    def requeue_blocks(self, blocks: Sequence["MessageBlock"], delay: Any,
                       backoff: bool, flush: bool = True) -> None:
        for b in blocks:
            link: Link = b.responder  # type: ignore[assignment]
            link.rdy.in_flight -= len(b)
            if delay is None or delay < 0:
                cap, per_try = self.max_requeue_delay_ms, self.requeue_delay_ms
                link.reqs.extend([(mid, min(per_try * a, cap))
                                  for mid, a in zip(b.ids(), b.attempts())])
            else:
                link.reqs.extend([(mid, int(delay)) for mid in b.ids()])
            if backoff:
                self.fails += 1
            self._mark(link)
        if flush:
            self.flush()

    def requeue_outstanding(self, links: Sequence[Link], blocks: Sequence["MessageBlock"]
                            ) -> int:
        """Closing: REQ at once (no backoff) every handed-over message of ``links`` not
        answered yet, and every message of ``blocks``; returns how many."""
        unanswered: list[Message] = []
        for link in links:
            for m in list(link.outstanding.values()):
                if not m.responded:
                    m.responded = True
                    link.rdy.in_flight -= 1
                    link.reqs.append((m.id, 0))
                    unanswered.append(m)
            link.outstanding.clear()
            self._mark(link)
        for b in blocks:
            b._responded = True
        self.requeue_blocks(blocks, 0, False, flush=False)
        if unanswered and self.dedup is not None:
            # never handled: their claims end, so that their redelivery is handled at once
            # (not held until the lease ends)
            self.dedup.release_many(unanswered)
        return len(unanswered) + sum(map(len, blocks))

    def forget_link(self, link: Link) -> int:
        """The connection closed: drop what it would have sent; returns how many handed
        messages were unanswered (nsqd redelivers them after their timeout)."""
        lost = len(link.outstanding)
        link.outstanding.clear()
        link.fins.clear()
        link.fin_blocks.clear()
        link.reqs.clear()
        return lost

    def _mark(self, link: Link) -> None:
        if not link.dirty:
            link.dirty = True
            self._dirty.append(link)

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.bridge.call_soon(self.flush)

    def flush(self) -> None:
        """Send the dedup gate's commits and releases, then queued FIN/REQ (one buffer
        append per connection), and feed the backoff policy one result."""
        self._flush_scheduled = False
        dedup = self.dedup
        if dedup is not None and dedup.pending:
            dedup.flush()
        dirty, self._dirty = self._dirty, []
        for link in dirty:
            link.dirty = False
            fins, reqs, fin_blocks = link.fins, link.reqs, link.fin_blocks
            if not fins and not reqs and not fin_blocks:
                continue
            link.fins = []
            link.reqs = []
            link.fin_blocks = []
            n_fin = len(fins) + (sum(map(len, fin_blocks)) if fin_blocks else 0)
            conn = link.conn
            # counted by what the connection took: once its socket is closed (or close()
            # wrote its last buffer) it refuses, and those answers are dropped, not sent
            if conn is None or not conn.writable:
                self.dropped_responses += n_fin + len(reqs)
                continue
            if fins:
                conn.fin_many(fins)
            if fin_blocks:
                conn.fin_blocks(fin_blocks)
            for mid, delay in reqs:
                conn.req(mid, delay)
            self.finished += n_fin
            self.requeued += len(reqs)
            st = link.rdy
            st.finished += n_fin
            st.requeued += len(reqs)
        fails, oks = self.fails, self.oks
        if fails or oks:
            self.fails = self.oks = 0
            if self.on_result is not None:
                self.on_result(not fails)
