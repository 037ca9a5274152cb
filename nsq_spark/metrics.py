"""Prometheus metrics for Readers, Producers and the Spark source
(``pip install 'nsq-spark[prometheus]'``).

A custom collector: nothing is counted twice and nothing runs on the hot path. At each
scrape it calls ``stats()`` of every watched Reader, Producer and
:class:`~nsq_spark.spark.listener.SparkSourceMetrics` and turns the dicts into metric
families. So the figures are exactly those of ``stats()``, and a key that a
``stats()`` dict does not have is simply not exported (a Producer's ``messages``,
``bytes``, ``retries``, ``errors`` appear once ``Producer.stats()`` reports them)::

    from nsq_spark.metrics import NSQCollector, serve

    collector = NSQCollector().register()        # into prometheus_client's default REGISTRY
    collector.watch(reader)                      # labelled reader=<reader.name>
    collector.watch(producer, name="orders")     # labelled producer="orders"
    server = serve(9100)                         # http://127.0.0.1:9100/metrics

Metric names (counters get prometheus' ``_total`` suffix in the exposition):

Reader, labels ``reader``, ``topic``, ``channel``:
  ``nsq_reader_messages_received_total``, ``nsq_reader_messages_finished_total``,
  ``nsq_reader_messages_requeued_total``, ``nsq_reader_messages_given_up_total``,
  ``nsq_reader_duplicates_total``, ``nsq_reader_in_flight``, ``nsq_reader_max_in_flight``,
  ``nsq_reader_rdy``, ``nsq_reader_backoff_level``, ``nsq_reader_connections`` (those
  connecting included), ``nsq_reader_connections_subscribed``,
  ``nsq_reader_lookupd_polls_total``; per connection (label ``nsqd`` too):
  ``nsq_reader_connection_messages_received_total``, ``nsq_reader_connection_in_flight``,
  ``nsq_reader_connection_rdy``.
Producer, label ``producer``:
  ``nsq_producer_messages_total``, ``nsq_producer_bytes_total``,
  ``nsq_producer_retries_total``, ``nsq_producer_errors_total`` (when ``stats()`` has
  them), ``nsq_producer_commands_total`` (acknowledged PUB/MPUB/DPUB/HTTP requests),
  ``nsq_producer_nsqd_up`` (label ``nsqd``: 1 connected, 0 down), and when ``stats()``
  has them per nsqd ``nsq_producer_nsqd_messages_total``, ``nsq_producer_nsqd_bytes_total``
  (label ``nsqd``); with a spool also
  ``nsq_producer_spool_appended_total``, ``nsq_producer_spool_acked_total``,
  ``nsq_producer_spool_rejected_total``, ``nsq_producer_spool_pending_bytes``.
Spark source (a watched ``SparkSourceMetrics``, fed per batch by
:class:`~nsq_spark.spark.listener.NSQSourceListener`), labels ``query``, ``topic``,
``channel``: gauges ``nsq_spark_source_backlog_messages``,
``nsq_spark_source_lag_seconds``, ``nsq_spark_source_last_batch_oldest_age_seconds``,
``nsq_spark_source_paused_nsqds``, ``nsq_spark_source_unreachable_nsqds``,
``nsq_spark_source_last_batch``, ``nsq_spark_source_last_progress_timestamp_seconds``;
counters ``nsq_spark_source_batches_total``, ``nsq_spark_source_rows_total``,
``nsq_spark_source_bytes_total``, ``nsq_spark_source_redeliveries_dropped_total``,
``nsq_spark_source_dead_lettered_total``.

The collector holds weak references: a Reader or Producer that is garbage-collected
stops being exported; ``unwatch()`` stops it at once. A ``stats()`` that raises is logged
and skipped for that scrape (the others are still exported).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Protocol, Sequence
from ._log import get_logger

try:
    from prometheus_client import start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import REGISTRY, CollectorRegistry
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("nsq_spark.metrics needs the prometheus-client library: "
                      "pip install 'nsq-spark[prometheus]'") from exc

log = get_logger(__name__)

__all__ = ["MetricsServer", "NSQCollector", "Watchable", "serve"]


class Watchable(Protocol):
    """What the collector reads: a Reader, a Producer (any kind), a Writer, a
    ``SparkSourceMetrics`` -- anything whose ``stats()`` is one of their dicts."""

    def stats(self) -> Mapping[str, Any]: ...

# stats() key -> (metric name, help); counters
_READER_COUNTERS = {
    "messages_received": ("nsq_reader_messages_received", "Messages delivered by nsqd."),
    "finished": ("nsq_reader_messages_finished", "Messages finished (FIN)."),
    "requeued": ("nsq_reader_messages_requeued", "Messages requeued (REQ)."),
    "given_up": ("nsq_reader_messages_given_up",
                 "Hand-overs to giving_up() (a message the hook requeues counts again)."),
    "duplicates": ("nsq_reader_duplicates", "Duplicates finished unseen by the dedup store."),
    "held": ("nsq_reader_dedup_held",
             "Copies requeued while another consumer held a live dedup claim on them."),
}
_READER_GAUGES = {
    "in_flight": ("nsq_reader_in_flight", "Messages delivered and not yet answered."),
    "max_in_flight": ("nsq_reader_max_in_flight", "The max_in_flight setting."),
    "total_rdy": ("nsq_reader_rdy", "RDY counts sent, summed over connections."),
}
# stats() keys, the first present wins -> (metric name, help); counters
_PRODUCER_COUNTERS = {
    ("messages",): ("nsq_producer_messages", "Messages acknowledged by nsqd."),
    ("bytes",): ("nsq_producer_bytes", "Body bytes of the messages acknowledged by nsqd."),
    ("retries",): ("nsq_producer_retries",
                   "Publish attempts retried after a transient failure."),
    ("errors",): ("nsq_producer_errors", "Publishes that failed for good."),
    ("commands", "published"): (
        "nsq_producer_commands",
        "Commands acknowledged by nsqd (a PUB, an MPUB, an HTTP request: 1 each)."),
}
# SourceTotals field -> (metric name, help), labels query/topic/channel
_SOURCE_GAUGES = {
    "backlog_messages": ("nsq_spark_source_backlog_messages",
                         "Messages waiting on the channel (fetchable), at the last trigger."),
    "lag_seconds": ("nsq_spark_source_lag_seconds",
                    "Age of the newest message read while a backlog waits; 0: caught up."),
    "last_batch_oldest_age_seconds": ("nsq_spark_source_last_batch_oldest_age_seconds",
                                      "Age of the oldest message of the last batch."),
    "paused_nsqds": ("nsq_spark_source_paused_nsqds",
                     "nsqds where the topic or the channel is paused."),
    "unreachable_nsqds": ("nsq_spark_source_unreachable_nsqds",
                          "Known nsqds that did not answer the backlog poll."),
    "last_batch": ("nsq_spark_source_last_batch", "The source's latest batch that ran."),
    "updated_at": ("nsq_spark_source_last_progress_timestamp_seconds",
                   "Unix time of the query's latest progress or idle event."),
}
_SOURCE_COUNTERS = {
    "batches": ("nsq_spark_source_batches", "Micro-batches that ran."),
    "rows": ("nsq_spark_source_rows", "Rows the batches read (fetched and spooled)."),
    "bytes": ("nsq_spark_source_bytes", "Message body bytes the batches read."),
    "redeliveries_dropped": ("nsq_spark_source_redeliveries_dropped",
                             "Redeliveries of already spooled messages dropped."),
    "dead_lettered": ("nsq_spark_source_dead_lettered",
                      "Messages over maxAttempts written to deadLetterPath."),
}
_SPOOL_COUNTERS = {
    "appended": ("nsq_producer_spool_appended", "Messages written to the spool."),
    "acked": ("nsq_producer_spool_acked", "Spooled messages acknowledged by nsqd."),
    "rejected": ("nsq_producer_spool_rejected", "Spooled messages nsqd refused for good."),
}


class NSQCollector:
    """A prometheus_client collector over the ``stats()`` of Readers and Producers."""

    def __init__(self, watched: Iterable[Watchable] = ()) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[weakref.ref[Any], str | None]] = {}
        for obj in watched:
            self.watch(obj)

    def register(self, registry: CollectorRegistry = REGISTRY) -> "NSQCollector":
        """Register with ``registry`` (default: prometheus_client's global one); returns
        self, so ``NSQCollector().register()`` reads as one step."""
        registry.register(self)
        return self

    def watch(self, obj: Watchable, name: str | None = None) -> None:
        """Export ``obj`` (a Reader, Producer, SpoolingProducer, Writer or
        ``SparkSourceMetrics``), labelled ``name`` (default: a Reader's ``name``; for a
        producer ``"producer"``, so give each of several producers its own name; a Spark
        source is labelled by its query instead)."""
        if not callable(getattr(obj, "stats", None)):
            raise TypeError(f"watch(obj): {type(obj).__name__} has no stats(); pass a "
                            "nsq_spark Reader or Producer")
        key = id(obj)
        with self._lock:
            self._watched[key] = (weakref.ref(obj, lambda _r: self._forget(key)), name)

    def unwatch(self, obj: Any) -> None:
        """Stop exporting ``obj``."""
        self._forget(id(obj))

    def _forget(self, key: int) -> None:
        with self._lock:
            self._watched.pop(key, None)

    def describe(self) -> list[Metric]:
        # no up-front description: the families depend on what is watched at scrape time
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            watched = [(ref(), name) for ref, name in self._watched.values()]
        readers: list[tuple[str, dict[str, Any]]] = []
        producers: list[tuple[str, dict[str, Any]]] = []
        sources: list[dict[str, Any]] = []
        for obj, name in watched:
            if obj is None:
                continue
            try:
                stats = obj.stats()
            except Exception as exc:  # noqa: BLE001 - one bad object must not hide the rest
                # the text, not the exception: its traceback would keep this frame, and
                # with it every watched object, alive in the log record
                log.warning("metrics: %s.stats() failed, skipped in this scrape: %s",
                            type(obj).__name__, str(exc))
                continue
            if isinstance(stats.get("spark_sources"), list):
                sources.extend(s for s in stats["spark_sources"] if isinstance(s, dict))
            elif "channel" in stats and "connections" in stats:
                readers.append((name or str(stats.get("name") or ""), stats))
            else:
                producers.append((name or "producer", stats))
        yield from _reader_families(readers)
        yield from _producer_families(producers)
        yield from _source_families(sources)


# a table: stats() key -> (metric name, help); with the family kind it is exported as
_Tables = tuple[tuple[type[CounterMetricFamily] | type[GaugeMetricFamily],
                      dict[str, tuple[str, str]]], ...]


def _table_families(rows: Sequence[tuple[list[str], Mapping[str, Any]]],
                    labels: list[str], tables: _Tables) -> Iterator[Metric]:
    """One family per table entry that some row's stats has as a number (a bool is not
    one: it would export as 0/1), with one sample per such row, labelled by its
    label values."""
    for family, table in tables:
        for key, (metric, doc) in table.items():
            present = [(values, stats[key]) for values, stats in rows
                       if isinstance(stats.get(key), (int, float))
                       and not isinstance(stats.get(key), bool)]
            if present:
                out = family(metric, doc, labels=labels)
                for values, number in present:
                    out.add_metric(values, number)
                yield out


def _source_families(sources: list[dict[str, Any]]) -> Iterator[Metric]:
    rows = [([str(s.get("query", "")), str(s.get("topic", "")), str(s.get("channel", ""))],
             s) for s in sources]
    yield from _table_families(rows, ["query", "topic", "channel"],
                               ((GaugeMetricFamily, _SOURCE_GAUGES),
                                (CounterMetricFamily, _SOURCE_COUNTERS)))


@dataclass
class MetricsServer:
    """The HTTP server :func:`serve` started: ``url`` of its ``/metrics``; ``close()``
    stops it (it also stops with the process: its thread is a daemon)."""

    host: str
    port: int
    _server: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(port: int = 9100, addr: str = "127.0.0.1",
          registry: CollectorRegistry = REGISTRY) -> MetricsServer:
    """Serve ``registry`` (default: prometheus_client's global one) for Prometheus to
    scrape at ``http://<addr>:<port>/metrics``, from a daemon thread.

    port: TCP port, 0 to 65535, default 9100 (Prometheus' node exporter's; pick a free
        one); 0 takes any free port (read it back from ``.port``).
    addr: the address to listen on, default ``"127.0.0.1"``: loopback only, unlike
        ``prometheus_client.start_http_server``'s all-interfaces default; pass
        ``"0.0.0.0"`` (or the host's address) for a Prometheus on another machine.

    Raises ValueError for a port out of range, OSError when the port is taken.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"serve(port={port!r}): the port must be an int from 0 to 65535 "
                         "(0: any free port)")
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(addr, int(server.server_address[1]), server, thread)


def _reader_families(readers: list[tuple[str, dict[str, Any]]]) -> Iterator[Metric]:
    labels = ["reader", "topic", "channel"]

    def values(stats: dict[str, Any], name: str) -> list[str]:
        return [name, str(stats.get("topic", "")), str(stats.get("channel", ""))]

    yield from _table_families([(values(s, n), s) for n, s in readers], labels,
                               ((CounterMetricFamily, _READER_COUNTERS),
                                (GaugeMetricFamily, _READER_GAUGES)))
    if not readers:
        return
    backoff = GaugeMetricFamily("nsq_reader_backoff_level",
                                "Backoff level (0: not backing off).", labels=labels)
    conns = GaugeMetricFamily("nsq_reader_connections",
                              "Connections to nsqd, those still connecting included.",
                              labels=labels)
    subscribed = GaugeMetricFamily(
        "nsq_reader_connections_subscribed",
        "Connections to nsqd subscribed to the channel (can receive messages).",
        labels=labels)
    polls = CounterMetricFamily("nsq_reader_lookupd_polls", "nsqlookupd polls.", labels=labels)
    conn_labels = [*labels, "nsqd"]
    conn_msgs = CounterMetricFamily("nsq_reader_connection_messages_received",
                                    "Messages delivered on one connection.", labels=conn_labels)
    conn_in_flight = GaugeMetricFamily("nsq_reader_connection_in_flight",
                                       "In flight on one connection.", labels=conn_labels)
    conn_rdy = GaugeMetricFamily("nsq_reader_connection_rdy", "RDY of one connection.",
                                 labels=conn_labels)
    any_polls = False
    for n, s in readers:
        v = values(s, n)
        level = (s.get("backoff") or {}).get("level", 0)
        backoff.add_metric(v, level if isinstance(level, (int, float)) else 0)
        connections = s.get("connections") or {}
        conns.add_metric(v, len(connections))
        subscribed.add_metric(v, sum(1 for c in connections.values()
                                     if isinstance(c, dict) and c.get("state") == "subscribed"))
        if isinstance(s.get("lookupd"), dict):
            polls.add_metric(v, s["lookupd"].get("polls", 0))
            any_polls = True
        for address, c in connections.items():
            cv = [*v, str(address)]
            conn_msgs.add_metric(cv, c.get("messages", 0))
            conn_in_flight.add_metric(cv, c.get("in_flight", 0))
            conn_rdy.add_metric(cv, c.get("rdy", 0))
    yield backoff
    yield conns
    yield subscribed
    if any_polls:
        yield polls
    yield conn_msgs
    yield conn_in_flight
    yield conn_rdy


def _producer_families(producers: list[tuple[str, dict[str, Any]]]) -> Iterator[Metric]:
    # A spooling producer's stats() nests its inner Producer's under "producer": a key is
    # taken from the outer dict when it is there (what the spool drained), else the inner.
    merged: list[tuple[str, dict[str, Any]]] = []
    for name, stats in producers:
        inner = stats.get("producer")
        merged.append((name, {**inner, **stats} if isinstance(inner, dict) else stats))
    for keys, (metric, doc) in _PRODUCER_COUNTERS.items():
        rows = [(n, _first_int(s, keys)) for n, s in merged]
        present = [(n, v) for n, v in rows if v is not None]
        if present:
            counter = CounterMetricFamily(metric, doc, labels=["producer"])
            for n, v in present:
                counter.add_metric([n], v)
            yield counter
    up = GaugeMetricFamily("nsq_producer_nsqd_up", "1: connected to this nsqd; 0: down.",
                           labels=["producer", "nsqd"])
    per_messages = CounterMetricFamily("nsq_producer_nsqd_messages",
                                       "Messages acknowledged by this nsqd.",
                                       labels=["producer", "nsqd"])
    per_bytes = CounterMetricFamily("nsq_producer_nsqd_bytes",
                                    "Body bytes acknowledged by this nsqd.",
                                    labels=["producer", "nsqd"])
    for n, s in merged:
        per_nsqd = s.get("nsqd")
        if isinstance(per_nsqd, dict):   # {address: {"up", "messages", "bytes", ...}}
            for address, d in per_nsqd.items():
                if not isinstance(d, dict):
                    continue
                if isinstance(d.get("up"), bool):   # None: not tried yet
                    up.add_metric([n, str(address)], int(d["up"]))
                if isinstance(d.get("messages"), int):
                    per_messages.add_metric([n, str(address)], d["messages"])
                if isinstance(d.get("bytes"), int):
                    per_bytes.add_metric([n, str(address)], d["bytes"])
        else:                            # {"connected": [...], "down": {address: error}}
            for address in s.get("connected") or ():
                up.add_metric([n, str(address)], 1)
            for address in s.get("down") or {}:
                up.add_metric([n, str(address)], 0)
    for family in (up, per_messages, per_bytes):
        if family.samples:
            yield family
    for key, (metric, doc) in _SPOOL_COUNTERS.items():
        present = [(n, s[key]) for n, s in producers if isinstance(s.get(key), int)]
        if present:
            counter = CounterMetricFamily(metric, doc, labels=["producer"])
            for n, v in present:
                counter.add_metric([n], v)
            yield counter
    pending = [(n, s["pending_bytes"]) for n, s in producers
               if isinstance(s.get("pending_bytes"), int)]
    if pending:
        gauge = GaugeMetricFamily("nsq_producer_spool_pending_bytes",
                                  "Spooled bytes nsqd has not acknowledged yet.",
                                  labels=["producer"])
        for n, v in pending:
            gauge.add_metric([n], v)
        yield gauge


def _first_int(stats: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = stats.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
