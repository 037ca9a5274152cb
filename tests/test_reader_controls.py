"""go-nsq's consumer controls on a running Reader against real nsqd: ``low_rdy_timeout``
(busy connections hand their RDY on after that long, when max_in_flight < connections)
and ``backoff_strategy`` (full jitter: windows shorter than the exponential envelope, RDY 0
on the wire meanwhile)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from typing import Any

import pytest

from nsq_spark.message import Message
from nsq_spark.testing import NSQCluster, ReaderRunner, wait_until

pytestmark = pytest.mark.nsqd


class FixedDraw(random.Random):
    """A random source whose every draw is ``value``."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def _topic() -> str:
    return "t" + uuid.uuid4().hex[:12]


def _runs(events: list[tuple[float, str]]) -> list[tuple[str, float, float]]:
    """Consecutive deliveries from the same nsqd: (address, first, last)."""
    out: list[tuple[str, float, float]] = []
    for t, addr in events:
        if out and out[-1][0] == addr:
            out[-1] = (addr, out[-1][1], t)
        else:
            out.append((addr, t, t))
    return out


@pytest.mark.nsq_cluster(nsqd=2)
def test_low_rdy_timeout_hands_rdy_between_busy_nsqds_on_time(
        nsq_cluster: NSQCluster, running_reader: ReaderRunner) -> None:
    topic = _topic()
    for i in range(2):  # a backlog on both: neither connection ever idles
        nsq_cluster.nsqds[i].publish(topic, [b"%d-%d" % (i, k) for k in range(400)])
    events: list[tuple[float, str]] = []
    lock = threading.Lock()

    def handler(m: Message) -> bool:
        time.sleep(0.01)
        with lock:
            events.append((time.monotonic(), m.nsqd_address or "?"))
        return True

    reader = running_reader.start(topic, "ch", handler, max_in_flight=1,
                                  low_rdy_timeout=1.0, low_rdy_idle_timeout=30,
                                  rdy_redistribute_interval=0.1,
                                  nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: len(_runs(list(events))) >= 5, 20, "five turns")
    running_reader.stop(reader)
    runs = _runs(events)
    assert {a for a, _, _ in runs} == set(nsq_cluster.nsqd_tcp_addresses)
    for addr, first, last in runs[1:-1]:  # whole turns only
        # held at least the timeout, then handed on within a few redistribution rounds
        assert 0.8 <= last - first <= 1.0 + 0.6, (addr, last - first, runs)


@pytest.mark.parametrize("strategy", ["exponential", "full_jitter"])
def test_backoff_strategy_sets_how_long_deliveries_stop_after_a_failure(
        strategy: str, nsq_cluster: NSQCluster, running_reader: ReaderRunner) -> None:
    topic = _topic()
    delivered: list[tuple[float, bytes]] = []

    def handler(m: Message) -> bool:
        delivered.append((time.monotonic(), m.body))
        return m.body != b"fail" or m.attempts > 1

    reader = running_reader.start(topic, "ch", handler, max_in_flight=1,
                                  backoff_strategy=strategy, backoff_multiplier=2.0,
                                  max_backoff_duration=2.0, requeue_delay=0,
                                  nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    # full jitter draws through the Reader's backoff policy: a fixed draw makes its window
    # known (0.75 of the 2 s cap), so a missing backoff (or a zero draw) fails the test
    reader._backoff.rng = FixedDraw(0.75)
    nsq_cluster.publish(topic, [b"fail", b"b", b"c"])
    wait_until(lambda: reader.finished >= 3, 20, "3 finished")
    state: dict[str, Any] = reader.stats()["backoff"]
    assert state["strategy"] == strategy and state["level"] == 0
    running_reader.stop(reader)
    first_fail = next(t for t, body in delivered if body == b"fail")
    window = next(t for t, _ in delivered if t > first_fail) - first_fail
    # RDY 0 on the wire for the window. Exponential waits the whole 2 s; full jitter waits
    # its draw, 0.75 * 2 s here (the distribution of draws: tests/test_backoff.py); at
    # least the window (no backoff at all would redeliver at once), at most the cap plus
    # 1 s of slack for delivery on a loaded machine
    if strategy == "exponential":
        assert 2.0 <= window < 3.0
    else:
        assert 1.5 <= window < 2.0 + 1.0, window
    nsq_cluster.wait_drained(topic, "ch")
