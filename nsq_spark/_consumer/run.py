"""``run()``: pynsq's ``nsq.run()``, and the registry of running consumers it closes.

A consumer registers itself with :func:`register` (weakly); :func:`run` runs the current
IO loop until SIGINT or SIGTERM, then awaits ``aclose()`` of every registered consumer
bound to that loop, and returns. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import signal
import weakref
from typing import Any, Protocol

from .._log import get_logger
from .._loop import current_ioloop

# a child of the Reader's historical logger: its level and handlers still apply
log = get_logger("nsq_spark.reader.run")

__all__ = ["run", "register"]


class Closeable(Protocol):
    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...

    @property
    def closed(self) -> bool: ...

    async def aclose(self) -> None: ...


_RUNNING: "weakref.WeakSet[Any]" = weakref.WeakSet()


def register(consumer: Closeable) -> None:
    _RUNNING.add(consumer)


def run() -> None:
    """Run the current IO loop until SIGINT or SIGTERM (pynsq's ``nsq.run()``), then close
    every Reader on it cleanly (answer everything, CLS) and return. A second signal stops
    at once."""
    ioloop = current_ioloop()
    aloop = ioloop.asyncio_loop
    stopping = False

    async def shutdown() -> None:
        consumers = [c for c in list(_RUNNING) if c.loop is aloop and not c.closed]
        await asyncio.gather(*(c.aclose() for c in consumers), return_exceptions=True)
        ioloop.stop()

    def on_signal(signum: int) -> None:
        nonlocal stopping
        log.info("signal %s received, closing readers", signal.Signals(signum).name)
        if stopping:
            ioloop.stop()
            return
        stopping = True
        asyncio.ensure_future(shutdown())

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            aloop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    try:
        ioloop.start()
    finally:
        for sig in installed:
            aloop.remove_signal_handler(sig)
