"""Helpers for the Reader tests, under the names those tests use; the implementations are
the ``nsq_spark.testing`` plugin's (publishing straight to nsqd over HTTP, nsqd's channel
stats, waiting), so that users and these tests share one copy.

Kept independent of our Producer on purpose: the Reader tests must not depend on it."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Iterable

from nsq_spark.testing import NSQCluster, publish, wait_until


def mpub(http_address: str, topic: str, bodies: Iterable[bytes], chunk: int = 5000) -> None:
    """Publish with HTTP /mpub (binary mode: bodies may hold newlines)."""
    publish(http_address, topic, list(bodies), chunk)


def channel_stats(cluster: NSQCluster, i: int, topic: str, channel: str) -> dict[str, Any]:
    """nsqd ``i``'s stats of ``topic/channel`` ({} if the channel does not exist yet)."""
    return cluster.nsqds[i].channel_stats(topic, channel)


wait_for = wait_until


async def await_for(pred: Callable[[], Any], timeout: float, what: str,
                    interval: float = 0.01) -> Any:
    """:func:`wait_until` for coroutines on the Reader's loop (it must keep running)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def assert_drained(cluster: NSQCluster, topic: str, channel: str, timeout: float = 5.0) -> None:
    """Every nsqd: channel depth 0 and nothing in flight (nothing left for nsqd to time out)."""
    cluster.wait_drained(topic, channel, timeout)
