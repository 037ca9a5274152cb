"""Handler strategies, chosen once per consumer (never per message).

A strategy is called with every message of a read chunk that passed the intake gate,
``strategy(link, messages)``, on the loop thread. Each one asks the answers ledger to hand
messages over and to settle what the handler's result decides; the ledger flushes once per
chunk. For per-message handlers the ledger runs the loop itself
(:meth:`~nsq_spark._consumer.answers.Answers.hand_over_each`: one message at a time, so that
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
  an awaitable); True/None finishes, False requeues the messages ``g`` did not answer;
* :class:`Concurrent`: ``f(message)`` on a bounded pool of ``concurrency`` threads (go-nsq's
  ``AddConcurrentHandlers``), for blocking handlers (see its doc: ordering, in flight).

:func:`choose` picks one. The strategies get the ledger, the loop bridge and a task group;
they know nothing of the Reader.
"""

from __future__ import annotations

import inspect
import threading
from collections import deque
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, Callable, Protocol

from .._log import get_logger
from .._loop import on_loop_future
from ..errors import ConfigError

if TYPE_CHECKING:
    import asyncio

    from .._loop import LoopBridge, TaskGroup
    from ..message import Message
    from .answers import Answers, Link

# a child of the Reader's historical logger: its level and handlers still apply
log = get_logger("nsq_spark.reader.handlers")

__all__ = ["Strategy", "PerMessage", "PerMessageCoroutine", "Batch", "Concurrent", "choose",
           "check_concurrency", "is_coroutine_function", "HandlerInstrument"]


class Strategy(Protocol):
    def __call__(self, link: "Link", msgs: list["Message"]) -> None: ...

    def close(self, skip_queued: bool = False) -> None:
        """The strategy is retired. It answers nothing itself. A strategy with a queue
        (:class:`Concurrent`):

        * ``skip_queued=False`` (a hook was re-assigned and a new strategy takes the next
          chunks): still hands its whole queue to its handler, then its threads exit;
        * ``skip_queued=True`` (the Reader closes and requeues what is unanswered right
          after): from this call on, no message that has not started is handed to the
          handler; they stay held in the ledger for the Reader's requeue."""


class HandlerInstrument(Protocol):
    """Wraps the handler once, when the strategy is chosen (an instrumented consumer:
    :mod:`nsq_spark.telemetry`); a wrapper of a coroutine function is one too."""

    def message_handler(self, f: Callable[..., Any], coroutine: bool
                        ) -> Callable[..., Any]: ...

    def batch_handler(self, g: Callable[..., Any], coroutine: bool
                      ) -> Callable[..., Any]: ...


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

    def close(self, skip_queued: bool = False) -> None:
        """Nothing to stop: the handler runs on the loop (or as its tasks)."""

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


_STOP = None  # a worker's signal to exit


