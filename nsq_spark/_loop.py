"""The one bridge between threads and an event loop.

A consumer lives on one asyncio loop (tornado's IOLoop in handler mode, a daemon thread's
loop in pull mode) and is reached from any thread: answers to messages, ``close()``,
``stats()``, ``set_max_in_flight()``. :class:`LoopBridge` is the only code that decides
"run it now, I am on the loop's thread" versus "hand it to the loop"; :class:`TaskGroup`
keeps the tasks a consumer spawned, by kind, so that closing cancels the right ones;
:func:`start_loop_thread` runs a loop on a daemon thread and cleans it up completely;
:class:`LoopThread` is the same for objects that only need "a loop somewhere":
``run_coroutine(coro)`` gives a ``concurrent.futures.Future``, ``call_soon(fn, *args)`` is
thread-safe, ``in_loop_thread()`` tells where the caller is, ``stop(timeout)`` joins and
closes. :class:`LoopHome` is the loop of an object used from threads *and* coroutines
(the Producer): chosen on first use -- the caller's running loop (no thread at all) or a
:class:`LoopThread` of its own -- and the only code that hands its work across, checks
that a blocking call is not made on it, and shuts it down.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import warnings
from typing import Any, Awaitable, Callable, Coroutine, Iterator, TypeVar

from ._log import get_logger
from .errors import NSQError, NSQTimeoutError

log = get_logger(__name__)

__all__ = ["LoopBridge", "LoopHome", "LoopThread", "TaskGroup", "start_loop_thread",
           "current_ioloop", "on_loop_future"]

T = TypeVar("T")


class LoopBridge:
    """The loop a consumer runs on, and how any thread reaches it.

    Args:
        closed_message: the :class:`~nsq_spark.errors.NSQError` text raised when something
            is handed over after the loop is gone (say what happens to the work instead).
    """

    __slots__ = ("loop", "thread_id", "closed_message")

    def __init__(self, closed_message: str) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread_id: int | None = None
        self.closed_message = closed_message

    def bind(self) -> None:
        """Bind to the running loop (call on it)."""
        self.loop = asyncio.get_running_loop()
        self.thread_id = threading.get_ident()

    @property
    def bound(self) -> bool:
        return self.loop is not None

    @property
    def usable(self) -> bool:
        """Bound to a loop that is not closed."""
        return self.loop is not None and not self.loop.is_closed()

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self.thread_id

    def time(self) -> float:
        assert self.loop is not None, "bind() first"
        return self.loop.time()

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` now on the loop's thread, else as a loop callback; raises
        NSQError(closed_message) when there is no loop to run it."""
        loop = self.loop
        if loop is None or loop.is_closed():
            raise NSQError(self.closed_message)
        if threading.get_ident() == self.thread_id:
            fn(*args)
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed meanwhile
            raise NSQError(self.closed_message) from None

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """A callback on the loop (from the loop's thread)."""
        assert self.loop is not None, "bind() first"
        self.loop.call_soon(fn, *args)

    def call_later(self, delay: float, fn: Callable[..., Any]) -> asyncio.TimerHandle:
        assert self.loop is not None, "bind() first"
        return self.loop.call_later(delay, fn)

    def result(self, fn: Callable[[], T], timeout: float) -> T:
        """``fn()`` evaluated on the loop (from any thread), waiting up to ``timeout`` s;
        evaluated here when the loop is not running or is this thread's, and here instead
        when the loop did not start it within ``timeout`` (then never there). For reads
        only (``stats()``): a read off the loop is a torn snapshot at worst; a change
        made off the loop races with it (use :meth:`result_on_loop`)."""
        try:
            return self._evaluate(fn, timeout)
        except concurrent.futures.TimeoutError:
            return fn()

    def result_on_loop(self, fn: Callable[[], T], timeout: float, busy_message: str) -> T:
        """``fn()`` evaluated once, on the loop (from any thread), waiting up to ``timeout``
        s; here only when the loop is not running or is this thread's (nothing races with
        it then). When the loop did not start it within ``timeout`` (it is blocked), it
        never runs: :class:`~nsq_spark.errors.NSQTimeoutError` (``busy_message``). For
        changes of state owned by the loop (the run-time controls)."""
        try:
            return self._evaluate(fn, timeout)
        except concurrent.futures.TimeoutError:
            raise NSQTimeoutError(busy_message) from None

    def _evaluate(self, fn: Callable[[], T], timeout: float) -> T:
        """``fn()`` here (no running loop, or its thread) or on the loop within
        ``timeout`` s; ``concurrent.futures.TimeoutError`` when the loop did not start it
        by then, and it is withdrawn: it will not run later."""
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running() \
                or threading.get_ident() == self.thread_id:
            return fn()
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return  # the caller gave up waiting
            try:
                fut.set_result(fn())
            except BaseException as exc:  # pragma: no cover - handed to the caller
                fut.set_exception(exc)
        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop closed meanwhile: nothing runs there any more
            return fn()
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            if not fut.cancel():  # started just now: its result, whenever it ends
                return fut.result()
            if loop.is_closed() or not loop.is_running():
                return fn()  # withdrawn, and the loop stopped meanwhile: nothing races
            raise

    def run_coroutine(self, coro: Awaitable[Any], timeout: float) -> bool:
        """Run ``coro`` on the loop from another thread and wait up to ``timeout`` s;
        False if it did not finish (or the loop is gone)."""
        loop = self.loop
        try:
            if loop is None or loop.is_closed():
                raise RuntimeError("no loop")
            fut: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(
                coro, loop)  # type: ignore[arg-type]
        except RuntimeError:
            getattr(coro, "close", lambda: None)()  # never awaited: no warning
            return False
        try:
            fut.result(timeout)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            return False
        return True


