"""The ``nsq`` Spark data source: streaming and batch reads, batch and streaming writes.

Driver side of the source. Offsets are micro-batch numbers chosen here (the format, and
every older form of it, is :mod:`.offset`; nothing here reads an offset by key)::

    {"query": "<token>", "batch": 42, "size": 5000, "parts": 2, "v": 2,
     "spool": "/mnt/spool"}
    {"query": "<token>", "batch": 43, "size": 900, "parts": 3, "v": 2, "spool": ...,
     "plan": [["orders", 2, 800, null], ["refunds", 1, 100, null]]}

``query`` is a token drawn by ``initialOffset`` (it names this query's spool directory),
``batch`` counts micro-batches, ``size`` is how many messages the batch may fetch in all
(0: no cap; the fetch tasks stop when idle or after ``maxFetchPeriod``). ``partitions``
splits ``size`` over ``parts`` fetch tasks; ``read`` runs on executors
(:mod:`nsq_spark.spark.fetch`, protocol in :mod:`nsq_spark.spark.spool`).

``plan`` (several topics, a ``topicPattern``, or ``maxBytesPerTrigger``): per topic
``[topic, tasks, messages, bytes]`` (:class:`~.admission.TopicPlan`), decided by
:mod:`.admission`; the tasks are numbered across topics, so the spool layout per (batch,
partition index) is unchanged. A batch run again from the checkpoint reads the topics its
offset names, whatever the pattern matches now. A query on one ``topic`` without a byte
cap writes no ``plan``: its offsets look as they did before.

``parts`` is ``numPartitions`` when the batch was planned. A batch Spark runs again from
the checkpoint (the driver restarted before its commit) keeps it whatever
``numPartitions`` says now: its partitions' chunks are already FINished on nsqd, and a
partition left out would never be read and be deleted at the commit. An offset written
before the field existed has no ``parts``: the batch then gets ``numPartitions`` tasks,
or more if its spool holds more partitions.

``v`` 2: the query's spool directory has its query marker (:meth:`.Spool.write_query_marker`,
written when the first batch is planned, or at the first trigger of an older query) for
the query's life. When a batch from the checkpoint is run again and the marker is gone,
the spool was deleted while the query was stopped: the batch's fetched messages (FINished on nsqd)
went with it, and the query fails with a :class:`~nsq_spark.errors.SparkSpoolError` naming
the spool and the batch instead of running on with the loss. A batch planned but never started has no
batch directory, and is no false alarm: the query marker tells the two apart. ``spool``
(the ``spoolPath`` the batch was planned with, its password redacted): when the marker is
missing and ``spoolPath`` is not that any more, the error says the option changed rather
than that the spool was deleted. A batch whose directories were deleted while the query
marker stayed (``rm -rf <spool>/*/batch-*``) is caught by the batch's record, which
``partitions`` writes before it returns the batch's tasks (:mod:`.spool`, step 8): a
:class:`~nsq_spark.errors.SparkSpoolError` naming the batch and the spool, never a batch
fetched anew.

At query start the driver checks that an nsqd can be reached (:mod:`.backlog`; a
``ConnectError`` naming every address tried otherwise) and creates the channel on every
nsqd it knows, and on every nsqd that appears later, so that a new channel gets what is
published after the query starts. A batch starts only when nsqd reports a backlog on the
channel (``/stats`` depth, through lookupd or ``nsqdHttpAddresses``); with neither, every
trigger starts one. After the start, an unreachable nsqd or lookupd is a transient fault:
logged, and retried at the next trigger, as Spark's Kafka source keeps polling brokers. The size is
the backlog, capped by the read limit (``maxMessagesPerTrigger``); ``minMessagesPerTrigger``
holds a batch back until ``maxTriggerDelay`` (timed here, from the last batch); see
:mod:`.admission`. Under ``Trigger.AvailableNow`` the backlog measured at query start is
the target (the minimum is ignored): batches run until that many messages were fetched or
the channel is empty (:mod:`.available_now`, the pure plan this driver follows). While
idle the backlog is measured every ``backlogPollInterval`` (0.1 s), not at each of
Spark's calls (every ~10 ms); a batch that ends is measured at once (figures at
:data:`.options.DEFAULT_POLL_INTERVAL`). Each topic has its
:class:`~.backlog.Nsqds` (channel created on each nsqd, backlog, pauses) in one
:class:`~.backlog.Subscription`, which lists a pattern's topics again at each measurement.

The backlog is visible: it is logged (INFO) when it changes, and every 10 s while it
does not, and ``reportLatestOffset`` puts it in the query's progress,
``StreamingQueryProgress.sources[0].latestOffset``::

    {"query": ..., "batch": 42, "topic": "t", "topics": ["t"], "channel": "c",
     "backlog": {"depth": 1200, "fetchable": 700, "inFlight": 300, "deferred": 0,
                 "nsqds": 3, "nsqdsAnswered": 2,
                 "paused": [{"nsqd": "10.0.0.7:4151", "paused": "channel", "depth": 500}],
                 "nsqdsUnreachable": [{"nsqd": "10.0.0.9:4151",
                                       "error": "URLError: ... Connection refused"}],
                 "measuredAt": "2026-11-23T00:01:02.345Z"},
     "redeliveriesDropped": 17,
     "backlogMessages": 700, "lagSeconds": 1.25, "lastBatch": 41, "lastBatchRows": 5000,
     "lastBatchBytes": 512000, "lastBatchRedeliveriesDropped": 0,
     "lastBatchOldestAgeSeconds": 3.5, "pausedNsqds": 1, "unreachableNsqds": 1}

The flat numbers at the end are the lag as metrics (:mod:`.progress`, which says when
each is measured and what ``lagSeconds`` is; :func:`.progress.source_lag` reads them for
a ``StreamingQueryListener``); ``lastBatch*`` come from the spool of the batch that just
ran (``Spool.batch_summary``), read when Spark asks for the next one. Several topics add
``backlogByTopic`` (and ``topicPattern``); ``paused`` entries then name their topic.

``depth`` is the channel's depth plus the topic's (not yet copied to the channel), summed
over nsqds; ``fetchable`` the part of it a batch can read, which is what the batch is
sized on: ``paused`` lists the nsqds where the topic or the channel is paused (nsqd sends
nothing there until it is unpaused, so a backlog only there plans no batch);
``nsqdsUnreachable`` the nsqds known to the query (listed by lookupd or
``nsqdHttpAddresses``, or answering earlier) that did not answer this time. Both are
also logged (WARNING, at once and then every 10 s while they last), naming the topic,
channel and nsqd (details in :mod:`.backlog`). ``inFlight`` is the messages sent to consumers and not yet answered;
``redeliveriesDropped`` the redeliveries the fetch tasks dropped within
``redeliveryWindow`` (:mod:`.seen`), counted since the driver started, at the commits
(``lastBatchRedeliveriesDropped`` is the batch's own). pyspark's Python data source API
has no custom metrics; the offsets are where a source can say something in the progress.

Redeliveries: the fetch tasks drop messages whose id is already spooled
(:mod:`nsq_spark.spark.seen`); the driver deletes the index files that fell out of the
window at each commit.

pyspark versions (what each offers: :mod:`._compat`, the one place that decides).
pyspark 4.0 and 4.1 stream too, decided on this evidence: their planner process
(``python_streaming_source_runner.py``) calls ``latestOffset()`` with no start offset and
never asks for read limits, ``prepareForTriggerAvailableNow`` or ``reportLatestOffset``;
but the JVM side (``PythonMicroBatchStream``, seen with ``javap``) implements
``AcceptsLatestSeenOffset``, and its ``setLatestSeenOffset`` calls the Python
``partitions(latest, latest)`` with the offset log's latest entry when a query restarts,
before anything else. So :class:`NSQStartlessStreamReader` keeps the start itself: the
highest offset Spark has shown it (``initialOffset``, ``partitions``' end, ``commit``'s
end, that restart call), and plans from there exactly as the 4.2 reader plans from the
``start`` Spark passes. A restart continues the logged query token and batch numbers; a
batch logged but not committed is replayed from its spool (the tier in
``tests/versions`` checks both: a query whose first batch fails after it was spooled,
restarted, and restarted again after a clean stop).
``maxMessagesPerTrigger`` caps each batch there too (the reader applies it itself).
What they lack: ``Trigger.AvailableNow`` (Spark runs such a query as one batch,
``Trigger.Once``, which reads the backlog measured at the start, up to
``maxMessagesPerTrigger``) and the backlog report in the progress. pyspark 4.0 has no
Arrow stream writer: ``df.writeStream.format("nsq")`` is refused when the query starts
(:class:`~nsq_spark.errors.SparkVersionError`, naming 4.1 and the ``foreachBatch`` way).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping, Sequence

# _compat first: on a pyspark without the Python data source API it raises
# SparkVersionError naming the version needed, instead of an ImportError from below
from .._log import get_logger
from ._compat import (API, ReadAllAvailable, ReadMaxBytes, ReadMaxRows, ReadMinRows,
                      StreamArrowWriterBase, TriggerAvailableNowBase, require)
from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter,  # noqa: E402
                                    DataSourceReader, DataSourceStreamReader,
                                    InputPartition, WriterCommitMessage)

from ._admission import (NO_LIMITS, Limits, TopicPlan, hold_back,  # noqa: E402
                        plan_topics, task_shares)
from ._available_now import AvailableNow  # noqa: E402
from ._offset import OFFSET_VERSION, BatchOffset  # noqa: E402
from ._admission import split_shares  # noqa: E402,F401 (its old home: kept importable)
from ._logs import configure as configure_logging  # noqa: E402
from ._logs import task_rows  # noqa: E402
from .options import parse_read_options, parse_write_options  # noqa: E402
from ._schema import SCHEMA_DDL  # noqa: E402

log = get_logger(__name__)

Offset = dict[str, Any]  # what Spark hands over and keeps (JSON): BatchOffset.to_dict()
# Seconds between two INFO lines with an unchanged backlog (a changed one is logged at
# once): Spark's pace for progress events of an idle query, as for the WARNINGs (.backlog).
BACKLOG_LOG_EVERY = 10.0


class NSQDataSource(DataSource):
    """``spark.readStream.format("nsq")``, ``spark.read.format("nsq")``,
    ``df.write.format("nsq")``, ``df.writeStream.format("nsq")``.

    Options: see :mod:`nsq_spark.spark.options`. Reading *consumes*: a message the source
    has read is FINished on nsqd and no other consumer of the channel gets it.
    """

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> "NSQStreamReader":
        if API.admission_control:
            return NSQStreamReader(self.options)
        return NSQStartlessStreamReader(self.options)  # pyspark 4.0, 4.1

    def reader(self, schema: Any) -> "NSQBatchReader":
        return NSQBatchReader(self.options)

    def writer(self, schema: Any, overwrite: bool) -> "NSQWriter":
        return NSQWriter(self.options)

    def streamWriter(self, schema: Any, overwrite: bool) -> "NSQStreamWriter":
        require("stream_write")  # pyspark 4.0: refused when the query starts
        return NSQStreamWriter(self.options)


class NSQPartition(InputPartition):
    """One fetch task: (query, batch, index) decides its spool directory; ``topic`` what
    it reads (None: the options' ``topic``), ``max_bytes`` its byte share (None: no cap)."""

    # a partition pickled before these existed reads them from the class
    topic: str | None = None
    max_bytes: int | None = None

    def __init__(self, query: str, batch: int, index: int, share: int | None,
                 marker: str | None = None, topic: str | None = None,
                 max_bytes: int | None = None) -> None:
        self.query = query
        self.batch = batch
        self.index = index
        self.share = share
        self.marker = marker  # the driver's shared-spool marker the task must see
        self.topic = topic
        self.max_bytes = max_bytes

    def __repr__(self) -> str:
        return (f"NSQPartition(query={self.query!r}, batch={self.batch}, index={self.index}, "
                f"share={self.share}, marker={self.marker!r}, topic={self.topic!r}, "
                f"max_bytes={self.max_bytes})")


def _subscription(opts: Any) -> Any:
    """The query's topics and the driver's :class:`~.backlog.Nsqds` of each."""
    from ._backlog import Nsqds, Subscription

    def nsqds(topic: str) -> Nsqds:
        return Nsqds(topic, opts.channel, opts.nsqd_tcp_addresses, opts.nsqd_http_addresses,
                     opts.lookupd_http_addresses)

    return Subscription(opts.topics, opts.topic_pattern, opts.lookupd_http_addresses,
                        opts.nsqd_http_addresses, nsqds)


def partitions_of(query: str, batch: int, plans: Sequence[TopicPlan],
                  marker: str | None = None) -> list[NSQPartition]:
    """The fetch tasks of a planned batch, numbered across its topics."""
    out: list[NSQPartition] = []
    for plan in plans:
        for share, max_bytes in task_shares(plan):
            out.append(NSQPartition(query, batch, len(out), share, marker, plan.topic,
                                    max_bytes))
    return out


class NSQStreamReader(DataSourceStreamReader, TriggerAvailableNowBase):
    def __init__(self, options: Mapping[str, str]) -> None:
        from ._spool import normalize_spool_path

        self.opts = parse_read_options(options, streaming=True)
        configure_logging(self.opts.log_level)  # this process runs latestOffset, commit
        self._log = log.bind(topic=self.opts.topic, channel=self.opts.channel)
        assert self.opts.spool_path is not None
        if self.opts.dedup:
            from ._filters import check_dedup_spec

            check_dedup_spec(self.opts.dedup)
        from nsq_spark._validate import redact_url

        self.spool_path = normalize_spool_path(self.opts.spool_path)
        # in each offset planned: a restart with another spoolPath is named as such
        self._spool_shown = redact_url(self.spool_path)
        self._subscription = _subscription(self.opts)
        self._clock: Callable[[], float] = time.monotonic  # trigger delay, poll interval
        self._wall: Callable[[], float] = time.time  # ages of messages (nsqd's clock)
        self._poll_interval = self.opts.backlog_poll_interval
        self._last_batch_at: float | None = None  # for maxTriggerDelay: last plan, or start
        # the minimum of the latest trigger (None: none, or AvailableNow): reported, so that
        # a listener knows an idle query may hold a backlog below it
        self._min_rows: int | None = None
        # the latest measurement: per topic, when (clock), after which batch, and whether
        # the call that made it planned a batch (only an idle source reuses it)
        self._measured: dict[str, int | None] | None = None
        self._measured_at = 0.0
        self._measured_after = -1
        self._planned_last = False
        self._logged: tuple[Any, float] | None = None  # (what was logged, when)
        # the numbers of the latest batch that ran (from its spool), for the progress
        self._last_summary: tuple[int, Any] | None = None
        self._summarized = -1
        self._ran: set[int] = set()  # batches whose partitions this driver handed out
        self._started = False
        self._tidied: tuple[str, int] | None = None  # (query, batch) spool deleted up to
        # Trigger.AvailableNow's run (None: another trigger), from prepareForTriggerAvailableNow
        self._available_now: AvailableNow | None = None
        self._planned: set[int] = set()  # batches planned by this driver (latestOffset)
        self._latest: BatchOffset | None = None  # the latest offset planned or seen
        self._dropped = 0  # redeliveries dropped since this driver started
        self._counted: set[str] = set()  # index files whose drops are in _dropped

    def __repr__(self) -> str:
        return (f"NSQStreamReader(topic={self._subscription.describe()!r}, "
                f"channel={self.opts.channel!r})")

    # -- driver ------------------------------------------------------------------------

    def _spool(self, query: str) -> Any:
        from ._spool import Spool

        return Spool(self.spool_path, query)

    def _start(self, available_now: bool = False) -> None:
        """Once per query run: an nsqd must be reachable (else ConnectError naming the
        addresses); the channel is created on every nsqd known, so that messages
        published from now on wait on it. Later outages are transient: logged, and the
        query goes on (like Spark's Kafka source, which keeps polling)."""
        if not self._started:
            self._subscription.check_reachable(require_producer=available_now)
            self._started = True

    def initialOffset(self) -> Offset:
        query = uuid.uuid4().hex
        # the query marker waits for the first latestOffset: Spark may call this on a
        # restart too and throw the token away, which must leave nothing behind
        self._spool(query).check_writable()
        return BatchOffset.initial(query).to_dict()

    def getDefaultReadLimit(self) -> Any:
        """One of Spark's read limits (pyspark passes one, not a composite): the others
        the source applies from its options (:meth:`_limits`)."""
        o = self.opts
        if o.max_messages_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(o.max_messages_per_trigger)
        if o.min_messages_per_trigger and ReadMinRows is not None:
            return ReadMinRows(o.min_messages_per_trigger)
        if o.max_bytes_per_trigger and ReadMaxBytes is not None:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def _limits(self, limit: Any) -> Limits:
        """The limits of this trigger: the options', unless Spark asks for everything
        (``ReadAllAvailable`` in place of the default limit: ``Trigger.Once``). pyspark <
        4.2 passes no limit: the options apply."""
        o = self.opts
        if ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable):
            return NO_LIMITS
        own = Limits(o.max_messages_per_trigger, o.min_messages_per_trigger,
                     o.max_trigger_delay, o.max_bytes_per_trigger)
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            own = replace(own, max_rows=limit.max_rows)
        elif ReadMinRows is not None and isinstance(limit, ReadMinRows):
            own = replace(own, min_rows=limit.min_rows)
        elif ReadMaxBytes is not None and isinstance(limit, ReadMaxBytes):
            own = replace(own, max_bytes=limit.max_bytes)
        return own

    def prepareForTriggerAvailableNow(self) -> None:
        self._start(available_now=True)
        self._available_now = AvailableNow.start(self._subscription.settled_backlog())
        self._log.info("Trigger.AvailableNow: backlog at start %s", self._available_now.target)

    def latestOffset(self, start: Offset, limit: Any = None) -> Offset:
        at = BatchOffset.from_json(start)
        limits = self._limits(limit)
        self._start(self._available_now is not None)
        now = self._clock()
        if self._last_batch_at is None:  # maxTriggerDelay counts from the source's start
            self._last_batch_at = now
        run = self._available_now
        self._min_rows = None if run is not None else limits.min_rows
        batch = at.batch
        summary = None  # the batch's spool summary, read once for both uses below
        if run is not None and run.counts(batch):
            # what the previous batch really fetched (tasks may fetch less than planned);
            # Spark calls this before commit(start): the batch's spool is still there
            summary = self._spool(at.query).batch_summary(batch)
            run = self._available_now = run.ran(
                batch, summary.rows + summary.copies_dropped if summary.partitions else 0)
        # Spark asks for the next batch only after the sink committed this one: its
        # numbers are final, and its spool can go (after they are read)
        self._summarize(at.query, batch, summary)
        self._tidy(at.query, batch)
        backlogs = self._measure(batch, now)
        self._latest = at
        self._planned_last = False
        measured = None if any(v is None for v in backlogs.values()) else \
            sum(v or 0 for v in backlogs.values())
        cap = limits.max_rows
        if run is not None:
            step = run.next(measured is not None)
            if step.done:
                return start
            if step.cap is not None:
                cap = step.cap if cap is None else min(cap, step.cap)
        # AvailableNow ignores the minimum: waiting for more would never end the run
        elif hold_back(measured, limits, now - self._last_batch_at):
            return start
        plan = plan_topics(backlogs, replace(limits, max_rows=cap), self.opts.num_partitions)
        if not plan:
            return start
        end = at.next(plan, self._marked(at), self._spool_shown,
                      record_plan=self._single_topic is None or
                      any(p.max_bytes is not None for p in plan))
        self._planned.add(end.batch)
        if run is not None:
            self._available_now = run.plans(end.batch)
        self._latest = end
        self._last_batch_at = now
        self._planned_last = True
        return end.to_dict()

    def _measure(self, batch: int, now: float) -> dict[str, int | None]:
        """Each topic's fetchable backlog: measured now, or the measurement of less than
        ``backlogPollInterval`` ago while the source is idle (why and how much:
        :data:`.options.DEFAULT_POLL_INTERVAL`)."""
        idle = (self._measured is not None and not self._planned_last and
                batch == self._measured_after)
        if idle and now - self._measured_at < self._poll_interval:
            assert self._measured is not None
            return self._measured
        self._measured = self._subscription.backlogs()
        self._measured_at, self._measured_after = now, batch
        self._log_backlog(now)
        return self._measured

    def _log_backlog(self, now: float) -> None:
        """INFO: the backlog when it changed, or every BACKLOG_LOG_EVERY seconds."""
        from ._backlog import combine

        measured = combine(self._current_measurements())
        if measured is None:
            return
        shown = measured.as_progress()
        what = {k: v for k, v in shown.items() if k != "measuredAt"}
        if self._logged is not None and self._logged[0] == what and \
                now - self._logged[1] < BACKLOG_LOG_EVERY:
            return
        self._logged = (what, now)
        self._log.info("nsq source %s/%s: backlog %s", self._subscription.describe(),
                       self.opts.channel, shown)

    def _current_measurements(self) -> dict[str, Any]:
        """The latest :class:`~.backlog.Backlog` of each topic measured last time."""
        measured = self._subscription.measured()
        return {t: measured[t] for t in (self._measured or {}) if t in measured}

    def _summarize(self, query: str, batch: int, summary: Any = None) -> None:
        """Read the numbers of ``batch`` (it ran: Spark asks for the next one) from its
        spool for the progress, once (``summary``: already read by the caller). A
        failure costs the numbers, not the batch."""
        if batch not in self._ran or batch == self._summarized:
            return  # committed before this driver started: its spool is gone
        self._summarized = batch
        if summary is not None:
            self._last_summary = (batch, summary)
            return
        try:
            summary = self._spool(query).batch_summary(batch)
        except Exception as exc:  # metrics only: the data is safe
            self._log.warning("nsq source: could not read the numbers of batch %d from the spool "
                              "under %s: %s", batch, self.spool_path, exc)
            return
        self._last_summary = (batch, summary)

    def _marked(self, start: BatchOffset) -> int:
        """The offset version for the next batch. The query marker is written before the
        first batch is planned (so every batch in the offsets log had it), and for an
        older query (offsets without ``v``) at its first trigger here, so that from then
        on a deleted spool is seen."""
        from nsq_spark._validate import redact_url

        if start.marked and start.batch > 0:
            return OFFSET_VERSION
        try:
            self._spool(start.query).write_query_marker()
        except Exception as exc:  # tried again at the next trigger
            self._log.warning("could not write the query marker under %s: %s",
                              redact_url(self.spool_path), exc)
            return 0  # no marker promised: a restart does not look for one
        return OFFSET_VERSION

    def reportLatestOffset(self) -> Offset | None:
        """For the query's progress (``sources[].latestOffset``): the latest offset with
        the topics, channel, backlog, redeliveries dropped and the flat numbers of
        :mod:`.progress` (see the module doc)."""
        from ._backlog import combine
        from .progress import lag_fields

        if self._latest is None:
            return None
        out: dict[str, Any] = {**self._latest.to_dict(), "channel": self.opts.channel,
                               "redeliveriesDropped": self._dropped}
        topics = list(self._measured or self.opts.topics)
        if self._single_topic is not None:
            out["topic"] = self._single_topic
        else:
            out["backlogByTopic"] = dict(self._measured or {})
            if self.opts.topic_pattern is not None:
                out["topicPattern"] = self.opts.topic_pattern
        out["topics"] = topics
        measured = combine(self._current_measurements())
        total = None
        if measured is not None:
            out["backlog"] = measured.as_progress()
            total = out["backlog"]["fetchable"]
        elif self._measured is not None and not self._measured:
            total = 0  # a pattern that matches no topic: nothing waits
        batch, summary = self._last_summary or (None, None)
        out.update(lag_fields(total, len(measured.paused) if measured else 0,
                              len(measured.unreachable) if measured else 0, batch, summary,
                              self._wall()))
        if self._min_rows:
            out["minMessagesPerTrigger"] = self._min_rows
        return out

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        return self._partitions(BatchOffset.from_json(start), BatchOffset.from_json(end))

    def _partitions(self, start: BatchOffset, end: BatchOffset) -> Sequence[InputPartition]:
        if end.batch <= start.batch:
            return []
        batch, query = end.batch, end.query
        spool = self._spool(query)
        if end.marked:
            self._check_spool_kept(spool, end)
        self._check_batch_kept(spool, end)
        marker = spool.write_marker(batch)
        plans = end.topic_plans(self._single_topic, self.opts.num_partitions,
                                lambda: spool.partition_count(batch))
        tasks = partitions_of(query, batch, plans, marker)
        # after the batch's directory and marker, before any task can FINish into them
        spool.record_started(batch)
        self._ran.add(batch)
        return tasks

    @property
    def _single_topic(self) -> str | None:
        """The topic of a query on one topic (its offsets need no ``plan`` unless bytes
        are capped, and look as before ``plan`` existed); None for several or a pattern."""
        o = self.opts
        return o.topic if o.topic_pattern is None and len(o.topics) == 1 else None

    def _check_spool_kept(self, spool: Any, end: BatchOffset) -> None:
        """The query marker must be there; if not, the spool was deleted. A batch planned
        by this driver owes nothing yet (its tasks have not run): the marker is written
        again, with a warning. A batch from the checkpoint may have FINished its messages
        into the deleted spool: SparkSpoolError, rather than a silent loss."""
        from nsq_spark.errors import SparkSpoolError
        from nsq_spark._validate import redact_url

        if spool.has_query_marker():
            return
        batch = end.batch
        where = redact_url(self.spool_path)
        was = end.spool_changed(where)
        if was is not None:
            raise SparkSpoolError(
                f"option 'spoolPath' changed: micro-batch {batch} of this query was planned "
                f"with spoolPath {was!r} (offset {end.describe()} in the "
                f"checkpoint's offsets log) and the query now has {where!r}, where its "
                f"spool ({spool.query}) is not. That batch's messages were fetched into the "
                f"old spool and FINished on nsqd: restart with .option(\"spoolPath\", "
                f"{was!r}) (or move {was}/{spool.query} to the new place) until the "
                "checkpoint's batches are committed; a new spoolPath for this query needs a "
                "new checkpointLocation")
        if batch in self._planned:
            self._log.warning("the spool of this query under %s was deleted while it ran; the "
                              "redelivery index went with it (a redelivery of a message read "
                              "before may become a second row); batch %d goes on", where, batch)
            spool.write_query_marker()
            return
        raise SparkSpoolError(
            f"the spool of this query ({where}/{spool.query}) was deleted while the query "
            f"was stopped (or option 'spoolPath' names another place than when the batch "
            f"was planned): the checkpoint still owes micro-batch {batch} of this source "
            f"(offset {end.describe()} in the checkpoint's offsets log), "
            "whose messages the fetch tasks had written there and FINished on nsqd, so "
            "they cannot be read again. Restore the spool directory if you have a copy; "
            "otherwise start the query on a new checkpointLocation and accept that "
            "batch's loss (nsqd does not have them any more). Never delete spoolPath "
            "while a query that uses it is stopped with a checkpoint")

    def _check_batch_kept(self, spool: Any, end: BatchOffset) -> None:
        """A batch whose tasks were handed out (its record, :meth:`.Spool.record_started`)
        must still have its directory: else it was deleted after the tasks could have
        FINished messages into it, and running the batch again would fetch new messages
        in their place (:mod:`.spool`, step 8). A SparkSpoolError naming the batch and the
        spool, as for a deleted spool."""
        from nsq_spark.errors import SparkSpoolError
        from nsq_spark._validate import redact_url

        batch = end.batch
        if spool.batch_exists(batch) or not spool.was_started(batch):
            return
        where = redact_url(self.spool_path)
        raise SparkSpoolError(
            f"the spool directory of micro-batch {batch} of this query "
            f"({where}/{spool.query}/batch-{batch:012d}) is gone, but its fetch tasks had "
            f"been handed out (record {redact_url(spool.started_record(batch))}): the "
            "messages they fetched were written there and FINished on nsqd, so they cannot "
            "be read again, and running the batch anew would put new messages in their "
            f"place. The checkpoint still owes that batch (offset "
            f"{end.describe()} in the checkpoint's offsets log). Restore "
            "the batch directory if you have a copy; otherwise start the query on a new "
            "checkpointLocation and accept that batch's loss. Never delete anything under "
            "spoolPath while a query that uses it is stopped with a checkpoint")

    def commit(self, end: Offset) -> None:
        at = BatchOffset.from_json(end)
        spool = self._spool(at.query)
        batch = at.batch
        try:
            deleted = spool.delete_upto(batch)
            self._log.debug("commit %s: deleted the spool of %d batches", end, deleted)
        except Exception as exc:  # the data is safe; stale spool only costs space
            self._log.warning("commit %s: could not delete the spool under %s: %s",
                              end, self.spool_path, exc)
        if self.opts.redelivery_window > 0:
            self._prune_seen(spool, batch)

    def _prune_seen(self, spool: Any, batch: int) -> None:
        from ._seen import SeenIndex

        index = SeenIndex(spool)
        try:
            files = index.files()
            self._dropped += sum(f.dropped for f in files if f.name not in self._counted)
            pruned, remembered = index.prune(batch, self.opts.redelivery_window,
                                             self.opts.redelivery_window_max_ids)
            self._counted = {f.name for f in files}
        except Exception as exc:  # only costs space; the next commit tries again
            self._log.warning("commit %s: could not prune the redelivery index under %s: %s",
                              batch, self.spool_path, exc)
            return
        self._log.info("nsq source %s/%s: batch %d committed; %d ids remembered for "
                       "redeliveries (%d index files pruned), %d redeliveries dropped",
                       self._subscription.describe(), self.opts.channel, batch, remembered, pruned,
                       self._dropped)

    def _tidy(self, query: str, batch: int) -> None:
        if batch <= 0 or self._tidied == (query, batch):
            return
        self._tidied = (query, batch)
        try:
            self._spool(query).tidy(batch)
        except Exception as exc:  # the data is safe; stale spool only costs space
            self._log.warning("could not delete the spool of committed batches under %s: %s",
                              self.spool_path, exc)

    def stop(self) -> None:
        pass

    # -- executors -----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from ._fetch import fetch_stream_partition

        assert isinstance(partition, NSQPartition)
        topic = partition.topic or self.opts.topic
        return task_rows(self.opts.log_level,
                         fetch_stream_partition(self.opts, self._spool(partition.query),
                                                partition.batch, partition.index,
                                                partition.share,
                                                marker=getattr(partition, "marker", None),
                                                topic=topic, max_bytes=partition.max_bytes),
                         topic=topic, channel=self.opts.channel, spark_query=partition.query,
                         spark_batch=partition.batch, spark_partition=partition.index)