class Concurrent(_Base):
    """``f(message)`` on ``threads`` worker threads (go-nsq's ``AddConcurrentHandlers``).

    For blocking handlers (a database write, an HTTP call): while one waits, the others
    handle. On the loop thread each chunk is handed over (in flight from now on, and held:
    closing the Reader requeues what is left) and queued; a worker calls ``f`` (through
    pynsq's hooks when overridden) and its result goes back to the loop in batches, where
    the ledger settles it as the one-thread strategy would: True/None FIN, False or an
    exception REQ (default delay, backoff), ``enable_async()`` leaves the answer to the
    application; an awaitable is refused (an ``async def`` handler already runs
    concurrently on the loop, and :func:`check_concurrency` refuses coroutine functions
    up front) and requeued. A ``BaseException`` from the handler (``SystemExit``,
    ``KeyboardInterrupt``, ...) is settled like an exception (logged with the nsqd,
    requeued) and the worker goes on: only the pool's own stop signal ends a worker, so
    a handler can never leave a message held by a dead thread.

    Ordering: none across messages: N handlers run at once and finish in any order
    (as in go-nsq). In flight: a message counts from the moment it is queued for the pool
    until it is answered, so ``max_in_flight`` still bounds the queued and running
    messages together (the queue never holds more), and ``is_starved()`` sees them.
    Threads start with the first chunk and are daemons; ``close()`` stops them at the end
    of the queue (a re-assigned hook: the whole queue is still handled) or, when the
    Reader closes (``skip_queued=True``), starts no more messages (see there;
    drain_timeout applies to the running ones as for any handler).
    """

    def __init__(self, call: Callable[..., Any], answers: "Answers", bridge: "LoopBridge",
                 tasks: "TaskGroup", name: str, threads: int) -> None:
        super().__init__(call, answers, bridge, tasks, name)
        self.threads = threads
        self._todo: SimpleQueue[tuple["Link", "Message"] | None] = SimpleQueue()
        self._workers: list[threading.Thread] = []
        # results: appended by workers, drained by one loop callback at a time
        self._done: deque[tuple["Link", "Message", Any, "BaseException | None"]] = deque()
        self._drain_scheduled = False
        self._closed = False
        # set (under the lock) when the Reader closes: workers start no more messages;
        # a worker checks it under the same lock before it starts one, so once close()
        # returned no message starts that the Reader's requeue is about to answer
        self._skip = False
        self._start_lock = threading.Lock()

    def __call__(self, link: "Link", msgs: list["Message"]) -> None:
        if not self._workers:
            self._start()
        self.answers.hand_over_held(link, msgs)
        put = self._todo.put
        for m in msgs:
            put((link, m))

    def _start(self) -> None:
        for i in range(self.threads):
            t = threading.Thread(target=self._work, name=f"nsq-handler[{self.name}]-{i}",
                                 daemon=True)
            t.start()
            self._workers.append(t)

    def _work(self) -> None:  # a worker thread
        get, call, done, start = self._todo.get, self.call, self._done.append, self._start_lock
        while True:
            item = get()
            if item is _STOP:
                return
            link, m = item
            with start:
                # the Reader is closing (its requeue answers it), or it was answered
                # while queued: not started
                if self._skip or m.responded:
                    continue
            try:
                done((link, m, call(m), None))
            except BaseException as exc:  # noqa: B036 - a worker never dies of a handler
                done((link, m, None, exc))
            if not self._drain_scheduled:
                self._schedule_drain()

    def _schedule_drain(self) -> None:
        self._drain_scheduled = True
        loop = self.bridge.loop
        try:
            if loop is None:
                raise RuntimeError("no loop")
            loop.call_soon_threadsafe(self._settle_done)
        except RuntimeError:  # the loop closed: close() requeued what was unanswered
            self._drain_scheduled = False

    def _settle_done(self) -> None:  # the loop thread
        self._drain_scheduled = False  # first: a result racing with the drain schedules anew
        q = self._done
        settle = self.answers.settle
        while q:
            link, m, r, exc = q.popleft()
            if m.delegated:  # the application answers it (held since the hand-over)
                if exc is not None:
                    self._log.for_nsqd(link.address).error(
                        "[%s] handler failed on message %s from %s after enable_async(); "
                        "the application answers it", self.name, _mid(m), link.address,
                        exc_info=exc)
                continue
            if exc is not None:
                self._log.for_nsqd(link.address).error(
                    "[%s] handler failed on message %s from %s; requeueing", self.name,
                    _mid(m), link.address, exc_info=exc)
                settle(link, m, False)
            elif r is True or r is None:
                settle(link, m, True)
            elif r is False:
                settle(link, m, False)
            else:
                self._log.for_nsqd(link.address).error(
                    "[%s] handler returned %r for message %s from %s: with concurrency > 1 "
                    "return True, False or None (an async def handler needs no threads); "
                    "requeueing", self.name, r, _mid(m), link.address)
                settle(link, m, False)
        self.answers.flush()

    def close(self, skip_queued: bool = False) -> None:
        """Each worker exits once it reaches the end of what is queued now (a stop
        signal per worker goes behind it).

        ``skip_queued=False`` (a strategy replaced because a hook was re-assigned): every
        queued message still reaches the handler (with the old hooks) unless it was
        answered first. ``skip_queued=True`` (the Reader closes): once this returns, no
        worker starts a queued message; they stay held in the ledger and the Reader's
        ``requeue_outstanding`` right after requeues them (handlers already running
        finish, their answers count if they come first)."""
        if skip_queued:
            with self._start_lock:
                self._skip = True
        if self._closed:
            return
        self._closed = True
        for _ in self._workers:
            self._todo.put(_STOP)


def _returns_awaitable(f: Any) -> bool:
    """``f`` returns an awaitable to be run on the loop: an ``async def`` function (or
    callable) or a tornado ``@gen.coroutine``; a worker thread, or a caller that does not
    await (pynsq's synchronous hooks), would only get its coroutine or Future, never its
    result."""
    if is_coroutine_function(f):
        return True
    from tornado import gen
    return bool(gen.is_coroutine_function(f)) or bool(
        gen.is_coroutine_function(getattr(f, "__call__", None)))


#: pynsq's hooks whose result decides, called synchronously (as pynsq calls them)
SYNC_HOOKS = ("preprocess_message", "validate_message", "disabled")


