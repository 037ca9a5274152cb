"""OpenTelemetry of the Spark source, beside what it measures: a query's consumed
messages, counted from its progress in the application's process.

Why from the progress and not in the source: the source's driver side runs in a Python
worker the JVM starts, and its fetch tasks in executors, not in the process that holds
your meter provider; the progress is what reaches the application's process (pyspark 4.2
and later: on 4.0/4.1 the source reports nothing and this counts 0). The numbers are read
with :func:`nsq_spark.spark.progress.source_lags`; the providers and the instruments are
:class:`nsq_spark.telemetry.Telemetry`'s::

    from nsq_spark.spark import ProgressInstrument

    progress = ProgressInstrument(telemetry)

    class OtelProgress(StreamingQueryListener):
        ...
        def onQueryTerminated(self, event):
            progress.forget_query(event.id)

        def onQueryProgress(self, event):
            progress.record(event.progress)
"""

from __future__ import annotations

import json
from typing import Any

from nsq_spark.errors import ConfigError
from nsq_spark.telemetry import SYSTEM, Telemetry

from .progress import source_lags

__all__ = ["ProgressInstrument"]


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


class ProgressInstrument:
    """Counts the rows of each ``nsq`` source's batches as
    ``messaging.client.consumed.messages`` (operation ``receive``, the source's topic and
    channel) of ``telemetry``, once per batch however often the same batch is reported.

    Raises:
        ConfigError: ``telemetry`` is not a :class:`~nsq_spark.telemetry.Telemetry`.
    """

    def __init__(self, telemetry: Telemetry) -> None:
        if not isinstance(telemetry, Telemetry):
            raise ConfigError(f"ProgressInstrument(telemetry) takes a "
                              f"nsq_spark.telemetry.Telemetry, not {telemetry!r}: e.g. "
                              "ProgressInstrument(Telemetry()) for OpenTelemetry's global "
                              "providers")
        self.telemetry = telemetry
        # the last batch counted per (query id, run id, topics, channel)
        self._recorded_batches: dict[tuple[str, str, tuple[str, ...], str], int] = {}

    def __repr__(self) -> str:
        return f"<ProgressInstrument queries={len({k[0] for k in self._recorded_batches})}>"

    def record(self, progress: Any) -> int:
        """Count the rows of each ``nsq`` source's last batch in ``progress`` (a
        listener's ``event.progress``, ``query.lastProgress`` or its JSON); returns the
        rows counted now. A batch is known by the query's ``id`` and ``runId`` (a restart
        is a new run, a fresh checkpoint starts again at batch 0; two queries on one topic
        and channel are two queries); batch numbers only grow within a run, so a report of
        a batch at or below the last one counted for that run (``recentProgress`` read
        again, a listener and ``lastProgress`` both reporting) counts nothing. Call it
        from a ``StreamingQueryListener.onQueryProgress``, and :meth:`forget_query` from
        its ``onQueryTerminated``."""
        if isinstance(progress, (str, bytes)):
            progress = json.loads(progress)
        query = (str(_field(progress, "id") or ""), str(_field(progress, "runId") or ""))
        counted = 0
        for lag in source_lags(progress):
            if lag.last_batch is None or not lag.last_batch_rows:
                continue
            key = (*query, lag.topics, lag.channel)
            counted_up_to = self._recorded_batches.get(key)
            if counted_up_to is not None and counted_up_to >= lag.last_batch:
                continue   # this batch or a later one of this run was counted already
            self._recorded_batches[key] = lag.last_batch
            attrs: dict[str, Any] = {
                "messaging.system": SYSTEM, "messaging.operation.name": "receive",
                "messaging.operation.type": "receive",
                "messaging.consumer.group.name": lag.channel}
            if len(lag.topics) == 1:   # several topics: no one destination name
                attrs["messaging.destination.name"] = lag.topics[0]
            self.telemetry.consumed.add(lag.last_batch_rows, attrs)
            counted += lag.last_batch_rows
        return counted

    def forget_query(self, query_id: Any) -> None:
        """Drop what :meth:`record` remembers of the query ``query_id`` (every run): call
        it from a listener's ``onQueryTerminated`` (``event.id``)."""
        qid = str(query_id)
        for key in [k for k in self._recorded_batches if k[0] == qid]:
            del self._recorded_batches[key]
