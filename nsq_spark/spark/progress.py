"""The ``nsq`` source's lag as numbers: what the driver puts in the query's progress, and
:func:`source_lag`, which reads it back for a ``StreamingQueryListener``.

Where it goes. pyspark's Python data source API has no custom metrics (no
``ReportsSourceMetrics``; checked on 4.0-4.3: the JVM side ``PythonMicroBatchStream*``
implements ``SupportsAdmissionControl``, ``SupportsTriggerAvailableNow`` and
``AcceptsLatestSeenOffset`` only). From 4.2 on the source's ``reportLatestOffset()`` is
the one thing it says in the progress: ``progress.sources[i].latestOffset``, a JSON
string. So the numbers are flat fields of it (``FIELDS``), next to the nested
``backlog`` object; on 4.0 and 4.1 there is no report and :func:`source_lag` finds none.

When it is measured. Spark takes the report when it plans a batch (right after
``latestOffset``), and emits that batch's progress after running it; the progress of
batch N cannot hold anything measured after N ran. What it holds is the freshest there
is: the backlog measured at this trigger, i.e. after the previous batch (N-1) ended, and
that batch's own numbers (``lastBatch*``: rows, bytes, redeliveries dropped, message
timestamps), read from its spool before it is deleted.

An idle query sends no progress (Spark 3.5 and later: a trigger that plans no batch posts
a ``QueryIdleEvent``, every 10 s by default, with the query's id and nothing of its
sources), so the last progress is the last batch that ran, whose backlog was > 0 (a batch
is planned only with a backlog). A trigger plans no batch when nothing is fetchable, or
when ``minMessagesPerTrigger`` holds a smaller backlog back (until ``maxTriggerDelay``):
the report carries ``minMessagesPerTrigger`` when it applies, so that a listener
(:meth:`.listener.SparkSourceMetrics.idle`) can tell "caught up" from "held back".

Lag in time. nsqd's ``/stats`` gives no age of the oldest waiting message (only depths,
and end-to-end percentiles of FINished ones when nsqd is started with
``--e2e-processing-latency-percentile``), so ``lagSeconds`` is the age, when measured, of
the newest message of the last batch: nsqd delivers in about publish order, so what waits
was published after it, and the age of the oldest waiting message is at most this. With
nothing fetchable it is 0 (caught up); with a backlog and no batch yet, unknown (absent).
Ages use the driver's clock against nsqd's timestamps: clock skew between the hosts adds
to them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

__all__ = ["BatchNumbers", "FIELDS", "SourceLag", "lag_fields", "source_lag", "source_lags"]


class BatchNumbers(Protocol):
    """What the fetch side counts of one batch (``Spool.batch_summary``)."""

    @property
    def rows(self) -> int: ...

    @property
    def bytes(self) -> int: ...

    @property
    def oldest_timestamp_ns(self) -> int | None: ...

    @property
    def newest_timestamp_ns(self) -> int | None: ...

    @property
    def redeliveries_dropped(self) -> int: ...

    @property
    def dead_lettered(self) -> int: ...


# The flat numeric fields of the report, and what each is (the module doc says when).
FIELDS = {
    "backlogMessages": "fetchable backlog over all topics at this trigger",
    "lagSeconds": "age of the newest message of the last batch; 0 when caught up",
    "lastBatch": "the batch the lastBatch* fields describe",
    "lastBatchRows": "rows the last batch read",
    "lastBatchBytes": "body bytes the last batch read",
    "lastBatchRedeliveriesDropped": "redeliveries the last batch's fetch tasks dropped",
    "lastBatchOldestAgeSeconds": "age of the oldest message of the last batch",
    "lastBatchDeadLettered": "messages over maxAttempts the last batch wrote to the dead letters",
    "pausedNsqds": "nsqds where a topic or the channel is paused",
    "unreachableNsqds": "known nsqds that did not answer",
    "minMessagesPerTrigger": "the minimum a batch waits for (absent: none applies); idle "
                             "with one, a backlog below it may wait",
}


def _age(now: float, timestamp_ns: int | None) -> float | None:
    if timestamp_ns is None:
        return None
    return round(max(0.0, now - timestamp_ns / 1e9), 3)


def lag_fields(backlog: int | None, paused: int, unreachable: int,
               last_batch: int | None, summary: BatchNumbers | None,
               now: float) -> dict[str, Any]:
    """The flat fields of :data:`FIELDS` (those known), from the backlog measured at
    ``now`` (``time.time()``) and the numbers of batch ``last_batch``."""
    out: dict[str, Any] = {"pausedNsqds": paused, "unreachableNsqds": unreachable}
    if backlog is not None:
        out["backlogMessages"] = backlog
    newest_age = None
    if summary is not None and last_batch is not None:
        newest_age = _age(now, summary.newest_timestamp_ns)
        out.update(lastBatch=last_batch, lastBatchRows=summary.rows,
                   lastBatchBytes=summary.bytes,
                   lastBatchRedeliveriesDropped=summary.redeliveries_dropped,
                   lastBatchDeadLettered=summary.dead_lettered)
        oldest = _age(now, summary.oldest_timestamp_ns)
        if oldest is not None:
            out["lastBatchOldestAgeSeconds"] = oldest
    if backlog == 0:
        out["lagSeconds"] = 0.0
    elif newest_age is not None and backlog is not None:
        out["lagSeconds"] = newest_age
    return out


@dataclass(frozen=True)
class SourceLag:
    """One ``nsq`` source's numbers from a progress (None: not known at that trigger)."""

    topics: tuple[str, ...]
    channel: str
    batch: int  # the latest batch planned when the progress was taken
    backlog_messages: int | None = None
    lag_seconds: float | None = None
    last_batch: int | None = None
    last_batch_rows: int | None = None
    last_batch_bytes: int | None = None
    last_batch_redeliveries_dropped: int | None = None
    last_batch_oldest_age_seconds: float | None = None
    last_batch_dead_lettered: int | None = None
    paused_nsqds: int = 0
    unreachable_nsqds: int = 0
    min_messages_per_trigger: int | None = None
    backlog_by_topic: Mapping[str, int] = field(default_factory=dict)


