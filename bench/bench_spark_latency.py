"""Publish-to-row latency and per-batch cost of the ``nsq`` source on a standalone cluster.

The benchmark starts everything it measures and stops it by pid at the end: one nsqd, a
Spark standalone master with ``--workers`` workers of one core and 1 GiB each (started
from the installed pyspark's ``spark-class`` with the cluster tier's helpers,
``tests/cluster/test_standalone.py``), and a driver in this process whose application
takes one 1-core executor per worker. The library under test is the one this process
imports (``PYTHONPATH``); the executors are given the same tree and the run stops if they
import ``nsq_spark`` from anywhere else.

Per configuration (a source, a rate, a trigger), one streaming query:

* ``nsq``: a publisher thread publishes ``rate`` messages per second at a fixed pace
  (message ``i`` is due ``i / rate`` s after the start; what is due is sent in one HTTP
  ``/mpub`` on a kept-alive connection, so 20,000/s is about 100 requests per second)
  with its sequence number and publish time (``time.time()``) in the body; the query
  reads it with ``numPartitions`` fetch tasks and the spool on a local disk, otherwise the
  source's defaults (``--option key=value`` adds or overrides options).
* ``rate`` (``--with-rate-source``): Spark's own ``rate`` source, same rate, partitions
  and trigger: the per-batch cost of a source that does no IO, the baseline.
* ``pyrate`` (``--with-python-floor``): the same as a Python data source
  (``bench/pyrate_source.py``, registered in the driver, imported by the executors from
  the checkout): rows generated at the same rate from the query's start, stamped with
  their generation time, read at once with no IO, returned as one Arrow record batch per
  task as nsq's fetch tasks return theirs. Its per-batch cost is that of Spark's Python
  data source machinery (the driver's Python runner planning, a Python worker per task,
  Arrow transfer): the floor under any Python source. Its offset counts rows, not whole
  seconds as ``rate``'s does, so a trigger finds every row generated until then.

A ``foreachBatch`` sink collects each batch (``toArrow``) and stamps its rows with the
time the collect returned: the rows' arrival. The first ``--warmup`` seconds are not
measured; then ``--seconds`` of publishing are. Before the first configuration, one
unmeasured nsq query (``--session-warmup`` s) starts the executors' Python workers and
imports the library there. Figures per configuration:

* published and received counts over the whole query (warm-up included; the publisher
  stops, the query runs until everything arrived or ``--drain-timeout``), duplicates
  (a sequence number twice) and missing ones: an exactly-once check, not a sample;
* publish-to-row latency p50 / p99 of the messages published in the window (for
  ``rate`` and ``pyrate``: the row's ``timestamp``, when the source says it was
  generated, to arrival);
* the mean ``triggerExecution``, ``addBatch`` and ``latestOffset`` durations and rows of
  the batches that started in the window (from the query progress), and batches/s.

With the rate source, the per-batch overhead of nsq over rate is stated per trigger: the
difference of mean ``triggerExecution`` of nsq and of rate at the same rate (the lowest
nsq rate measured, 20/s by default: tiny batches, so the difference is fixed cost).
With ``pyrate``, so are the overhead of nsq over it (what nsq costs beyond any Python
source) and of pyrate over rate (what the Python machinery costs beyond a JVM source).

Run from a checkout (the lock: one JVM-heavy job at a time on the machine)::

    flock /tmp/nsq-spark-heavy.lock python -m bench.bench_spark_latency \\
        --rates 20,2000,20000 --triggers 1s,default --seconds 20 --with-rate-source \\
        --with-python-floor

Before and after, interleaved in one run (the before revision need not have this file:
``bench/ab.py`` runs this checkout's copy of it against the before tree's library)::

    flock /tmp/nsq-spark-heavy.lock python -m bench.ab --before b891415 --rounds 1 \\
        bench_spark_latency --rates 20,2000,20000 --with-rate-source

(``--with-python-floor`` there needs ``bench/pyrate_source.py`` in the before tree: it is
imported from the tree the benchmark runs in, like the cluster helpers.)

The exit status is 1 if any configuration lost or duplicated a message.
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import http.client
import importlib
import json
import math
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

HERE = Path(__file__).resolve().parent

# ---------------------------------------------------------------------------------------
# Pure parts: arguments, bodies, statistics (tests/test_bench_smoke.py, no sockets)
# ---------------------------------------------------------------------------------------

_TRIGGER = re.compile(r"^(\d+(?:\.\d+)?)(ms|s)$")


@dataclass(frozen=True)
class Trigger:
    """A trigger as given on the command line: ``default`` (as fast as batches end) or
    an interval (``1s``, ``500ms``), which becomes ``processingTime``."""

    label: str
    processing_time: str | None  # Spark's processingTime string; None: default trigger


def parse_triggers(text: str) -> list[Trigger]:
    out = []
    for item in (t.strip() for t in text.split(",")):
        if item == "default":
            out.append(Trigger("default", None))
            continue
        m = _TRIGGER.match(item)
        if not m or float(m.group(1)) <= 0:
            raise ValueError(f"trigger {item!r}: give 'default' or an interval such as "
                             "'1s' or '500ms'")
        ms = float(m.group(1)) * (1000 if m.group(2) == "s" else 1)
        out.append(Trigger(item, f"{ms:g} milliseconds"))
    if not out or len({t.label for t in out}) != len(out):
        raise ValueError(f"triggers {text!r}: give each trigger once, e.g. '1s,default'")
    return out


def parse_rates(text: str) -> list[int]:
    try:
        rates = [int(r) for r in text.split(",")]
    except ValueError:
        raise ValueError(f"rates {text!r}: give whole messages per second, comma-separated, "
                         "e.g. '20,2000,20000'") from None
    if not rates or any(r < 1 or r > 200_000 for r in rates) or len(set(rates)) != len(rates):
        raise ValueError(f"rates {text!r}: each rate once, between 1 and 200000 msg/s")
    return rates


def parse_source_options(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--option {item!r}: give key=value, e.g. maxInFlight=5000")
        out[key] = value
    return out


def make_body(seq: int, published_at: float, size: int) -> bytes:
    """``<seq> <publish time> `` padded to ``size`` bytes (at least the two numbers)."""
    head = b"%d %.6f " % (seq, published_at)
    return head + b"x" * (size - len(head))


def parse_body(body: bytes) -> tuple[int, float]:
    seq, published_at, _ = body.split(b" ", 2)
    return int(seq), float(published_at)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of values sorted ascending."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass
class Arrivals:
    """What the sink received: per row, its sequence number, when it was published (or
    generated) and when its batch's collect returned. Sink calls run one at a time."""

    seqs: list[int] = field(default_factory=list)
    published: list[float] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)

    def add(self, rows: Sequence[tuple[int, float]], arrived_at: float) -> None:
        for seq, published_at in rows:
            self.seqs.append(seq)
            self.published.append(published_at)
            self.arrived.append(arrived_at)

    def __len__(self) -> int:
        return len(self.seqs)


