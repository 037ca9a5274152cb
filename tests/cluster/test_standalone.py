"""The cluster tier: the Spark source where users run it.

A Spark standalone master and two workers (separate JVMs started from the installed
pyspark's ``spark-class``, 127.0.0.1, one core and 1 GiB each), the package installed
from its wheel for the workers' and the driver's Python (not this checkout), the spool on
an S3-compatible server (moto's server mode) reached by pyarrow's S3 filesystem, the
credentials handed to the executors with ``spark.executorEnv.*``. A streaming query
writes NSQ to Parquet, with no dedup in the query; one executor is SIGKILLed mid-stream,
once its log shows that a fetch task reused a cached Reader (``readerCache``): it holds
connected Readers, paused between batches, maybe with messages nsqd sent before it saw
RDY 0. Every body must arrive exactly once: nsqd redelivers what the killed executor had
spooled but not FINished, and what its cached Readers held (at once: their sockets close
with the process; else after ``msg_timeout``), and the source drops the redeliveries of
what it spooled (its redelivery index on the S3 spool). Everything started here is
stopped by pid.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from nsq_spark.testing import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.nsqd, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
N_MESSAGES = 20_000
S3_ENV = {"AWS_ACCESS_KEY_ID": "nsq-spark-test", "AWS_SECRET_ACCESS_KEY": "nsq-spark-test",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


def _wait_http(url: str, timeout: float, ok=lambda body: True) -> bytes:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body = resp.read()
            if ok(body):
                return body
            last = body[:200]
        except OSError as exc:
            last = exc
        time.sleep(0.3)
    raise TimeoutError(f"{url} not ready after {timeout}s: {last}")


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the direct children of ``pid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            if int(text[text.rindex(")") + 2:].split()[1]) != pid:
                continue
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        out.append((int(stat.parent.name), cmd))
    return out


class Procs:
    """Processes this test started; stopped by pid, children (executors) first."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "wb")
        p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=False)
        self.procs.append(p)
        return p

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                for child, _ in _children(p.pid):  # executors under a worker
                    try:
                        os.kill(child, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def _reused_a_reader(worker_dir: Path) -> bool:
    """An executor under ``worker_dir`` logged a fetch task that took a cached Reader
    (the fetch task's INFO line says "Reader reused")."""
    for log in glob.glob(str(worker_dir / "app-*" / "*" / "stderr")):
        with open(log, errors="replace") as f:
            if "Reader reused" in f.read():
                return True
    return False


@pytest.fixture
def workdir():
    with tempfile.TemporaryDirectory(prefix="nsq-cluster-") as d:
        yield Path(d)


def _install_wheel(workdir: Path) -> Path:
    """Build the wheel of this checkout and install it (no deps) into its own directory;
    returns a python wrapper whose sys.path has that install first."""
    dist, site, src = workdir / "dist", workdir / "site", workdir / "src"
    # from a clean copy: a build/ left in the checkout could carry stale modules into
    # the wheel, and the build leaves build/ and *.egg-info behind
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist),
                    str(src)], check=True, timeout=180)
    wheel = glob.glob(str(dist / "*.whl"))[0]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), wheel], check=True, timeout=120)
    wrapper = workdir / "python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