def _sources(progress: Any) -> list[Any]:
    if isinstance(progress, str):
        progress = json.loads(progress)
    if isinstance(progress, Mapping):
        return list(progress.get("sources") or [])
    return list(getattr(progress, "sources", None) or [])


def _latest(source: Any) -> Any:
    if isinstance(source, Mapping):
        return source.get("latestOffset")
    return getattr(source, "latestOffset", None)


def _parse(source: Any) -> SourceLag | None:
    latest = _latest(source)
    if isinstance(latest, str):
        try:
            latest = json.loads(latest)
        except ValueError:
            return None
    if not isinstance(latest, Mapping) or "channel" not in latest or \
            "pausedNsqds" not in latest:
        return None  # another source, or an nsq source on pyspark < 4.2 (no report)
    topics = latest.get("topics") or [latest.get("topic")]
    by_topic = latest.get("backlogByTopic") or {}

    def num(key: str, kind: type) -> Any:
        value = latest.get(key)
        return None if value is None else kind(value)

    return SourceLag(
        topics=tuple(str(t) for t in topics if t),
        channel=str(latest["channel"]), batch=int(latest.get("batch", 0)),
        backlog_messages=num("backlogMessages", int), lag_seconds=num("lagSeconds", float),
        last_batch=num("lastBatch", int), last_batch_rows=num("lastBatchRows", int),
        last_batch_bytes=num("lastBatchBytes", int),
        last_batch_redeliveries_dropped=num("lastBatchRedeliveriesDropped", int),
        last_batch_oldest_age_seconds=num("lastBatchOldestAgeSeconds", float),
        last_batch_dead_lettered=num("lastBatchDeadLettered", int),
        paused_nsqds=int(latest.get("pausedNsqds", 0)),
        unreachable_nsqds=int(latest.get("unreachableNsqds", 0)),
        min_messages_per_trigger=num("minMessagesPerTrigger", int),
        backlog_by_topic={str(k): int(v) for k, v in by_topic.items() if v is not None})


def source_lags(progress: Any) -> list[SourceLag]:
    """Every ``nsq`` source's numbers in ``progress``: a listener's ``event.progress``
    (``StreamingQueryProgress``), ``query.lastProgress`` (a dict) or its JSON."""
    return [lag for lag in map(_parse, _sources(progress)) if lag is not None]


def source_lag(progress: Any) -> SourceLag | None:
    """The first ``nsq`` source's numbers in ``progress`` (see :func:`source_lags`);
    None when it has none (another source, or pyspark < 4.2)::

        class Lag(StreamingQueryListener):
            def onQueryProgress(self, event):
                lag = source_lag(event.progress)
                if lag is not None and lag.lag_seconds is not None:
                    gauge.set(lag.lag_seconds)
    """
    lags = source_lags(progress)
    return lags[0] if lags else None
