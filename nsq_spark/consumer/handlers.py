"""Handler strategies, chosen once per consumer (never per message).

A strategy is called with every message of a read chunk that passed the intake gate,
``strategy(link, messages)``, on the loop thread. Each one hands messages over (adding
them to the connection's in-flight count, one at a time for per-message handlers so that
``is_starved()`` inside a handler sees what pynsq shows), answers what the handler's
result decides, and flushes the ledger once per chunk. Messages a per-message handler
answers by its return value leave flight together when the chunk is done, in the same loop
turn as their FINs are written: one counter update per chunk instead of one per message
(~35 ns each on this machine class); answers given through ``Message`` leave at once.

* :class:`PerMessage`: ``f(message)`` returning True/None (FIN), False (REQ), or an
  awaitable (its result decides later); ``message.enable_async()`` leaves the answer to
  the application; an exception requeues;
* :class:`PerMessageCoroutine`: ``async def f(message)``, one task per message;
* :class:`Batch`: ``g(messages)`` once per chunk (plain, coroutine function, or returning
  an awaitable); True/None finishes, False requeues the messages ``g`` did not answer.

:func:`choose` picks one. The strategies get the ledger, the loop bridge and a task group;
they know nothing of the Reader.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any, Callable, Protocol

from .._loop import on_loop_future
from ..errors import NSQError

if TYPE_CHECKING:
    import asyncio

    from .._loop import LoopBridge, TaskGroup
    from ..message import Message
    from .answers import Answers, Link

# a child of the Reader's historical logger: its level and handlers still apply
log = logging.getLogger("nsq_spark.reader.handlers")

__all__ = ["Strategy", "PerMessage", "PerMessageCoroutine", "Batch", "choose", "not_started",
           "is_coroutine_function"]


class Strategy(Protocol):
    def __call__(self, link: "Link", msgs: list["Message"]) -> None: ...


def is_coroutine_function(f: Any) -> bool:
    return inspect.iscoroutinefunction(f) or inspect.iscoroutinefunction(
        getattr(f, "__call__", None))


def _mid(m: "Message") -> str:
    return m.id.decode("ascii", "replace")


class _Base:
    def __init__(self, call: Callable[..., Any], answers: "Answers", bridge: "LoopBridge",
                 tasks: "TaskGroup", name: str) -> None:
        self.call = call
        self.answers = answers
        self.bridge = bridge
        self.tasks = tasks
        self.name = name

    def settle_one(self, link: "Link", m: "Message", result: Any) -> None:
        """The final result of an async handling: answer unless the handler did."""
        link.outstanding.pop(m.id, None)
        if m.responded:
            return
        m.responded = True
        if result is False:
            self.answers.requeue(link, m, None, True)
        else:
            self.answers.finish(link, m)
        self.answers.schedule_flush()


class PerMessage(_Base):
    """``f(message)`` per message (also pynsq's overridden ``process_message`` and hooks)."""

    def __call__(self, link: "Link", msgs: list["Message"]) -> None:
        call = self.call
        answers = self.answers
        st = link.rdy
        # FINs decided by return values: a list of this chunk's own (the ledger may add to
        # link.fins meanwhile, for answers given through Message), so its length counts them
        done: list[bytes] = []
        fin = done.append
        out = link.outstanding
        for m in msgs:
            st.in_flight += 1
            try:
                r = call(m)
            except Exception:
                log.exception("[%s] handler failed on message %s from %s; requeueing",
                              self.name, _mid(m), link.address)
                if not m.responded:
                    if m.delegated:
                        out[m.id] = m
                    else:
                        m.responded = True
                        answers.requeue(link, m, None, True)
                continue
            if m.responded:
                continue
            if m.delegated:
                out[m.id] = m
                if r is not None and r is not True and r is not False:
                    self._await(link, m, r)
                continue
            if r is True or r is None:
                m.responded = True
                fin(m.id)  # out of flight at the end of the chunk: one update, not one each
            elif r is False:
                m.responded = True
                answers.requeue(link, m, None, True)
            else:  # an awaitable (pynsq: a handler may return a Future or a coroutine)
                m.delegated = True
                out[m.id] = m
                self._await(link, m, r)
        if done:
            link.fins.extend(done)
            st.in_flight -= len(done)
            answers.add_oks(len(done))
        answers.mark(link)
        answers.flush()

    def _await(self, link: "Link", m: "Message", r: Any) -> None:
        try:
            fut = on_loop_future(r, self.bridge.loop)
        except Exception:
            log.error("[%s] handler returned %r for message %s from %s: return True, False, "
                      "None or an awaitable; requeueing", self.name, r, _mid(m), link.address)
            self.settle_one(link, m, False)
            return

        def done(f: "asyncio.Future[Any]") -> None:
            try:
                res = f.result()
            except Exception:
                log.exception("[%s] async handler failed on message %s from %s; requeueing",
                              self.name, _mid(m), link.address)
                res = False
            self.settle_one(link, m, res)
        fut.add_done_callback(done)


class PerMessageCoroutine(_Base):
    """``async def f(message)``: one task per message; its result still counts (pynsq)."""

    def __call__(self, link: "Link", msgs: list["Message"]) -> None:
        out = link.outstanding
        link.rdy.in_flight += len(msgs)
        spawn = self.tasks.spawn
        for m in msgs:
            m.delegated = True
            out[m.id] = m
            spawn(self._run(link, m), "handler")
        self.answers.flush()

    async def _run(self, link: "Link", m: "Message") -> None:
        try:
            r = await self.call(m)
        except Exception:
            log.exception("[%s] handler failed on message %s from %s; requeueing",
                          self.name, _mid(m), link.address)
            r = False
        self.settle_one(link, m, r)


class Batch(_Base):
    """``g(messages)`` per chunk; ``coroutine``: ``g`` is a coroutine function."""

    def __init__(self, call: Callable[..., Any], answers: "Answers", bridge: "LoopBridge",
                 tasks: "TaskGroup", name: str, coroutine: bool) -> None:
        super().__init__(call, answers, bridge, tasks, name)
        self.coroutine = coroutine

    def __call__(self, link: "Link", msgs: list["Message"]) -> None:
        link.rdy.in_flight += len(msgs)
        if self.coroutine:
            self._hold(link, msgs)
            self.tasks.spawn(self._run(link, msgs, None), "handler")
            self.answers.flush()
            return
        try:
            r = self.call(msgs)
        except Exception:
            log.exception("[%s] batch handler failed on %d messages from %s; requeueing "
                          "those it did not answer", self.name, len(msgs), link.address)
            r = False
        if r is not None and r is not True and r is not False:
            self._hold(link, msgs)
            self.tasks.spawn(self._run(link, msgs, r), "handler")
            self.answers.flush()
            return
        self.settle(link, msgs, r)

    @staticmethod
    def _hold(link: "Link", msgs: list["Message"]) -> None:
        out = link.outstanding
        for m in msgs:
            out[m.id] = m

    async def _run(self, link: "Link", msgs: list["Message"], awaitable: Any) -> None:
        try:
            if awaitable is None:
                r = await self.call(msgs)
            else:
                r = await on_loop_future(awaitable, self.bridge.loop)
        except Exception:
            log.exception("[%s] batch handler failed on %d messages from %s (it must return "
                          "True, False, None or an awaitable); requeueing those it did not "
                          "answer", self.name, len(msgs), link.address)
            r = False
        self.settle(link, msgs, r)

    def settle(self, link: "Link", msgs: list["Message"], r: Any) -> None:
        answers = self.answers
        out = link.outstanding
        if r is False:
            for m in msgs:
                if m.responded:
                    out.pop(m.id, None)
                elif m.delegated:
                    out[m.id] = m
                else:
                    m.responded = True
                    out.pop(m.id, None)
                    answers.requeue(link, m, None, True)
        else:
            fin = link.fins.append
            n_fin = 0
            if out:
                for m in msgs:
                    if m.responded:
                        out.pop(m.id, None)
                    elif m.delegated:
                        out[m.id] = m
                    else:
                        m.responded = True
                        out.pop(m.id, None)
                        fin(m.id)
                        n_fin += 1
            else:  # the common case: nothing held, nothing to pop
                for m in msgs:
                    if not m.responded:
                        if m.delegated:
                            out[m.id] = m
                        else:
                            m.responded = True
                            fin(m.id)
                            n_fin += 1
            link.rdy.in_flight -= n_fin
            answers.add_oks(n_fin)
        answers.mark(link)
        answers.flush()


def not_started(link: "Link", msgs: list["Message"]) -> None:
    """The strategy before one is chosen: a delivery then is a bug, never a silent drop."""
    raise NSQError(f"{len(msgs)} messages from {link.address} arrived before a handler "
                   "strategy was chosen")


def choose(*, message_handler: Callable[..., Any] | None,
           batch_handler: Callable[..., Any] | None,
           process: Callable[..., Any] | None = None,
           preprocess: Callable[..., Any] | None = None,
           validate: Callable[..., Any] | None = None,
           answers: "Answers", bridge: "LoopBridge", tasks: "TaskGroup", name: str
           ) -> Strategy:
    """The strategy for the handler given. ``process`` / ``preprocess`` / ``validate``:
    pynsq's subclass hooks, given only when overridden (then the handler is called through
    them, as a plain function: pynsq calls ``process_message`` synchronously)."""
    common = (answers, bridge, tasks, name)
    if batch_handler is not None:
        return Batch(batch_handler, *common, is_coroutine_function(batch_handler))
    if process is None and preprocess is None and validate is None:
        assert message_handler is not None
        if is_coroutine_function(message_handler):
            return PerMessageCoroutine(message_handler, *common)
        return PerMessage(message_handler, *common)
    handle = process if process is not None else message_handler
    assert handle is not None
    if preprocess is None and validate is None:
        return PerMessage(handle, *common)
    pre = preprocess if preprocess is not None else (lambda m: m)
    valid = validate if validate is not None else (lambda m: True)

    def call(m: "Message") -> Any:
        if not valid(pre(m)):
            return True  # pynsq: an invalid message is finished unhandled
        return handle(m)
    return PerMessage(call, *common)
