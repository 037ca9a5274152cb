"""The one helper the Reader tests have that the ``nsq_spark.testing`` plugin does not:
:func:`await_for`, waiting inside a coroutine on the Reader's loop. Publishing straight to
nsqd, channel stats and waiting are the plugin's (``publish``,
``NSQCluster.nsqds[i].channel_stats``, ``NSQCluster.wait_drained``, ``wait_until``), so
that users and these tests share one copy.

Kept independent of our Producer on purpose: the Reader tests must not depend on it."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable


async def await_for(pred: Callable[[], Any], timeout: float, what: str,
                    interval: float = 0.01) -> Any:
    """``wait_until`` for coroutines on the Reader's loop (it must keep running)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
