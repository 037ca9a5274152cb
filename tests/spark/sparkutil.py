"""Helpers shared by the Spark tests and their child driver processes."""

from __future__ import annotations

import os
import sys


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
    """Publish with nsqd's HTTP /mpub (binary mode), 5000 bodies per request."""
    import urllib.request

    for start in range(0, len(bodies), 5000):
        part = bodies[start:start + 5000]
        data = len(part).to_bytes(4, "big") + b"".join(
            len(b).to_bytes(4, "big") + b for b in part)
        req = urllib.request.Request(
            f"http://{http_address}/mpub?topic={topic}&binary=true", data=data)
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.read().strip() == b"OK"


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


def discovery_env() -> dict[str, str]:
    """Environment for a child driver so that pyspark's discovery sees ``pyspark_nsq``.

    pyspark finds ``pyspark_*`` modules with ``pkgutil.iter_modules()`` over ``sys.path``.
    A regular install (or ``pip install -e . --config-settings editable_mode=compat``)
    puts the module there; setuptools' default import-hook editable install does not, and
    then the module's directory goes on PYTHONPATH -- which is what such an install means.
    """
    import subprocess
    import tempfile

    probe = ("import pkgutil; print(any(m.name == 'pyspark_nsq' "
             "for m in pkgutil.iter_modules()))")
    with tempfile.TemporaryDirectory() as cwd:  # the child's view, not the repo root's
        seen = subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True,
                              text=True, timeout=60, env={k: v for k, v in os.environ.items()
                                                          if k != "PYTHONPATH"})
    if seen.stdout.strip() == "True":
        return {}
    import pyspark_nsq

    here = os.path.dirname(os.path.abspath(pyspark_nsq.__file__))
    old = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": here + (os.pathsep + old if old else "")}
