"""The one bridge between threads and an asyncio event loop.

:class:`LoopThread` owns a daemon thread that runs its own event loop, for objects (the
Producer's futures API, blocking callers of async code) that must do IO on a loop while
their callers are plain threads.

API:

``LoopThread(name)``                 starts the thread; ``.loop`` runs when it returns
``run_coroutine(coro)``              schedule ``coro`` on the loop from any thread ->
                                     ``concurrent.futures.Future`` of its result
``call_soon(fn, *args)``             run ``fn(*args)`` on the loop soon (thread-safe)
``in_loop_thread()``                 True when called from the loop's own thread
``stop(timeout)``                    stop the loop, join the thread, close the loop; True
                                     if the thread ended in time
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Coroutine, TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """A daemon thread running an asyncio event loop (see the module doc)."""

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
