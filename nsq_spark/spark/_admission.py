"""Admission control of the ``nsq`` stream source: whether to plan a micro-batch now, and
how it is split over topics and fetch tasks. Pure: backlogs, limits and elapsed seconds
in, a plan out; the driver (:mod:`.datasource`) measures and records, this decides.

Kafka's controls, with the same meaning:

* ``maxMessagesPerTrigger`` (Kafka ``maxOffsetsPerTrigger``, Spark ``ReadMaxRows``): the
  batch's message count is the fetchable backlog capped by it.
* ``minMessagesPerTrigger`` + ``maxTriggerDelay`` (Kafka ``minOffsetsPerTrigger`` +
  ``maxTriggerDelay``, Spark ``ReadMinRows``): :func:`hold_back` -- no batch while the
  backlog is below the minimum, unless the delay has passed since the last batch. The
  delay is timed by the source (pyspark's ``ReadMinRows`` carries no delay).
* ``maxBytesPerTrigger`` (Spark ``ReadMaxBytes``): a byte budget split over the fetch
  tasks; each task stops at its share (nsqd reports no byte depth, so only the task that
  sees the bodies can count them).

Several topics (``topics``, ``topicPattern``): ``numPartitions`` stays the batch's
parallelism, not a count per topic -- a pattern that matches 50 topics would otherwise
cost 100 tasks, each with its per-task cost, per batch. The tasks go to the topics that
have a backlog, at least one each, the rest in proportion to the backlog; the messages of
a capped batch likewise (Kafka divides ``maxOffsetsPerTrigger`` over partitions in
proportion to their lag). Without a measurement (``nsqdTcpAddresses`` alone, one list of
topics), every topic gets its even part. Every division is :func:`apportion` (largest
remainder, ties to the earlier item), so the same offset always gives the same tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = ["Limits", "TopicPlan", "apportion", "hold_back", "plan_topics", "split_shares",
           "task_shares"]


@dataclass(frozen=True)
class Limits:
    """What one trigger may plan. ``None``: no such limit."""

    max_rows: int | None = None
    min_rows: int | None = None
    max_trigger_delay: float = 900.0  # seconds
    max_bytes: int | None = None


NO_LIMITS = Limits()


@dataclass(frozen=True)
class TopicPlan:
    """One topic's part of a planned batch, as recorded in the offset (``plan``)."""

    topic: str
    parts: int  # fetch tasks
    size: int  # messages for those tasks in all (0: no cap)
    max_bytes: int | None  # body bytes for those tasks in all (None: no cap)

    def as_offset(self) -> list[Any]:
        return [self.topic, self.parts, self.size, self.max_bytes]

    @classmethod
    def from_offset(cls, entry: Sequence[Any]) -> "TopicPlan":
        topic, parts, size, max_bytes = entry
        return cls(str(topic), int(parts), int(size),
                   None if max_bytes is None else int(max_bytes))


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainder; all weights 0:
    evenly). The parts sum to ``total``."""
    n = len(weights)
    if n == 0:
        return []
    if sum(weights) <= 0:
        weights = [1] * n
    whole = sum(weights)
    exact = [total * w for w in weights]
    out = [e // whole for e in exact]
    left = total - sum(out)
    # the largest remainders get one more; sorted() is stable: ties to the earlier item
    for i in sorted(range(n), key=lambda i: -(exact[i] % whole))[:left]:
        out[i] += 1
    return out


def hold_back(backlog: int | None, limits: Limits, since_last_batch: float) -> bool:
    """``minMessagesPerTrigger``: True while the batch waits for more messages. A backlog
    that cannot be measured never holds a batch back (the option is refused then)."""
    if limits.min_rows is None or backlog is None:
        return False
    return backlog < limits.min_rows and since_last_batch < limits.max_trigger_delay


def plan_topics(backlogs: Mapping[str, int | None], limits: Limits,
                num_partitions: int) -> tuple[TopicPlan, ...]:
    """The next batch's topics, tasks, messages and bytes; empty: no batch.

    ``backlogs``: each topic's fetchable backlog, in the order topics are listed (None:
    not measured -- then every topic is planned, capped by ``max_rows`` alone)."""
    topics = list(backlogs)
    if not topics:
        return ()
    measured = all(v is not None for v in backlogs.values())
    if measured:
        depth = {t: max(0, backlogs[t] or 0) for t in topics}
        total = sum(depth.values())
        if total <= 0:
            return ()
        size = total if limits.max_rows is None else min(total, limits.max_rows)
        if size <= 0:
            return ()
        sizes = apportion(size, [depth[t] for t in topics])
        kept = [(t, n) for t, n in zip(topics, sizes) if n > 0]
    else:
        size = limits.max_rows or 0
        sizes = apportion(size, [1] * len(topics)) if size else [0] * len(topics)
        kept = [(t, n) for t, n in zip(topics, sizes) if n > 0 or not size]
    names = [t for t, _ in kept]
    weights = [n for _, n in kept] if size else [depth[t] for t in names] if measured \
        else [1] * len(names)
    extra = apportion(max(0, num_partitions - len(kept)), weights)
    parts = [1 + e for e in extra]
    if size:  # no task with nothing to fetch
        parts = [min(p, n) for p, (_, n) in zip(parts, kept)]
    budgets: list[int | None] = [None] * len(kept)
    if limits.max_bytes is not None:
        budgets = list(_at_least_one_each(limits.max_bytes, parts, weights))
    return tuple(TopicPlan(t, p, n, b) for (t, n), p, b in zip(kept, parts, budgets))


def _at_least_one_each(total: int, counts: Sequence[int], weights: Sequence[int]) -> list[int]:
    """``total`` over groups of ``counts`` items, at least 1 per item (a task takes at
    least one message, so its byte share is at least 1), the rest by ``weights``: the
    parts sum to ``max(total, sum(counts))``."""
    rest = apportion(max(0, total - sum(counts)), weights)
    return [c + r for c, r in zip(counts, rest)]


def split_shares(size: int, n: int) -> list[int | None]:
    """``size`` messages over ``n`` tasks; 0 means no cap (every task uncapped)."""
    if size <= 0:
        return [None] * n
    return [s for s in apportion(size, [1] * n) if s > 0]


def task_shares(plan: TopicPlan) -> list[tuple[int | None, int | None]]:
    """``(messages, bytes)`` of each fetch task of one topic's plan (None: no cap). A
    task's byte share is at least 1: a task takes at least one message."""
    shares = split_shares(plan.size, plan.parts)
    if plan.max_bytes is None:
        return [(s, None) for s in shares]
    budgets = _at_least_one_each(plan.max_bytes, [1] * len(shares), [s or 0 for s in shares])
    return [(s, b) for s, b in zip(shares, budgets)]