class NSQStartlessStreamReader(NSQStreamReader):
    """The stream reader for pyspark 4.0 and 4.1, whose planner calls ``latestOffset()``
    without the start offset (see "pyspark versions" in the module doc).

    The start is the latest offset Spark has shown this reader: ``initialOffset`` (a new
    query), the ``end`` of ``partitions`` and ``commit``, and at a restart the offset log's
    latest entry, which Spark hands over before anything else as
    ``partitions(latest, latest)`` (``AcceptsLatestSeenOffset.setLatestSeenOffset``)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)
        self._seen: Offset | None = None  # as Spark showed it: handed back unchanged
        self._seen_batch = -1

    def _see(self, offset: Offset) -> None:
        batch = BatchOffset.from_json(offset).batch
        if self._seen is None or batch >= self._seen_batch:
            self._seen, self._seen_batch = offset, batch

    def initialOffset(self) -> Offset:
        # after a restart before the first commit, Spark asks for the initial offset
        # again: the same query's batch 0, so that the logged batch 1 is replayed
        if self._seen is not None:
            return BatchOffset.from_json(self._seen).first_of_query().to_dict()
        offset = super().initialOffset()
        self._see(offset)
        return offset

    def latestOffset(self) -> Offset:  # type: ignore[override]
        if self._seen is None:  # a new query: Spark may ask before the initial offset
            self.initialOffset()
        assert self._seen is not None
        return super().latestOffset(self._seen, None)

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        self._see(end)
        return super().partitions(start, end)

    def commit(self, end: Offset) -> None:
        self._see(end)
        super().commit(end)


class NSQBatchReader(DataSourceReader):
    """``spark.read.format("nsq")``: drain up to ``maxMessages`` (or until idle).

    Reading consumes: every message read is FINished and gone from the channel.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = parse_read_options(options, streaming=False)
        configure_logging(self.opts.log_level)
        if self.opts.dedup:
            from ._filters import check_dedup_spec

            check_dedup_spec(self.opts.dedup)

    def partitions(self) -> Sequence[InputPartition]:
        # fail here, on the driver, within seconds, rather than return 0 rows
        subscription = _subscription(self.opts)
        subscription.check_reachable(require_producer=True)
        # maxMessages over the topics (listed once for a pattern) and numPartitions tasks
        plans = plan_topics({t: None for t in subscription.topics()},
                            Limits(max_rows=self.opts.max_messages), self.opts.num_partitions)
        return partitions_of("batch-read", 0, plans)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from ._fetch import fetch_batch_partition

        assert isinstance(partition, NSQPartition) and partition.share
        topic = partition.topic or self.opts.topic
        return task_rows(self.opts.log_level,
                         fetch_batch_partition(self.opts, partition.share, topic=topic),
                         topic=topic, channel=self.opts.channel,
                         spark_partition=partition.index)