@dataclass(frozen=True)
class BatchTiming:
    """One executed micro-batch from the query progress."""

    started: float  # epoch seconds (the progress's ``timestamp``)
    rows: int
    durations_ms: dict[str, float]


def batch_timings(progresses: Sequence[dict[str, Any]]) -> list[BatchTiming]:
    """The progresses of triggers that ran a batch (``addBatch`` timed); idle triggers
    report no ``addBatch``."""
    out = []
    for p in progresses:
        durations = p.get("durationMs") or {}
        if "addBatch" not in durations:
            continue
        started = datetime.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00"))
        out.append(BatchTiming(started.timestamp(), int(p.get("numInputRows") or 0),
                               {k: float(v) for k, v in durations.items()}))
    return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(arrivals: Arrivals, published: int, batches: Sequence[BatchTiming],
              window: tuple[float, float]) -> dict[str, Any]:
    """The figures of one configuration. ``published``: messages sent with sequence
    numbers ``0 .. published-1``; ``window``: (start, end) epoch seconds measured."""
    start, end = window
    counts: dict[int, int] = {}
    for s in arrivals.seqs:
        counts[s] = counts.get(s, 0) + 1
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    missing = sum(1 for s in range(published) if s not in counts)
    unexpected = sum(1 for s in counts if not 0 <= s < published)
    in_window = [(p, a - p) for p, a in zip(arrivals.published, arrivals.arrived)
                 if start <= p < end]
    latencies = sorted(latency for _, latency in in_window)
    # p99 per 5 s of publishing: one stall shows as one slice, a steady cost in all
    slices: list[list[float]] = [[] for _ in range(max(1, math.ceil((end - start) / 5)))]
    for p, latency in in_window:
        slices[min(len(slices) - 1, int((p - start) // 5))].append(latency)
    measured = [b for b in batches if start <= b.started < end]
    seconds = end - start
    return {
        "published": published,
        "received": len(arrivals),
        "duplicates": duplicates,
        "missing": missing,
        "unexpected": unexpected,
        "exactly_once": duplicates == 0 and missing == 0 and unexpected == 0,
        "measured_rows": len(latencies),
        "latency_p50_s": round(percentile(latencies, 50), 3),
        "latency_p99_s": round(percentile(latencies, 99), 3),
        "latency_max_s": round(latencies[-1], 3) if latencies else math.nan,
        "latency_p99_per_5s": [round(percentile(sorted(part), 99), 3) for part in slices],
        "batches": len(measured),
        "batches_per_s": round(len(measured) / seconds, 2) if seconds > 0 else math.nan,
        "rows_per_batch": round(_mean([b.rows for b in measured]), 1),
        "triggerExecution_max_ms": max((b.durations_ms.get("triggerExecution", 0.0)
                                        for b in measured), default=math.nan),
        **{f"{key}_ms": round(_mean([b.durations_ms.get(key, 0.0) for b in measured]), 1)
           for key in ("triggerExecution", "addBatch", "latestOffset", "queryPlanning",
                       "walCommit", "commitOffsets")},
    }


def overheads(results: Sequence[dict[str, Any]], over: str = "nsq",
              base: str = "rate") -> list[dict[str, Any]]:
    """Per trigger with a ``base`` run: mean triggerExecution of ``over`` at the same rate
    as the base's (else ``over``'s lowest) minus the base's; the same for addBatch. Keys
    named after the sources: ``nsq_rate``, ``rate_triggerExecution_ms``, ..."""
    out = []
    for b in (r for r in results if r["source"] == base):
        same = [r for r in results if r["source"] == over and r["trigger"] == b["trigger"]]
        if not same:
            continue
        o = min(same, key=lambda r: (r["rate"] != b["rate"], r["rate"]))
        out.append({"trigger": b["trigger"], "over": over, "base": base,
                    f"{over}_rate": o["rate"], f"{base}_rate": b["rate"],
                    f"{over}_triggerExecution_ms": o["triggerExecution_ms"],
                    f"{base}_triggerExecution_ms": b["triggerExecution_ms"],
                    "overhead_ms": round(o["triggerExecution_ms"]
                                         - b["triggerExecution_ms"], 1),
                    "addBatch_overhead_ms": round(o["addBatch_ms"] - b["addBatch_ms"], 1)})
    return out


# (over, base, what the difference is) of the overhead lines, in the order printed
OVERHEADS = (("nsq", "rate", "per-batch overhead of nsq over rate"),
             ("nsq", "pyrate", "per-batch overhead of nsq over a Python source (pyrate)"),
             ("pyrate", "rate", "per-batch overhead of a Python source (pyrate) over rate"))


def all_overheads(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for over, base, _ in OVERHEADS for o in overheads(results, over, base)]


def overhead_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    """The overhead statements, one per (over, base) pair and trigger measured."""
    lines = []
    for over, base, what in OVERHEADS:
        for o in overheads(results, over, base):
            lines.append(
                f"{what}, trigger {o['trigger']}: {o['overhead_ms']:.0f} ms (mean "
                f"triggerExecution: {over} {o[f'{over}_rate']}/s "
                f"{o[f'{over}_triggerExecution_ms']:.0f} ms - {base} {o[f'{base}_rate']}/s "
                f"{o[f'{base}_triggerExecution_ms']:.0f} ms; addBatch "
                f"{o['addBatch_overhead_ms']:+.0f} ms)")
    return lines


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    lines = ["| source, rate, trigger | published / received | duplicates / missing "
             "| p50 s | p99 s | triggerExecution ms (max) | addBatch ms | latestOffset ms "
             "| batches/s | rows/batch |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r['source']} {r['rate']:,}/s, {r['trigger']} | {r['published']:,} / "
            f"{r['received']:,} | {r['duplicates']} / {r['missing']} "
            f"| {r['latency_p50_s']:.3f} | {r['latency_p99_s']:.3f} "
            f"| {r['triggerExecution_ms']:.0f} ({r['triggerExecution_max_ms']:.0f}) "
            f"| {r['addBatch_ms']:.0f} "
            f"| {r['latestOffset_ms']:.0f} | {r['batches_per_s']:.2f} "
            f"| {r['rows_per_batch']:.0f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# IO: the publisher, the cluster, the queries
# ---------------------------------------------------------------------------------------

class PacedPublisher(threading.Thread):
    """Publishes ``rate`` messages per second to ``topic`` until stopped: message ``i``
    is due ``i / rate`` s after the start; everything due is sent in one binary ``/mpub``
    over one kept-alive HTTP connection (at most ``max_per_request`` per request).
    ``sent`` counts the messages nsqd acknowledged; an error stops the thread and is kept
    in ``error``."""

    def __init__(self, http_address: str, topic: str, rate: int, size: int,
                 max_per_request: int = 5000) -> None:
        super().__init__(name=f"publisher-{topic}", daemon=True)
        self.host, _, port = http_address.rpartition(":")
        self.port = int(port)
        self.topic, self.rate, self.size = topic, rate, size
        self.max_per_request = max_per_request
        self.sent = 0
        self.started_at = math.nan  # epoch seconds, set when the first message is due
        self.stopped_at = math.nan
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            t0 = time.monotonic()
            self.started_at = time.time()
            while not self._stop_event.is_set():
                due = min(int((time.monotonic() - t0) * self.rate) + 1,
                          self.sent + self.max_per_request)
                if due <= self.sent:
                    wait = t0 + self.sent / self.rate - time.monotonic()
                    self._stop_event.wait(min(max(wait, 0.0005), 0.05))
                    continue
                now = time.time()
                bodies = [make_body(s, now, self.size) for s in range(self.sent, due)]
                data = len(bodies).to_bytes(4, "big") + b"".join(
                    len(b).to_bytes(4, "big") + b for b in bodies)
                conn.request("POST", f"/mpub?topic={self.topic}&binary=true", body=data)
                resp = conn.getresponse()
                answer = resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"nsqd /mpub answered {resp.status}: {answer[:200]!r}")
                self.sent = due
        except BaseException as exc:  # reported by the caller, which checks error
            self.error = exc
        finally:
            self.stopped_at = time.time()
            conn.close()


def _cluster_helpers() -> Any:
    """The cluster tier's process helpers (``Procs``: started processes, stopped by pid
    with the executors under each worker first; ``_wait_http``), from the checkout this
    file is in."""
    sys.path.insert(0, str(HERE.parent / "tests" / "cluster"))
    import test_standalone

    return test_standalone


class StandaloneSpark:
    """A master and ``workers`` workers of one core and 1 GiB each on 127.0.0.1, and a
    SparkSession of this process on them (one 1-core executor per worker). Context
    manager: everything is stopped at exit, the session first, then the processes by
    pid."""

    def __init__(self, workdir: Path, workers: int, library_root: str) -> None:
        self.workdir, self.workers, self.library_root = workdir, workers, library_root
        self.helpers = _cluster_helpers()
        workdir.mkdir(parents=True, exist_ok=True)
        self.procs = self.helpers.Procs(workdir)
        self.spark: Any = None

    def __enter__(self) -> "StandaloneSpark":
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        import pyspark

        from nsq_spark.testing import free_port

        spark_home = os.path.dirname(pyspark.__file__)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
        env.update(SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_LOG_DIR=str(self.workdir), SPARK_WORKER_DIR=str(self.workdir / "work"),
                   PYTHONPATH=self.library_root)
        spark_class = os.path.join(spark_home, "bin", "spark-class")
        port, ui = free_port(), free_port()
        self.procs.start("master", [spark_class, "org.apache.spark.deploy.master.Master",
                                    "--host", "127.0.0.1", "--port", str(port),
                                    "--webui-port", str(ui)], env)
        master = f"spark://127.0.0.1:{port}"
        for i in range(self.workers):
            self.procs.start(f"worker{i}", [
                spark_class, "org.apache.spark.deploy.worker.Worker", master,
                "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                "--webui-port", str(free_port()), "--work-dir", str(self.workdir / f"work{i}")],
                env)
        self.helpers._wait_http(f"http://127.0.0.1:{ui}/json/", 90,
                                lambda b: json.loads(b).get("aliveworkers", 0) >= self.workers)
        os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors' Python
        os.environ["PYTHONPATH"] = self.library_root  # the driver's Python workers
        from pyspark.sql import SparkSession

        self.spark = (SparkSession.builder.master(master).appName("bench-spark-latency")
                      .config("spark.ui.enabled", "false")
                      .config("spark.ui.showConsoleProgress", "false")
                      .config("spark.driver.host", "127.0.0.1")
                      .config("spark.driver.bindAddress", "127.0.0.1")
                      .config("spark.driver.memory", "1g")
                      .config("spark.executor.memory", "512m")
                      .config("spark.executor.cores", "1")
                      .config("spark.cores.max", str(self.workers))
                      .config("spark.sql.shuffle.partitions", "2")
                      .config("spark.executorEnv.PYTHONPATH", self.library_root)
                      # every batch's progress is kept, not Spark's last 100
                      .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
                      .getOrCreate())
        self.spark.sparkContext.setLogLevel("ERROR")

    def __exit__(self, *exc: object) -> None:
        if self.spark is not None:
            try:
                self.spark.stop()
            finally:
                self.spark = None
        self.procs.stop_all()


def _library_root() -> str:
    import nsq_spark

    return str(Path(nsq_spark.__file__).resolve().parent.parent)


def _executor_files(spark: Any, executors: int, module: str) -> set[str]:
    """The files (resolved) the executors import ``module`` from (four tasks per executor,
    so that each executor is very likely asked)."""
    def file_of(_: int) -> str:
        import importlib

        return str(importlib.import_module(module).__file__)

    where = spark.sparkContext.parallelize(range(executors * 4), executors * 4).map(
        file_of).collect()
    return {str(Path(w).resolve()) for w in where}


def _check_executors_import(spark: Any, library_root: str, executors: int) -> None:
    where = _executor_files(spark, executors, "nsq_spark")
    expected = {str(Path(library_root) / "nsq_spark" / "__init__.py")}
    if where != expected:
        raise RuntimeError(f"the executors import nsq_spark from {sorted(where)}, not from "
                           f"{library_root}: the two sides would measure different code; "
                           "run with PYTHONPATH set to the checkout under test")


def _register_pyrate(spark: Any, executors: int) -> None:
    """Registers ``pyrate`` in the session; the executors must import its module from
    the same file as this process (they unpickle the reader by reference to it)."""
    try:
        from bench import pyrate_source
    except ImportError as exc:
        raise RuntimeError(f"--with-python-floor: cannot import bench.pyrate_source ({exc}); "
                           "run from a checkout that has bench/pyrate_source.py") from None
    here = str(Path(pyrate_source.__file__).resolve())
    where = _executor_files(spark, executors, "bench.pyrate_source")
    if where != {here}:
        raise RuntimeError(f"the executors import bench.pyrate_source from {sorted(where)}, "
                           f"not from {here}: run from the checkout on PYTHONPATH")
    spark.dataSource.register(pyrate_source.PyRateDataSource)


def _progress_dicts(query: Any) -> list[dict[str, Any]]:
    return [p if isinstance(p, dict) else json.loads(p.json) for p in query.recentProgress]


class _Sink:
    """The ``foreachBatch`` function: collects the batch and stamps its rows."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.arrivals = Arrivals()

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.source == "nsq":
            table = df.select("body").toArrow()
            arrived_at = time.time()
            rows = [parse_body(b) for b in table.column(0).to_pylist()]
        else:
            table = df.selectExpr("value", "unix_micros(timestamp) AS ts_us").toArrow()
            arrived_at = time.time()
            rows = list(zip(table.column(0).to_pylist(),
                            (t / 1e6 for t in table.column(1).to_pylist())))
        self.arrivals.add(rows, arrived_at)


def _wait_running(query: Any, until: float, publisher: PacedPublisher | None = None) -> None:
    while time.time() < until:
        if not query.isActive or query.exception() is not None:
            raise RuntimeError(f"query stopped: {query.exception()}")
        if publisher is not None and publisher.error is not None:
            raise RuntimeError(f"publisher failed: {publisher.error!r}")
        time.sleep(min(0.2, max(0.0, until - time.time())))


def _enough(query: Any, sink: _Sink, start: float, batches: int) -> bool:
    """At least ``batches`` batches started at or after ``start`` have ended, and a row
    published (generated) then has arrived."""
    ended = [b for b in batch_timings(_progress_dicts(query)) if b.started >= start]
    return len(ended) >= batches and any(p >= start for p in sink.arrivals.published)


def run_config(spark: Any, source: str, rate: int, trigger: Trigger, args: Any,
               nsqd: Any, work: Path, index: int, warmup: float,
               seconds: float) -> dict[str, Any]:
    """One streaming query: ``warmup`` s unmeasured, then ``seconds`` measured, then
    (nsq) the publisher stops and the query runs until every message arrived."""
    sink = _Sink(source)
    label = f"{source}_{rate}_{trigger.label}".replace(".", "_")
    if source == "nsq":
        try:  # its path since 0.2.0; bench.ab runs this file against revisions before it
            from nsq_spark.spark._backlog import create_channel
        except ModuleNotFoundError as e:
            if e.name != "nsq_spark.spark._backlog":
                raise
            create_channel = importlib.import_module("nsq_spark.spark.backlog").create_channel

        topic, channel = f"lat{index}_{label}", "spark"
        create_channel(nsqd.http_address, topic, channel)
        reader = (spark.readStream.format("nsq")
                  .option("topic", topic).option("channel", channel)
                  .option("nsqdTcpAddresses", nsqd.tcp_address)
                  .option("nsqdHttpAddresses", nsqd.http_address)
                  .option("numPartitions", args.partitions)
                  .option("spoolPath", str(work / f"spool-{index}")))
        for key, value in args.source_options.items():
            reader = reader.option(key, value)
    else:  # rate, pyrate (bench/pyrate_source.py): the same options
        reader = (spark.readStream.format(source).option("rowsPerSecond", rate)
                  .option("numPartitions", args.partitions))
    writer = (reader.load().writeStream.foreachBatch(sink)
              .option("checkpointLocation", str(work / f"ckpt-{index}")))
    if trigger.processing_time is not None:
        writer = writer.trigger(processingTime=trigger.processing_time)
    query = writer.start()
    publisher = None
    try:
        if source == "nsq":
            publisher = PacedPublisher(nsqd.http_address, topic, rate, args.size)
            publisher.start()
            while math.isnan(publisher.started_at) and publisher.is_alive():
                time.sleep(0.001)
            begin = publisher.started_at
        else:
            begin = time.time()
        window = (begin + warmup, begin + warmup + seconds)
        _wait_running(query, window[1], publisher)
        if args.min_batches:
            # a loaded machine slows the batches, it does not owe a count by a time: the
            # window stays open until that many batches started in it have ended and rows
            # published in it arrived (--drain-timeout only catches a hang)
            until = time.time() + args.drain_timeout
            while not _enough(query, sink, window[0], args.min_batches) \
                    and time.time() < until:
                _wait_running(query, time.time() + 0.2, publisher)
            window = (window[0], max(window[1], time.time()))
        if publisher is not None:
            publisher.stop()
            publisher.join(30)
            if publisher.error is not None:
                raise RuntimeError(f"publisher failed: {publisher.error!r}")
            published = publisher.sent
            drain_until = time.time() + args.drain_timeout
            while len(sink.arrivals) < published and time.time() < drain_until:
                _wait_running(query, time.time() + 0.2)
    finally:
        if publisher is not None:
            publisher.stop()
        query.stop()
    if publisher is None:
        # the rate source (and pyrate) numbers its rows 0, 1, ...: what it generated is what the sink
        # received up to the highest number (a gap or repeat shows as missing or
        # duplicate). Counted once the query has stopped: a batch may still be arriving
        published = max(sink.arrivals.seqs, default=-1) + 1
    result = {"source": source, "rate": rate, "trigger": trigger.label,
              "warmup_s": warmup, "seconds": round(window[1] - window[0], 3),
              **summarize(sink.arrivals, published, batch_timings(_progress_dicts(query)),
                          window)}
    if publisher is not None:
        result["published_per_s"] = round(
            published / max(1e-9, publisher.stopped_at - publisher.started_at), 1)
    return result


def configurations(args: Any) -> Iterator[tuple[str, int, Trigger]]:
    """Per trigger: the rate baseline first, then pyrate, then nsq at each rate (the
    baselines next to the runs they are compared with)."""
    for trigger in args.triggers:
        if args.with_rate_source:
            yield "rate", args.rate_source_rate, trigger
        if args.with_python_floor:
            yield "pyrate", args.rate_source_rate, trigger
        for rate in args.rates:
            yield "nsq", rate, trigger


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def build_parser() -> argparse.ArgumentParser:
    def typed(parse: Any) -> Any:
        def conv(text: str) -> Any:
            try:
                return parse(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        return conv

    ap = argparse.ArgumentParser(prog="python -m bench.bench_spark_latency",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=typed(parse_rates), default=parse_rates("20,2000,20000"),
                    help="nsq publish rates, msg/s, comma-separated (default 20,2000,20000)")
    ap.add_argument("--triggers", type=typed(parse_triggers),
                    default=parse_triggers("1s,default"),
                    help="'default' and/or intervals such as 1s, 500ms (default 1s,default)")
    ap.add_argument("--seconds", type=float, default=20.0,
                    help="measured seconds per configuration, after the warm-up (default 20)")
    ap.add_argument("--warmup", type=float, default=5.0,
                    help="seconds per configuration before measuring (default 5)")
    ap.add_argument("--session-warmup", type=float, default=8.0,
                    help="seconds of an unmeasured nsq query before the first "
                         "configuration (default 8; 0: none)")
    ap.add_argument("--drain-timeout", type=float, default=30.0,
                    help="seconds to wait for the last messages after publishing stops "
                         "(and, with --min-batches, for those batches)")
    ap.add_argument("--min-batches", type=int, default=0,
                    help="keep measuring past --seconds until this many batches started in "
                         "the window have ended, at most --drain-timeout more (default 0: "
                         "exactly --seconds; the smoke test's 1 makes it independent of "
                         "the machine's speed)")
    ap.add_argument("--with-rate-source", action="store_true",
                    help="also run Spark's rate source per trigger (the baseline)")
    ap.add_argument("--with-python-floor", action="store_true",
                    help="also run pyrate per trigger: the rate source as a Python data "
                         "source (bench/pyrate_source.py), the floor of any Python source")
    ap.add_argument("--rate-source-rate", type=int, default=20,
                    help="rows/s of the rate and pyrate sources (default 20)")
    ap.add_argument("--partitions", type=int, default=2, help="numPartitions (default 2)")
    ap.add_argument("--workers", type=int, default=2,
                    help="standalone workers, one 1-core executor each (default 2)")
    ap.add_argument("--size", type=int, default=100, help="message body bytes (default 100)")
    ap.add_argument("--option", dest="source_options", action="append", default=[],
                    metavar="KEY=VALUE", help="an nsq source option (repeatable)")
    ap.add_argument("--mem-queue-size", type=int, default=None,
                    help="nsqd --mem-queue-size (default: nsqd's, 10000; a backlog beyond "
                         "it goes through nsqd's disk queue)")
    ap.add_argument("--json", metavar="PATH", help="also write every figure as JSON here")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        args.source_options = parse_source_options(args.source_options)
    except ValueError as exc:
        ap.error(str(exc))
    if args.seconds <= 0 or args.warmup < 0 or args.drain_timeout <= 0 \
            or args.session_warmup < 0:
        ap.error("--seconds and --drain-timeout must be positive, --warmup and "
                 "--session-warmup at least 0")
    if args.size < 40:
        ap.error("--size must be at least 40 bytes (sequence number and publish time)")
    if args.partitions < 1 or args.workers < 1:
        ap.error("--partitions and --workers must be at least 1")
    if args.min_batches < 0:
        ap.error("--min-batches must be at least 0")

    from nsq_spark.testing import NSQCluster

    library_root = _library_root()
    nsqd_flags = {} if args.mem_queue_size is None else {"mem_queue_size": args.mem_queue_size}
    started = time.time()
    print(f"library under test: {library_root}; load average at start: {_load()}",
          flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-spark-latency-") as tmp, \
            NSQCluster(nsqd=1, lookupd=0, **nsqd_flags) as nsq:
        work = Path(tmp)
        with StandaloneSpark(work / "cluster", args.workers, library_root) as cluster:
            spark = cluster.spark
            _check_executors_import(spark, library_root, args.workers)
            import nsq_spark.spark

            nsq_spark.spark.register(spark)
            if args.with_python_floor:
                _register_pyrate(spark, args.workers)
            if args.session_warmup:
                # the first query on a fresh cluster starts the executors' Python workers
                # and imports the library there: seconds, and not what is measured
                warm = run_config(spark, "nsq", 200, Trigger("default", None), args,
                                  nsq.nsqds[0], work, 0, 0.0, args.session_warmup)
                print(f"session warm-up (not measured): nsq 200/s, default trigger, "
                      f"{args.session_warmup:g} s, {warm['received']} of "
                      f"{warm['published']} received", flush=True)
            for i, (source, rate, trigger) in enumerate(configurations(args), start=1):
                result = run_config(spark, source, rate, trigger, args, nsq.nsqds[0],
                                    work, i, args.warmup, args.seconds)
                result["load_after"] = _load()
                results.append(result)
                print(json.dumps(result), flush=True)
    print(f"\nload average at end: {_load()}; {time.time() - started:.0f} s in all\n")
    print(markdown_table(results))
    for line in overhead_lines(results):
        print(f"\n{line}")
    bad = [r for r in results if not r["exactly_once"]]
    for r in results:
        if r["exactly_once"]:
            print(f"{r['source']} {r['rate']}/s {r['trigger']}: {r['received']:,} received "
                  f"of {r['published']:,} published, no duplicate, none missing")
        else:
            print(f"NOT EXACTLY ONCE: {r['source']} {r['rate']}/s {r['trigger']}: "
                  f"{r['duplicates']} duplicates, {r['missing']} missing, "
                  f"{r['unexpected']} unexpected of {r['published']:,} published")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results,
                                               "overheads": all_overheads(results)},
                                              indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