def check_sync_hook(name: str, hook: Callable[..., Any] | None) -> None:
    """ConfigError when pynsq's ``name`` hook (one of :data:`SYNC_HOOKS`) is a coroutine
    function (``async def`` or tornado's ``@gen.coroutine``): it is called without being
    awaited, as in pynsq, so its coroutine would stand for its result -- always true: every
    message would pass ``validate_message`` unchecked, ``preprocess_message`` would hand the
    handler a coroutine, ``disabled`` would hold RDY at 0 for good."""
    if hook is not None and _returns_awaitable(hook):
        raise ConfigError(f"{name} is a coroutine function (async def or @gen.coroutine), "
                          "but the Reader calls it without awaiting it, as pynsq does, and "
                          "uses its result at once: make it a plain def (do async work in "
                          "the message handler, which may be async)")


def check_concurrency(concurrency: int, *, message_handler: Callable[..., Any] | None,
                      batch_handler: Callable[..., Any] | None,
                      process: Callable[..., Any] | None = None) -> None:
    """ConfigError when ``concurrency`` > 1 cannot apply to the handler given.

    ``process``: pynsq's ``process_message`` when overridden (the function the worker
    threads actually call, as :func:`choose` does); it is checked as well as
    ``message_handler`` (which a default ``process_message`` calls)."""
    if concurrency == 1:
        return
    if batch_handler is not None:
        raise ConfigError(f"concurrency={concurrency} runs a per-message handler on that many "
                          "threads; a batch_handler gets whole chunks: give a "
                          "message_handler, or leave concurrency at 1")
    if process is not None and _returns_awaitable(process):
        raise ConfigError(f"concurrency={concurrency} runs process_message on worker threads, "
                          "but the override is a coroutine function (async def or "
                          "tornado's @gen.coroutine): a thread would get an un-awaited "
                          "coroutine and handle nothing. Leave concurrency at 1 (an async "
                          "process_message already runs concurrently on the loop), or make "
                          "process_message a plain blocking def")
    if message_handler is not None and _returns_awaitable(message_handler):
        raise ConfigError(f"concurrency={concurrency} is for blocking handlers; an async def "
                          "(or tornado @gen.coroutine) handler already runs concurrently on "
                          "the loop (up to max_in_flight at once): leave concurrency at 1")


def _unchanged(m: "Message") -> "Message":
    return m


def _valid(m: object) -> bool:
    return True


def choose(*, message_handler: Callable[..., Any] | None,
           batch_handler: Callable[..., Any] | None,
           process: Callable[..., Any] | None = None,
           preprocess: Callable[..., Any] | None = None,
           validate: Callable[..., Any] | None = None,
           answers: "Answers", bridge: "LoopBridge", tasks: "TaskGroup", name: str,
           concurrency: int = 1,
           instrument: HandlerInstrument | None = None) -> Strategy:
    """The strategy for the handler given. ``process`` / ``preprocess`` / ``validate``:
    pynsq's subclass hooks, given only when overridden (then the handler is called through
    them, as a plain function: pynsq calls ``process_message`` synchronously).
    ``concurrency`` > 1: the per-message call runs on that many threads (:class:`Concurrent`;
    :func:`check_concurrency` says where it cannot); 1: on the loop thread.
    ``instrument``: wraps the handler the strategy calls (None: called as given)."""
    check_concurrency(concurrency, message_handler=message_handler,
                      batch_handler=batch_handler, process=process)
    common = (answers, bridge, tasks, name)

    def wrap(f: Callable[..., Any], coroutine: bool = False) -> Callable[..., Any]:
        return f if instrument is None else instrument.message_handler(f, coroutine)

    def per_message(call: Callable[..., Any]) -> Strategy:
        if concurrency > 1:
            return Concurrent(wrap(call), *common, concurrency)
        return PerMessage(wrap(call), *common)

    if batch_handler is not None:
        coroutine = is_coroutine_function(batch_handler)
        if instrument is not None:
            batch_handler = instrument.batch_handler(batch_handler, coroutine)
        return Batch(batch_handler, *common, coroutine)
    if process is None and preprocess is None and validate is None:
        assert message_handler is not None
        if is_coroutine_function(message_handler):
            return PerMessageCoroutine(wrap(message_handler, True), *common)
        return per_message(message_handler)
    handle = process if process is not None else message_handler
    assert handle is not None
    if preprocess is None and validate is None:
        return per_message(handle)
    pre: Callable[[Message], Any] = preprocess if preprocess is not None else _unchanged
    valid: Callable[[Any], Any] = validate if validate is not None else _valid

    def call(m: "Message") -> Any:
        if not valid(pre(m)):
            return True  # pynsq: an invalid message is finished unhandled
        return handle(m)
    return per_message(call)
