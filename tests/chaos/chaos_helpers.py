"""What the chaos tests share: unique bodies, a bounded paced publisher straight to nsqd
(HTTP, around the proxy), a pull-mode consumer that counts every delivery, and the
zero-loss check. Each test prints one line of figures (run pytest with -s to see them)."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections import Counter
from typing import Any, Callable

from nsq_spark._consumer.reader import Reader
from nsq_spark.testing import publish as mpub

T, C = "chaos", "zero_loss"


def bodies(n: int, tag: str) -> list[bytes]:
    """``n`` unique bodies; the padding gives each frame some length for the slicer."""
    return [f"{tag}-{i:06d}-{'x' * 40}".encode() for i in range(n)]


def create_channel(http_address: str, topic: str = T, channel: str = C) -> None:
    """Topic and channel exist before the first publish: nothing waits in the topic."""
    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel={channel}"):
        req = urllib.request.Request(f"http://{http_address}{path}", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()


class PacedPublisher:
    """On a thread: publish ``sent`` straight to nsqd over HTTP in ``chunk``-sized MPUBs,
    one every ``interval`` seconds, so that messages flow while faults are injected."""

    def __init__(self, http_address: str, sent: list[bytes], chunk: int, interval: float,
                 topic: str = T) -> None:
        self._args = (http_address, sent, chunk, interval, topic)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="paced-publisher", daemon=True)

    def _run(self) -> None:
        http_address, sent, chunk, interval, topic = self._args
        try:
            for i in range(0, len(sent), chunk):
                mpub(http_address, topic, sent[i:i + chunk])
                time.sleep(interval)
        except BaseException as exc:  # noqa: BLE001 - re-raised by join()
            self.error = exc

    def __enter__(self) -> "PacedPublisher":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(timeout=60)
        if self.error is not None:
            raise AssertionError(f"publishing straight to nsqd failed: {self.error!r}")


def drained(cluster: Any, topic: str = T, channel: str = C) -> bool:
    """nsqd 0 holds nothing more for ``channel``: no depth, nothing in flight or deferred."""
    c = cluster.nsqds[0].channel_stats(topic, channel)
    return bool(c) and not (c["depth"] or c["in_flight_count"] or c["deferred_count"])


def consume(reader: Reader, want: set[bytes], cluster: Any, timeout: float,
            topic: str = T, channel: str = C,
            on_progress: Callable[[int], None] | None = None) -> Counter[bytes]:
    """Pull and FIN until every wanted body has come at least once and nsqd's channel is
    drained (so no FIN was lost for good), or ``timeout``. Returns deliveries per body."""
    counts: Counter[bytes] = Counter()
    deadline = time.monotonic() + timeout
    next_check = 0.0
    while time.monotonic() < deadline:
        batch = reader.get_batch(max_messages=200, timeout=0.1)
        for m in batch:
            counts[m.body] += 1
        if batch:
            reader.finish(batch)
            if on_progress is not None:
                on_progress(len(counts))
        now = time.monotonic()
        if want <= counts.keys() and now >= next_check:
            next_check = now + 0.3
            if drained(cluster, topic, channel):
                break
    return counts


def assert_zero_loss(want: set[bytes], counts: Counter[bytes], what: str,
                     cluster: Any = None, **figures: Any) -> int:
    """Every wanted body came at least once and nothing else came; prints the figures
    (duplicates, nsqd's timeout/requeue counts) and returns the duplicate count."""
    missing = want - counts.keys()
    stray = counts.keys() - want
    duplicates = sum(n - 1 for n in counts.values())
    extra = ""
    if cluster is not None:
        c = cluster.nsqds[0].channel_stats(T, C)
        extra = (f", nsqd timeouts {c.get('timeout_count')}, requeues "
                 f"{c.get('requeue_count')}, depth {c.get('depth')}, in flight "
                 f"{c.get('in_flight_count')}")
    shown = "".join(f", {k} {v}" for k, v in figures.items())
    print(f"\n[chaos] {what}: {len(want)} bodies, {len(counts)} distinct received, "
          f"{duplicates} duplicate deliveries{shown}{extra}")
    assert not missing, f"{what}: {len(missing)} bodies LOST, e.g. {sorted(missing)[:3]}"
    assert not stray, f"{what}: {len(stray)} bodies never published, e.g. {sorted(stray)[:3]}"
    return duplicates