class _PublishCommitMessage(WriterCommitMessage):
    def __init__(self, messages: int, deferred: int, mpubs: int) -> None:
        self.messages = messages
        self.deferred = deferred
        self.mpubs = mpubs


def _publish(options: Any, iterator: Iterator[Any], write_id: str | None
             ) -> _PublishCommitMessage:
    from .sink import publish_batches, task_scope

    opts = parse_write_options(options)
    configure_logging(opts.log_level)
    c = publish_batches(opts, iterator, scope=task_scope(write_id))
    return _PublishCommitMessage(c.messages, c.deferred, c.mpubs)


class NSQWriter(DataSourceArrowWriter):
    """``df.write.format("nsq")``: publish the ``body`` column (see :mod:`.sink`)."""

    # a writer pickled before write ids existed reads this from the class
    write_id: str | None = None

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        # fail at job start on bad options
        configure_logging(parse_write_options(self.options).log_level)
        # names this write's rows when no micro-batch does (.sink.WriteScope): drawn
        # once on the driver, so a retried task publishes the same publish ids again
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> _PublishCommitMessage:
        return _publish(self.options, iterator, self.write_id)

    def commit(self, messages: list[Any]) -> None:
        total = sum(m.messages for m in messages if m is not None)
        log.info("nsq sink: published %d messages", total)


class NSQStreamWriter(StreamArrowWriterBase):
    """``df.writeStream.format("nsq")``: publish each micro-batch (at-least-once; with
    ``publishIds`` a re-run batch republishes the same publish ids: :mod:`.sink`)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        configure_logging(parse_write_options(self.options).log_level)

    def write(self, iterator: Iterator[Any]) -> _PublishCommitMessage:
        # the micro-batch names the rows (the tasks' local properties): no write id
        return _publish(self.options, iterator, None)

    def commit(self, messages: list[Any], batchId: int) -> None:
        total = sum(m.messages for m in messages if m is not None)
        log.info("nsq sink: batch %d published %d messages", batchId, total)

    def abort(self, messages: list[Any], batchId: int) -> None:
        log.warning("nsq sink: batch %d aborted; messages already published stay published "
                    "and the batch is published again when Spark retries it", batchId)
