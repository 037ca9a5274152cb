"""Helpers for the Reader tests (publishing over nsqd's HTTP API, waiting on nsqd stats).

Kept independent of our Producer on purpose: the Reader tests must not depend on it."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any, Callable, Iterable


def mpub(http_address: str, topic: str, bodies: Iterable[bytes], chunk: int = 5000) -> None:
    """Publish with HTTP /mpub (binary mode: bodies may hold newlines)."""
    bodies = list(bodies)
    for i in range(0, len(bodies), chunk):
        part = bodies[i:i + chunk]
        data = b"".join(len(b).to_bytes(4, "big") + b for b in part)
        data = len(part).to_bytes(4, "big") + data
        req = urllib.request.Request(f"http://{http_address}/mpub?topic={topic}&binary=true",
                                     data=data, method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.read() == b"OK"


def channel_stats(cluster: Any, i: int, topic: str, channel: str) -> dict[str, Any]:
    """nsqd ``i``'s stats of ``topic/channel`` ({} if the channel does not exist yet)."""
    stats = cluster.nsqds[i].stats(topic)
    for t in stats.get("topics", []):
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return c
    return {}


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def await_for(pred: Callable[[], Any], timeout: float, what: str,
                    interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def assert_drained(cluster: Any, topic: str, channel: str, timeout: float = 5.0) -> None:
    """Every nsqd: channel depth 0 and nothing in flight (nothing left for nsqd to time out)."""
    def done() -> bool:
        for i, node in enumerate(cluster.nsqds):
            if not node.running:
                continue
            c = channel_stats(cluster, i, topic, channel)
            if c and (c["depth"] or c["in_flight_count"] or c["deferred_count"]):
                return False
        return True
    try:
        wait_for(done, timeout, "channels drained")
    except AssertionError:
        detail = {i: channel_stats(cluster, i, topic, channel) for i in range(len(cluster.nsqds))
                  if cluster.nsqds[i].running}
        raise AssertionError(f"not drained: {json.dumps(detail)[:2000]}") from None
