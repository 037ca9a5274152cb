"""Handler strategies, chosen once per consumer (never per message).

A strategy is called with every message of a read chunk that passed the intake gate,
``strategy(link, messages)``, on the loop thread. Each one asks the answers ledger to hand
messages over and to settle what the handler's result decides; the ledger flushes once per
chunk. For per-message handlers the ledger runs the loop itself
(:meth:`~nsq_spark.consumer.answers.Answers.hand_over_each`: one message at a time, so that
``is_starved()`` inside a handler sees what pynsq shows) and leaves exceptions and
awaitables to the strategy. Messages a per-message handler answers by its return value
are settled together when the chunk is done, in the same loop turn as their FINs are
written: one counter update per chunk instead of one per message (~35 ns each on this
machine class); answers given through ``Message`` leave at once. A strategy writes no
record of a connection itself.

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
from typing import TYPE_CHECKING, Any, Callable, Protocol

from .._log import get_logger
from .._loop import on_loop_future

if TYPE_CHECKING:
    import asyncio

    from .._loop import LoopBridge, TaskGroup
    from ..message import Message
    from .answers import Answers, Link

# a child of the Reader's historical logger: its level and handlers still apply
log = get_logger("nsq_spark.reader.handlers")

__all__ = ["Strategy", "PerMessage", "PerMessageCoroutine", "Batch", "choose",
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
        self._log = log.bind(reader=name)

    def settle_one(self, link: "Link", m: "Message", result: Any) -> None:
        """The final result of an async handling: answer unless the handler did."""
        self.answers.settle(link, m, result is not False)
        self.answers.schedule_flush()


class PerMessage(_Base):
    """``f(message)`` per message (also pynsq's overridden ``process_message`` and hooks)."""

    def __call__(self, link: "Link", msgs: list["Message"]) -> None:
        self.answers.hand_over_each(link, msgs, self.call, self._other)

    def _other(self, link: "Link", m: "Message", r: Any, exc: Exception | None) -> None:
        """What the ledger leaves to the strategy: a failed call, or an awaitable."""
        if exc is not None:
            self._log.for_nsqd(link.address).error(
                "[%s] handler failed on message %s from %s; requeueing",
                self.name, _mid(m), link.address, exc_info=exc)
            if not m.responded:
                if m.delegated:
                    self.answers.hold_one(link, m)
                else:
                    self.answers.settle(link, m, False)
            return
        # an awaitable (pynsq: a handler may return a Future or a coroutine); its result
        # decides later, unless the handler delegated the answer (then it only runs)
        if not m.delegated:
            m.delegated = True
            self.answers.hold_one(link, m)
        self._await(link, m, r)

    def _await(self, link: "Link", m: "Message", r: Any) -> None:
        try:
            fut = on_loop_future(r, self.bridge.loop)
        except Exception:
            self._log.for_nsqd(link.address).error(
                "[%s] handler returned %r for message %s from %s: return True, False, "
                "None or an awaitable; requeueing", self.name, r, _mid(m), link.address)
            self.settle_one(link, m, False)
            return

        def done(f: "asyncio.Future[Any]") -> None:
            try:
                res = f.result()
            except Exception:
                self._log.for_nsqd(link.address).exception(
                    "[%s] async handler failed on message %s from %s; requeueing",
                    self.name, _mid(m), link.address)
                res = False
            self.settle_one(link, m, res)
        fut.add_done_callback(done)


class PerMessageCoroutine(_Base):
    """``async def f(message)``: one task per message; its result still counts (pynsq)."""

    def __call__(self, link: "Link", msgs: list["Message"]) -> None:
        self.answers.hand_over_held(link, msgs)
        spawn = self.tasks.spawn
        for m in msgs:
            m.delegated = True
            spawn(self._run(link, m), "handler")
        self.answers.flush()

    async def _run(self, link: "Link", m: "Message") -> None:
        try:
            r = await self.call(m)
        except Exception:
            self._log.for_nsqd(link.address).exception(
                "[%s] handler failed on message %s from %s; requeueing",
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
        answers = self.answers
        if self.coroutine:
            answers.hand_over_held(link, msgs)
            self.tasks.spawn(self._run(link, msgs, None), "handler")
            answers.flush()
            return
        answers.hand_over(link, msgs)
        try:
            r = self.call(msgs)
        except Exception:
            self._log.for_nsqd(link.address).exception(
                "[%s] batch handler failed on %d messages from %s; requeueing "
                "those it did not answer", self.name, len(msgs), link.address)
            r = False
        if r is not None and r is not True and r is not False:
            answers.hold(link, msgs)
            self.tasks.spawn(self._run(link, msgs, r), "handler")
            answers.flush()
            return
        answers.settle_chunk(link, msgs, r is not False)

    async def _run(self, link: "Link", msgs: list["Message"], awaitable: Any) -> None:
        try:
            if awaitable is None:
                r = await self.call(msgs)
            else:
                r = await on_loop_future(awaitable, self.bridge.loop)
        except Exception:
            self._log.for_nsqd(link.address).exception(
                "[%s] batch handler failed on %d messages from %s (it must return "
                "True, False, None or an awaitable); requeueing those it did not "
                "answer", self.name, len(msgs), link.address)
            r = False
        self.answers.settle_chunk(link, msgs, r is not False)


def _unchanged(m: "Message") -> "Message":
    return m


def _valid(m: object) -> bool:
    return True


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
    pre: Callable[[Message], Any] = preprocess if preprocess is not None else _unchanged
    valid: Callable[[Any], Any] = validate if validate is not None else _valid

    def call(m: "Message") -> Any:
        if not valid(pre(m)):
            return True  # pynsq: an invalid message is finished unhandled
        return handle(m)
    return PerMessage(call, *common)