# msg_timeout 10 s (nsqd's default is 60 s): what the killed executor held comes back
# sooner, and the test waits 50 s less for it
@pytest.mark.nsq_cluster(nsqd=1, lookupd=1, msg_timeout="10s")
def test_standalone_cluster_executor_killed_mid_stream(nsq_cluster, workdir, monkeypatch):
    import pyarrow.dataset as ds

    import pyspark

    procs = Procs(workdir)
    t0 = time.monotonic()

    def phase(what: str) -> None:
        print(f"[cluster tier {time.monotonic() - t0:6.1f}s] {what}", flush=True)

    spark_home = os.path.dirname(pyspark.__file__)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    base_env.pop("PYTHONPATH", None)  # nothing of this checkout on the cluster's path
    base_env.update(SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1",
                    SPARK_LOG_DIR=str(workdir), SPARK_WORKER_DIR=str(workdir / "work"),
                    **S3_ENV)
    try:
        python = _install_wheel(workdir)
        phase("wheel built and installed")
        # -- S3-compatible spool -----------------------------------------------------------
        s3_port = free_port()
        procs.start("moto", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(s3_port)], base_env)
        _wait_http(f"http://127.0.0.1:{s3_port}/moto-api/", 60)
        from pyarrow import fs as pafs

        for k, v in S3_ENV.items():  # this process creates the bucket
            monkeypatch.setenv(k, v)
        pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{s3_port}", scheme="http",
                          region="us-east-1", allow_bucket_creation=True).create_dir("spool")
        spool = (f"s3://spool/nsq?endpoint_override=127.0.0.1:{s3_port}&scheme=http"
                 "&region=us-east-1")
        # -- standalone master and two workers ---------------------------------------------
        spark_class = os.path.join(spark_home, "bin", "spark-class")
        m_port, m_ui = free_port(), free_port()
        procs.start("master", [spark_class, "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(m_port),
                               "--webui-port", str(m_ui)], base_env)
        master_url = f"spark://127.0.0.1:{m_port}"
        workers = [procs.start(f"worker{i}", [
            spark_class, "org.apache.spark.deploy.worker.Worker", master_url,
            "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
            "--webui-port", str(free_port()), "--work-dir", str(workdir / f"work{i}")],
            base_env) for i in range(2)]
        _wait_http(f"http://127.0.0.1:{m_ui}/json/", 90,
                   lambda b: json.loads(b).get("aliveworkers", 0) >= 2)
        phase("master and 2 workers up")
        # -- data ----------------------------------------------------------------------------
        topic, channel = "cluster_tier", "spark"
        node = nsq_cluster.nsqds[0]
        published = [b"c-%06d" % i for i in range(N_MESSAGES)]
        sys.path.insert(0, str(HERE.parent / "spark"))
        from sparkutil import channel_counts, http_mpub

        http_mpub(node.http_address, topic, published)
        # -- the driver ------------------------------------------------------------------------
        stop_file = workdir / "stop"
        cfg = {"master": master_url, "python": str(python), "executor_env": S3_ENV,
               "topic": topic, "channel": channel, "spool": spool,
               "lookupd": ",".join(nsq_cluster.lookupd_http_addresses),
               "output": str(workdir / "out"), "checkpoint": str(workdir / "ckpt"),
               "max_per_trigger": 2000, "stop_file": str(stop_file), "max_seconds": 150}
        driver = subprocess.Popen([str(python), str(HERE / "cluster_driver.py"),
                                   json.dumps(cfg)],
                                  # pyspark takes the executors' Python from the driver's
                                  # PYSPARK_PYTHON (spark.pyspark.python is spark-submit's)
                                  env={**base_env, "PYSPARK_PYTHON": str(python)},
                                  cwd=str(workdir),
                                  stdout=subprocess.PIPE, stderr=open(workdir / "driver.log", "wb"),
                                  text=True)
        procs.procs.append(driver)
        first = driver.stdout.readline()
        assert first.startswith("EXECUTOR_NSQ_SPARK "), (first, (workdir / "driver.log").read_text()[-3000:])
        assert first.split()[1].startswith(str(workdir / "site")), first  # the wheel's copy
        phase("driver up, executors import " + first.split()[1])
        # -- kill one executor that holds cached Readers, mid-stream ------------------------
        deadline = time.monotonic() + 120
        killed = None
        while time.monotonic() < deadline and killed is None:
            c = channel_counts(node, topic, channel)
            # mid-stream: messages still queued (cached Readers stay subscribed after)
            if c["clients"] and 0 < c["depth"] < N_MESSAGES * 0.8:
                for i, w in enumerate(workers):
                    execs = [pid for pid, cmd in _children(w.pid)
                             if "CoarseGrainedExecutorBackend" in cmd]
                    if execs and _reused_a_reader(workdir / f"work{i}"):
                        os.kill(execs[0], signal.SIGKILL)
                        killed = execs[0]
                        break
            assert driver.poll() is None, (workdir / "driver.log").read_text()[-3000:]
            time.sleep(0.2)
        assert killed is not None, ("no executor that reused a cached Reader was fetching "
                                    "while messages were queued")
        phase(f"executor {killed} SIGKILLed")
        # -- drained: every message FINished; then the driver processes all and stops -------
        deadline = time.monotonic() + 120
        quiet_since = None
        while time.monotonic() < deadline:
            c = channel_counts(node, topic, channel)
            if c["depth"] == 0 and c["in_flight"] == 0 and c["deferred"] == 0:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 3:
                    break
            else:
                quiet_since = None
            assert driver.poll() is None, (workdir / "driver.log").read_text()[-3000:]
            time.sleep(0.3)
        phase("channel drained")
        stop_file.touch()
        out, _ = driver.communicate(timeout=120)
        assert "DONE" in out, (out, (workdir / "driver.log").read_text()[-3000:])
        phase("driver done")
        # -- every body exactly once, no dedup in the query ----------------------------
        # the files the sink committed (its log); a killed task may leave an empty one
        committed = [json.loads(line)["path"].removeprefix("file://")
                     for f in glob.glob(str(workdir / "out" / "_spark_metadata" / "*"))
                     for line in open(f).read().splitlines()[1:] if line.strip()]
        table = ds.dataset(sorted(set(committed)), format="parquet").to_table(
            columns=["id", "body"])
        ids, bodies = table.column("id").to_pylist(), table.column("body").to_pylist()
        count = collections.Counter(bodies)
        assert set(count) == set(published), f"{len(set(published) - set(count))} missing"
        twice = sorted(b for b, n in count.items() if n > 1)
        assert not twice, f"{len(twice)} bodies twice or more, e.g. {twice[:5]}"
        assert len(set(ids)) == len(ids) == N_MESSAGES
        # what the fetch tasks dropped, per the redelivery index on S3 (the progress's
        # count lags a batch behind)
        from nsq_spark.spark.seen import parse_index_name

        s3 = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{s3_port}", scheme="http",
                               region="us-east-1")
        index = [parse_index_name(i.base_name) for i in s3.get_file_info(
            pafs.FileSelector("spool/nsq", recursive=True)) if "/_seen/" in i.path]
        dropped = sum(f.dropped for f in index if f is not None)
        reported = [line for line in out.splitlines() if line.startswith("DROPPED ")]
        print(f"cluster tier: {len(bodies)} rows, no duplicate, executor {killed} killed, "
              f"redeliveries dropped by the source: {dropped} ({len(index)} index files; "
              f"progress said {reported})")
    finally:
        procs.stop_all()
