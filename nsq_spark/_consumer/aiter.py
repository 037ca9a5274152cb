"""asyncio iteration over a Reader, on the caller's running loop, with no thread:
``async for message in reader`` and ``async for batch in reader.batches(n, timeout)``.

The contract:

* **Where it runs.** The first ``__anext__`` starts the Reader on the running loop (its
  connections, RDY and answers all live there from then on). Iterating with no running
  loop, on another loop than the Reader's, or a Reader that has a handler or is pulled
  from a thread (``get_batch``) is an :class:`~nsq_spark.errors.NSQError` naming the fix.
* **Answers: the pull API's rule, unchanged.** Nothing is finished automatically: every
  message handed out stays in flight until the caller answers it (``message.finish()``,
  ``reader.finish(batch)``, ``requeue``...); ``close()`` requeues whatever is left
  unanswered, handed out or still buffered. (A loop body that forgets to answer stops
  the flow after ``max_in_flight`` messages: that is the backpressure below.)
* **Backpressure through RDY.** The iterators take from the Reader's pull queue, where a
  message counts in flight from the moment it arrives; nsqd never sends more than
  ``max_in_flight`` unanswered messages, so the buffer is bounded by it and a slow loop
  body slows nsqd down instead of growing memory.
* **Batches.** ``batches(max_messages, timeout)`` yields a list as soon as
  ``max_messages`` messages are buffered, or ``timeout`` seconds after the first of them
  arrived (its arrival in the Reader: time spent in the loop body counts). A batch is
  never empty: with nothing buffered the iterator waits, without limit, until a message
  comes or the Reader closes. More than ``max_in_flight`` messages can never be unanswered
  at once, so a larger ``max_messages`` only ends batches by their timeout.
* **End.** Iteration ends (StopAsyncIteration) as soon as ``close()`` starts: nothing is
  handed out after that, and close requeues what was buffered.
* **Cancellation loses nothing.** An iterator holds no message of its own: messages stay
  in the queue until the instant they are handed out (a batch is cut when it is yielded,
  not gathered beforehand), so a consuming task cancelled while it waits leaves them to
  the next iteration, or to ``close()``, which requeues them. A message already handed to
  the cancelled loop body is the caller's, like any pulled message: close requeues it if
  it was not answered.

Compared with peers: ansq (``async for message in reader.messages()``) also leaves the
answer to the caller, but as a coroutine (``await message.fin()``); here answers are plain
calls, queued and written once per loop turn, as everywhere in this Reader. pynsq has no
asyncio iteration. Unlike ``iter_batches`` (the thread API), which ends after ``timeout``
idle seconds, ``batches`` runs until close, as an ``async for`` over a stream should.

The part is handed the pull queue, the Reader's loop bridge and a ``start`` callable (the
Reader's: start on the running loop, or refuse); it never imports the Reader.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Callable

from ..errors import ConfigError, NSQError
from .pull import check_max_messages

if TYPE_CHECKING:
    from .._loop import LoopBridge
    from ..message import Message
    from .pull import PullQueue

__all__ = ["AsyncIteration", "Messages", "Batches"]


class AsyncIteration:
    """The asyncio side of one Reader's pull queue: starting, loop checks, waiting.

    Args:
        queue: the Reader's pull queue.
        bridge: the Reader's loop bridge (which loop it runs on, once started).
        start: starts the Reader on the running loop in asyncio mode (idempotent; raises
            NSQError when the Reader cannot be iterated).
        name: the Reader's name, for error messages.
    """

    def __init__(self, queue: "PullQueue", bridge: "LoopBridge", start: Callable[[], None],
                 name: str) -> None:
        self.queue = queue
        self.bridge = bridge
        self._start = start
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[asyncio.Future[None]] = []

    def messages(self) -> "Messages":
        return Messages(self)

    def batches(self, max_messages: int, timeout: float) -> "Batches":
        check_max_messages(max_messages)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) \
                or not timeout >= 0:
            raise ConfigError(f"timeout must be a number of seconds >= 0 (how long a batch "
                              f"waits for more after its first message), got {timeout!r}")
        return Batches(self, max_messages, float(timeout))

    def enter(self) -> None:
        """Every ``__anext__``: on the Reader's loop, the Reader started."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            raise NSQError(f"[{self.name}] iterate a Reader with `async for` inside a "
                           "coroutine on a running event loop (e.g. under "
                           "asyncio.run(main())); from a thread, use get_batch / "
                           "iter_batches") from None
        if self.loop is None:
            self._start()
            self.loop = self.bridge.loop
            self.queue.on_put = self._wake
        if running is not self.loop:
            raise NSQError(f"[{self.name}] this Reader runs on another event loop (the one "
                           "that first iterated it); iterate it there, or make one Reader "
                           "per loop")

    def _wake(self) -> None:
        """Something was put, or the queue stopped (the loop thread)."""
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        """Until the next put or stop, or ``timeout`` seconds (None: no limit)."""
        assert self.loop is not None, "enter() first"
        fut = self.loop.create_future()
        self._waiters.append(fut)
        timer = None if timeout is None else self.loop.call_later(timeout, _resolve, fut)
        try:
            await fut
        finally:
            if timer is not None:
                timer.cancel()
            if not fut.done():  # cancelled while waiting: no wake-up for a dead future
                fut.cancel()
            try:
                self._waiters.remove(fut)
            except ValueError:  # woken: _wake took it off
                pass


def _resolve(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


class Messages:
    """``async for message in reader``: one message per step (see the module doc)."""

    __slots__ = ("_it",)

    def __init__(self, it: AsyncIteration) -> None:
        self._it = it

    def __aiter__(self) -> "Messages":
        return self

    async def __anext__(self) -> "Message":
        it = self._it
        it.enter()
        queue = it.queue
        while not queue.stopped:
            m = queue.take_one()
            if m is not None:
                return m
            await it.wait(None)
        raise StopAsyncIteration


class Batches:
    """``async for batch in reader.batches(max_messages, timeout)`` (see the module doc)."""

    __slots__ = ("_it", "max_messages", "timeout")

    def __init__(self, it: AsyncIteration, max_messages: int, timeout: float) -> None:
        self._it = it
        self.max_messages = max_messages
        self.timeout = timeout

    def __aiter__(self) -> "Batches":
        return self

    async def __anext__(self) -> list["Message"]:
        it = self._it
        it.enter()
        queue, n = it.queue, self.max_messages
        while not queue.stopped:
            if queue.queued:
                left = queue.since + self.timeout - time.monotonic()
                if queue.queued >= n or left <= 0:
                    return queue.get_messages(n, 0)
                await it.wait(left)
            else:
                await it.wait(None)
        raise StopAsyncIteration
