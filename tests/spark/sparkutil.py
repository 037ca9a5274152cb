"""Helpers shared by the Spark tests and their child driver processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any


def spark_env() -> dict[str, str]:
    """Environment for Spark in this process and in child drivers (crash test)."""
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def build_session(app: str = "nsq-spark-tests", extra: dict[str, str] | None = None,
                  master: str = "local[2]"):
    """A local[2] SparkSession tuned for tests: UI off, few shuffle partitions."""
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.driver.memory", "1g")
               .config("spark.python.worker.reuse", "true")
               .config("spark.sql.session.timeZone", "UTC"))
    for k, v in (extra or {}).items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def http_mpub(http_address: str, topic: str, bodies: list[bytes]) -> None:
    """Publish with nsqd's HTTP /mpub (binary mode), 5000 bodies per request: the plugin's
    :func:`nsq_spark.testing.publish`, under the name these tests use."""
    from nsq_spark.testing import publish

    publish(http_address, topic, list(bodies))


def channel_counts(node, topic: str, channel: str) -> dict[str, int]:
    """depth / in_flight / deferred / clients of a channel on one nsqd (0 if absent)."""
    out = {"depth": 0, "in_flight": 0, "deferred": 0, "clients": 0, "topic_depth": 0}
    for t in node.stats(topic).get("topics", []):
        if t["topic_name"] != topic:
            continue
        out["topic_depth"] = t["depth"]
        for c in t.get("channels", []):
            if c["channel_name"] == channel:
                out.update(depth=c["depth"], in_flight=c["in_flight_count"],
                           deferred=c["deferred_count"], clients=len(c.get("clients") or []))
    return out


DISCOVERY_FIX = (
    "install nsq-spark into this interpreter (pip install '.[spark]'), or for development "
    "pip install -e '.[all,test]' --config-settings editable_mode=compat (what `make setup` "
    "does); setuptools' default import-hook editable install hides pyspark_nsq from "
    "pyspark's discovery, which lists the modules on sys.path (pkgutil.iter_modules)")


def discovery_problem() -> str | None:
    """None if a fresh process, started outside the repo with this environment, sees
    ``pyspark_nsq`` as pyspark's discovery does; otherwise what is wrong and the fix.

    Nothing is patched: a child driver gets exactly the environment a user's would.
    """
    import subprocess
    import tempfile

    probe = ("import pkgutil; print(any(m.name == 'pyspark_nsq' "
             "for m in pkgutil.iter_modules()))")
    with tempfile.TemporaryDirectory() as cwd:  # the child's view, not the repo root's
        seen = subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True,
                              text=True, timeout=60)
    if seen.stdout.strip() == "True":
        return None
    return (f"{sys.executable} does not see the top-level module pyspark_nsq from a fresh "
            f"process outside the repo (probe said {seen.stdout.strip() or seen.stderr[-500:]!r}), "
            f"so spark.readStream.format('nsq') cannot resolve without a register call. "
            f"Fix: {DISCOVERY_FIX}")


def print_dropped(query: Any) -> None:
    """Print ``DROPPED n``: the redeliveries the source dropped, as its last report in the
    query's progress (``latestOffset``) says, counted since this driver started."""
    reports = []
    for progress in query.recentProgress:
        for source in json.loads(progress.json).get("sources") or []:
            latest = source.get("latestOffset")  # an object in the progress's JSON
            if latest:
                reports.append(json.loads(latest) if isinstance(latest, str) else latest)
    if reports:
        print(f"DROPPED {reports[-1].get('redeliveriesDropped')}", flush=True)


class ChildDriver:
    """A Spark driver script of this folder run as a child in its own process group (its
    JVM and Python workers with it, so that :meth:`kill` takes them all); its stdout and
    stderr lines are collected by threads, each stdout line handed to :meth:`on_line`."""

    def __init__(self, script: str, cfg: dict[str, Any]) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(here, script), json.dumps(cfg)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **spark_env()},  # the driver finds the source by discovery
            cwd=cfg["workdir"], start_new_session=True)
        self.lines: list[str] = []
        self.err: list[str] = []
        for stream, sink, each in ((self.proc.stdout, self.lines, self.on_line),
                                   (self.proc.stderr, self.err, None)):
            threading.Thread(target=self._pump, args=(stream, sink, each), daemon=True).start()

    @staticmethod
    def _pump(stream: Any, sink: list[str], each: Any) -> None:
        for line in stream:
            sink.append(line.rstrip("\n"))
            if each is not None:
                each(line)

    def on_line(self, line: str) -> None:
        """Called with each stdout line as it arrives."""

    def wait_line(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.lines if line.startswith(prefix)]
            if found:
                return found[0]
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, f"no {prefix!r}: {self.output()}"
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the driver with its whole process group (JVM, Python workers)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"driver did not finish in {timeout}s: {self.output()}")

    def output(self) -> str:
        return "\n".join(self.lines[-20:] + [e for e in self.err
                                             if "Error" in e or "error" in e][-30:])


def read_deduplicated(runner: Any, cluster: Any, topic: str, redis_url: str, expect: int,
                      channel: str = "downstream") -> tuple[list[bytes], int]:
    """A consumer downstream of a sink: a Reader deduplicating by publish id in Redis (an
    exact store a group of consumers shares; the in-process filter may forget a key
    another overwrote, and let a copy through). The bodies its handler got, each with
    its envelope opened, and the copies it dropped, once every message is answered."""
    from nsq_spark.dedup import RedisDeduplicator

    handled: list[bytes] = []

    def handle(message: Any) -> bool:
        assert message.publish_id is not None  # the envelope was opened
        handled.append(bytes(message.body))
        return True

    # msg_timeout 5 s: a copy that arrives while its original is claimed and not yet
    # committed is requeued for what is left of that claim's lease (the msg_timeout)
    reader = runner.start(topic, channel, handle,
                          nsqd_tcp_addresses=cluster.nsqd_tcp_addresses,
                          dedup=RedisDeduplicator(redis_url, ttl=600),
                          dedup_key="publish_id", max_in_flight=500, msg_timeout=5)
    try:
        def left() -> int:  # every message answered: handled, or dropped as a copy
            return sum(sum(n.channel_stats(topic, channel).get(k, 1) for k in
                           ("depth", "in_flight_count", "deferred_count"))
                       for n in cluster.nsqds)

        deadline = time.monotonic() + 60
        while not (len(handled) >= expect and left() == 0):
            assert time.monotonic() < deadline, f"{len(handled)} of {expect} handled"
            time.sleep(0.05)
        time.sleep(0.5)  # nothing more arrives
        assert left() == 0
        return list(handled), reader.duplicates
    finally:
        runner.stop(reader)