class TaskGroup:
    """Tasks spawned on a loop, each of a kind (e.g. ``"connect"``, ``"handler"``); a
    failure is logged, never lost; :meth:`cancel` stops those of one kind."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: dict[asyncio.Future[Any], str] = {}

    def spawn(self, coro: Awaitable[Any], kind: str = "") -> "asyncio.Future[Any]":
        task = asyncio.ensure_future(coro)
        self._tasks[task] = kind
        task.add_done_callback(self._done)
        return task

    def _done(self, task: "asyncio.Future[Any]") -> None:
        self._tasks.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("[%s] internal task failed: %r", self.name, task.exception())

    def cancel(self, kind: str) -> None:
        """Cancel the pending tasks of ``kind`` (not the current task)."""
        current = asyncio.current_task()
        for task, k in list(self._tasks.items()):
            if k == kind and not task.done() and task is not current:
                task.cancel()

    async def cancel_and_wait(self, kind: str) -> None:
        """:meth:`cancel` the tasks of ``kind``, then wait until they have ended."""
        current = asyncio.current_task()
        pending = [t for t, k in list(self._tasks.items())
                   if k == kind and not t.done() and t is not current]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator["asyncio.Future[Any]"]:
        return iter(list(self._tasks))


def start_loop_thread(setup: Callable[[], None], main: Callable[[], Awaitable[None]],
                      name: str, on_exit: Callable[[], None]) -> threading.Thread:
    """Run a new event loop on a daemon thread: ``setup()`` on it, then ``await main()``.

    Returns once ``setup()`` ran (its exception is raised here). When ``main`` returns,
    the remaining tasks are cancelled, async generators and the default executor (the
    resolver's threads) shut down, the loop closed, then ``on_exit()`` runs."""
    ready = threading.Event()
    errors: list[BaseException] = []

    def thread_main() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            async def body() -> None:
                try:
                    setup()
                finally:
                    ready.set()
                await main()
            loop.run_until_complete(body())
        except BaseException as exc:  # pragma: no cover - reported to the caller
            errors.append(exc)
            log.exception("[%s] loop failed", name)
        finally:
            ready.set()
            try:
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for t in pending:
                    t.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                # join the resolver's executor threads: repeated start/stop leaves none behind
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()
                on_exit()

    thread = threading.Thread(target=thread_main, name=name, daemon=True)
    thread.start()
    ready.wait()
    if errors:
        raise errors[0]
    return thread


class LoopThread:
    """A daemon thread running an asyncio event loop until :meth:`stop`."""

    def __init__(self, name: str = "nsq-io", start_timeout: float = 10.0) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(started.set)
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()
        if not started.wait(start_timeout):  # pragma: no cover - a starved machine
            raise RuntimeError(f"the {name} event loop thread did not start within "
                               f"{start_timeout}s")

    def run_coroutine(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def stop(self, timeout: float = 10.0) -> bool:
        if self.loop.is_closed():
            return True
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # closed in between
            return True
        self.thread.join(timeout)
        if self.thread.is_alive():
            return False
        self.loop.close()
        return True


class LoopHome:
    """The event loop an object's IO runs on, chosen on first use and kept.

    Used from coroutines first (:meth:`bind_running`), it adopts the caller's running
    loop and starts no thread; used from threads first (:meth:`for_threads`), it starts a
    :class:`LoopThread` and every later caller, coroutines included, hops to that one. A
    caller's loop that has ended (an ``asyncio.run()`` returned) is let go, ``on_lost()``
    tells the owner to drop what lived on it, and the next use starts over.

    Args:
        name: the IO thread's name, and the owner's name in messages.
        closed: True once the owner is closed (then no loop is started or bound).
        on_lost: called when the bound loop turned out to be closed.
        async_hint: the asynchronous call to name when a blocking one is made on the
            loop itself (e.g. ``"await producer.apublish(...)"``).
    """

    def __init__(self, name: str, *, closed: Callable[[], bool], on_lost: Callable[[], None],
                 async_hint: str) -> None:
        self.name = name
        self.closed = closed
        self.on_lost = on_lost
        self.async_hint = async_hint
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: LoopThread | None = None   # set when the loop is our own
        self._lock = threading.Lock()

    def current(self) -> asyncio.AbstractEventLoop:
        """The loop (for code that runs on it)."""
        loop = self.loop
        assert loop is not None, f"the {self.name} runs on its loop: bind it first"
        return loop

    @property
    def own_thread(self) -> bool:
        """True when the loop runs on a thread of our own (not the caller's loop)."""
        return self.thread is not None

    def _let_go_if_ended(self) -> None:
        loop = self.loop
        if loop is not None and self.thread is None and loop.is_closed():
            with self._lock:
                self.on_lost()
                self.loop = None

    def _closed_error(self) -> NSQError:
        return NSQError(f"the {self.name} is closed")

    def check_off_loop(self) -> None:
        """Raise when a blocking call comes from the caller's loop this one is bound to
        (it would wait for the loop it blocks), or after closing."""
        if self.closed():
            raise self._closed_error()
        loop = self.loop
        if loop is not None and self.thread is None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                return
            if running is loop:
                raise NSQError(f"a blocking call on the event loop the {self.name} runs on; "
                               f"use `{self.async_hint}` there")

    def for_threads(self) -> asyncio.AbstractEventLoop:
        """The loop for callers on other threads: a bound loop that still runs, or a new
        :class:`LoopThread` when there is none yet."""
        self._let_go_if_ended()
        loop = self.loop
        if loop is not None:
            if self.thread is None:
                self.check_off_loop()
                if loop.is_closed() or not loop.is_running():
                    raise NSQError(f"the event loop this {self.name} was bound to is not "
                                   "running; use the async API inside it, or a new one")
            return loop
        with self._lock:
            if self.loop is None:
                if self.closed():
                    raise self._closed_error()
                self.thread = LoopThread(f"nsq-{self.name}-io")
                self.loop = self.thread.loop
            return self.loop

    def bind_running(self) -> asyncio.AbstractEventLoop:
        """From a coroutine: the loop to use -- the running one, unless one was chosen
        before (then the caller hops to it)."""
        running = asyncio.get_running_loop()
        self._let_go_if_ended()
        if self.loop is None:
            with self._lock:
                if self.loop is None:
                    if self.closed():
                        raise self._closed_error()
                    self.loop = running
        return self.loop

    def on_it(self) -> bool:
        """True when the caller runs on the chosen loop (binding to the running loop if
        none was chosen yet)."""
        return self.bind_running() is asyncio.get_running_loop()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop from a thread; a future of its outcome."""
        try:
            loop = self.for_threads()
        except BaseException:
            coro.close()   # never awaited: no warning
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def shutdown(self, close: Callable[[], Coroutine[Any, Any, None]], timeout: float) -> None:
        """Run ``close()`` on the loop, from wherever the caller is, then stop our own
        thread. On a caller's loop from that loop's thread, ``close()`` is scheduled (it
        cannot be waited for there); from another thread it is waited up to ``timeout``."""
        loop = self.loop
        if loop is None:
            return
        thread = self.thread
        if thread is None:   # the caller's loop
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                asyncio.ensure_future(close())
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(close(), loop).result(timeout)
            return
        try:
            thread.run_coroutine(close()).result(timeout)
        except Exception as exc:  # noqa: BLE001 - closing goes on
            log.warning("%s close: %s", self.name, exc)
        thread.stop(10)
        self.thread = None
        self.loop = None


def current_ioloop() -> Any:
    """This thread's tornado IOLoop, made if there is none (newer Pythons no longer create
    an event loop implicitly outside a running one)."""
    from tornado.ioloop import IOLoop
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return IOLoop.current()
        except RuntimeError:
            asyncio.set_event_loop(asyncio.new_event_loop())
            return IOLoop.current()


def on_loop_future(result: Any, loop: Any) -> "asyncio.Future[Any]":
    """A handler's awaitable result as a future whose callbacks run on ``loop``: a
    ``concurrent.futures.Future`` (``return executor.submit(...)``) would run them in the
    worker thread that completes it. Raises if ``result`` is not awaitable."""
    from tornado.gen import convert_yielded
    if isinstance(result, concurrent.futures.Future):
        return asyncio.wrap_future(result, loop=loop)
    return convert_yielded(result)
