"""The ``nsq`` source's numbers out of Spark, per batch: a ``StreamingQueryListener`` that
reads them from each progress event and hands them to :class:`SparkSourceMetrics` (which
:class:`nsq_spark.metrics.NSQCollector` exports to Prometheus) and to a callback::

    from nsq_spark.metrics import NSQCollector, serve
    from nsq_spark.spark.listener import NSQSourceListener, SparkSourceMetrics

    source_metrics = SparkSourceMetrics()
    NSQCollector([source_metrics]).register()
    spark.streams.addListener(NSQSourceListener(source_metrics))
    serve(9100)                                  # 127.0.0.1:9100/metrics

Why a listener. The source's driver and its fetch tasks run in other processes than the
one that watches (executors are separate Python workers; even the driver's source object
lives in a Python worker Spark starts), and pyspark's Python data source API has no custom
metrics. What reaches the JVM driver, and every listener, is the progress: the source puts
its numbers there (:mod:`.progress`; pyspark >= 4.2). The fetch tasks' figures (rows,
body bytes, redeliveries dropped, messages dead-lettered) are summed per batch from the
spool by the driver, so the listener learns them one batch late (the progress of batch
N+1 carries batch N's; :mod:`.progress` says why).

What it exports, per (query, topic, channel): gauges for the backlog, the lag in seconds
(the age of the newest message read while a backlog waits; 0 caught up), the age of the
oldest message of the last batch, nsqds paused or unreachable; counters for batches,
rows, bytes, redeliveries dropped and dead letters, each batch counted once however many
progress events repeat its numbers. An idle query (Spark 3.5 and later: a trigger that
plans no batch) sends a ``QueryIdleEvent``, not progress: the listener takes it as "the
query is alive and nothing waits" (:meth:`SparkSourceMetrics.idle`: backlog and lag 0,
the timestamp now), or, for a source with ``minMessagesPerTrigger``, "a backlog below the
minimum may wait" (backlog and lag unknown: not exported). ``query`` is the query's name, or its id without one.
``topic`` is the topic, or a multi-topic subscription's topics joined by ``,``. The age
of the oldest *unread* message is not known: nsqd reports depths, not ages (see
:mod:`.progress`). When a query terminates its series are dropped, so a stopped query
does not keep exporting a stale lag.

Spark Connect (pyspark >= 4.0): ``spark.streams.addListener`` on a Connect client runs
the listener in the client process (pyspark's client-side listener bus, which rebuilds
the events from the server's JSON), so this works there as in a classic session, with
nsq-spark installed on the client. Tested on events built that way, not yet against a
Connect server.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from pyspark.sql.streaming.listener import StreamingQueryListener

from .._log import get_logger
from .progress import SourceLag, source_lags

log = get_logger(__name__)

__all__ = ["NSQSourceListener", "SourceBatch", "SourceTotals", "SparkSourceMetrics"]


@dataclass(frozen=True)
class SourceTotals:
    """One source of one query, as exported: the latest gauges and the running totals."""

    query: str
    topic: str
    channel: str
    backlog_messages: int | None = None
    lag_seconds: float | None = None
    last_batch_oldest_age_seconds: float | None = None
    paused_nsqds: int = 0
    unreachable_nsqds: int = 0
    last_batch: int | None = None
    batches: int = 0
    rows: int = 0
    bytes: int = 0
    redeliveries_dropped: int = 0
    dead_lettered: int = 0
    updated_at: float = 0.0  # time.time() of the progress or idle event that updated it

    def stats(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class SourceBatch:
    """What the listener hands its callback for each ``nsq`` source of a progress event.
    ``new_batch``: ``lag.last_batch`` had not been seen before (a progress published
    again, e.g. ``query.lastProgress`` polled, repeats the last batch's numbers)."""

    query: str
    query_id: str
    lag: SourceLag
    new_batch: bool


class SparkSourceMetrics:
    """The numbers of ``nsq`` sources as :class:`NSQSourceListener` learns them; thread-
    safe. ``stats()`` is what :class:`nsq_spark.metrics.NSQCollector` reads (``watch`` it,
    or pass it to the constructor). ``clock``: the time source of ``updated_at``
    (seconds since the epoch; default ``time.time``; tests pass a fixed one)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._sources: dict[tuple[str, str, str], SourceTotals] = {}
        self._query_ids: dict[str, str] = {}  # query id -> the query label it exports
        # sources whose last report said minMessagesPerTrigger applies
        self._min_rows: dict[tuple[str, str, str], int] = {}

    def update(self, query: str, lag: SourceLag, query_id: str | None = None) -> bool:
        """Take one source's numbers from a progress of ``query`` (its label); returns
        whether ``lag.last_batch`` is a batch not counted before."""
        topic = ",".join(lag.topics)
        key = (query, topic, lag.channel)
        with self._lock:
            if query_id is not None:
                self._query_ids[query_id] = query
            old = self._sources.get(key) or SourceTotals(query, topic, lag.channel)
            new_batch = lag.last_batch is not None and lag.last_batch != old.last_batch
            totals = replace(
                old, backlog_messages=lag.backlog_messages, lag_seconds=lag.lag_seconds,
                last_batch_oldest_age_seconds=lag.last_batch_oldest_age_seconds,
                paused_nsqds=lag.paused_nsqds, unreachable_nsqds=lag.unreachable_nsqds,
                updated_at=self._clock())
            if new_batch:
                totals = replace(
                    totals, last_batch=lag.last_batch, batches=old.batches + 1,
                    rows=old.rows + (lag.last_batch_rows or 0),
                    bytes=old.bytes + (lag.last_batch_bytes or 0),
                    redeliveries_dropped=old.redeliveries_dropped
                    + (lag.last_batch_redeliveries_dropped or 0),
                    dead_lettered=old.dead_lettered + (lag.last_batch_dead_lettered or 0))
            self._sources[key] = totals
            if lag.min_messages_per_trigger:
                self._min_rows[key] = lag.min_messages_per_trigger
            else:
                self._min_rows.pop(key, None)
        return new_batch

    def idle(self, query_id: str) -> int:
        """The query ``query_id`` triggered and planned no batch (a ``QueryIdleEvent``):
        its sources' ``updated_at`` is now, and their backlog and lag are 0 (a batch is
        planned whenever something is fetchable), except for a source that holds a
        backlog below ``minMessagesPerTrigger`` back: its backlog and lag are unknown
        (None, not exported) until its next batch. Returns the sources updated (0 for a
        query no progress was seen of)."""
        now = self._clock()
        with self._lock:
            label = self._query_ids.get(query_id, query_id)
            keys = [k for k in self._sources if k[0] == label]
            for key in keys:
                known = None if key in self._min_rows else 0
                self._sources[key] = replace(
                    self._sources[key], backlog_messages=known,
                    lag_seconds=None if known is None else 0.0, updated_at=now)
        return len(keys)

    def forget(self, query: str) -> None:
        """Drop every series of ``query`` (a label or a query id)."""
        with self._lock:
            label = self._query_ids.pop(query, query)
            for key in [k for k in self._sources if k[0] == label]:
                del self._sources[key]
                self._min_rows.pop(key, None)

    def totals(self) -> list[SourceTotals]:
        with self._lock:
            return list(self._sources.values())

    def stats(self) -> dict[str, Any]:
        """``{"spark_sources": [...]}``: one dict of :class:`SourceTotals` per source."""
        return {"spark_sources": [t.stats() for t in self.totals()]}


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def query_label(progress: Any) -> tuple[str, str]:
    """(label, id) of the query a progress is about: its name, else its id."""
    query_id = str(_field(progress, "id") or "")
    return str(_field(progress, "name") or query_id), query_id


class NSQSourceListener(StreamingQueryListener):
    """Publishes the numbers of every ``nsq`` source of every query, per progress event,
    to ``metrics`` (a :class:`SparkSourceMetrics`; optional) and to ``on_batch`` (called
    with a :class:`SourceBatch` per source per event; optional). A callback that raises
    is logged and the listener goes on (it runs on Spark's listener thread)."""

    def __init__(self, metrics: SparkSourceMetrics | None = None,
                 on_batch: Callable[[SourceBatch], None] | None = None) -> None:
        if metrics is None and on_batch is None:
            raise ValueError("NSQSourceListener(metrics, on_batch): pass a "
                             "SparkSourceMetrics, a callback, or both; with neither it "
                             "would publish nothing")
        self.metrics = metrics
        self.on_batch = on_batch
        # which batches were seen, for SourceBatch.new_batch: the metrics' own record
        self._seen = metrics if metrics is not None else SparkSourceMetrics()

    def publish(self, progress: Any) -> list[SourceBatch]:
        """Publish the ``nsq`` sources of ``progress`` (an event's ``progress``, a
        ``lastProgress`` dict or its JSON); returns what was handed to ``on_batch``."""
        if isinstance(progress, str):
            import json

            progress = json.loads(progress)
        query, query_id = query_label(progress)
        out = []
        for lag in source_lags(progress):
            new = self._seen.update(query, lag, query_id)
            batch = SourceBatch(query, query_id, lag, new)
            out.append(batch)
            if self.on_batch is not None:
                try:
                    self.on_batch(batch)
                except Exception as exc:  # noqa: BLE001 - Spark's listener thread goes on
                    log.warning("NSQSourceListener: on_batch failed for query %s: %s",
                                query, exc, extra={"spark_query": query})
        return out

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        self.publish(event.progress)

    def onQueryIdle(self, event: Any) -> None:
        # Spark 3.5+: an idle trigger posts this instead of a progress (see
        # SparkSourceMetrics.idle); without it the last progress, a batch planned with a
        # backlog, would stay exported as if the query were stalled behind it
        self._seen.idle(str(event.id))

    def onQueryTerminated(self, event: Any) -> None:
        self._seen.forget(str(event.id))
