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

A second query on the same cluster reads a topic replicated on three nsqds
(``Producer(replicas=2)``: every publish on two of them, with one publish id): one nsqd is
destroyed mid-stream (SIGKILL, its data directory removed: its copies are gone for good)
and an executor is SIGKILLed, as above. Every publish must be exactly one row, counted
by publish id: the copies on the other nsqds are read, the copies of one publish are one
row (:mod:`nsq_spark.spark._copies`), their tickets on the S3 spool.

The wheel, the S3 server, the master and the workers are started once for the module
(each test runs its own driver, an application of its own).
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

from nsq_spark.testing import free_port, wait_until

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


def _reused_a_reader(worker_dir: Path, before: set[str] = frozenset()) -> bool:
    """An executor under ``worker_dir`` (of an application not in ``before``) logged a
    fetch task that took a cached Reader (the fetch task's INFO line says "Reader
    reused")."""
    for log in glob.glob(str(worker_dir / "app-*" / "*" / "stderr")):
        if str(Path(log).parent.parent) in before:
            continue
        with open(log, errors="replace") as f:
            if "Reader reused" in f.read():
                return True
    return False


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


class Standalone:
    """The module's cluster: the wheel's python, the S3 spool, the master and workers."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs = Procs(workdir)
        self.t0 = time.monotonic()
        self.apps = 0

    def phase(self, what: str) -> None:
        print(f"[cluster tier {time.monotonic() - self.t0:6.1f}s] {what}", flush=True)

    def start(self) -> None:
        import pyspark

        workdir = self.workdir
        spark_home = os.path.dirname(pyspark.__file__)
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
        base_env.pop("PYTHONPATH", None)  # nothing of this checkout on the cluster's path
        base_env.update(SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1",
                        SPARK_LOG_DIR=str(workdir), SPARK_WORKER_DIR=str(workdir / "work"),
                        **S3_ENV)
        self.base_env = base_env
        self.python = _install_wheel(workdir)
        self.phase("wheel built and installed")
        # -- S3-compatible spool -------------------------------------------------------
        self.s3_port = s3_port = free_port()
        self.procs.start("moto", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                  "-p", str(s3_port)], base_env)
        _wait_http(f"http://127.0.0.1:{s3_port}/moto-api/", 60)
        self.s3().create_dir("spool")  # this process creates the bucket
        self.spool = (f"s3://spool/nsq?endpoint_override=127.0.0.1:{s3_port}&scheme=http"
                      "&region=us-east-1")
        # -- standalone master and two workers -----------------------------------------
        spark_class = os.path.join(spark_home, "bin", "spark-class")
        m_port, m_ui = free_port(), free_port()
        self.procs.start("master", [spark_class, "org.apache.spark.deploy.master.Master",
                                    "--host", "127.0.0.1", "--port", str(m_port),
                                    "--webui-port", str(m_ui)], base_env)
        self.master_url = f"spark://127.0.0.1:{m_port}"
        self.workers = [self.procs.start(f"worker{i}", [
            spark_class, "org.apache.spark.deploy.worker.Worker", self.master_url,
            "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
            "--webui-port", str(free_port()), "--work-dir", str(workdir / f"work{i}")],
            base_env) for i in range(2)]
        _wait_http(f"http://127.0.0.1:{m_ui}/json/", 90,
                   lambda b: json.loads(b).get("aliveworkers", 0) >= 2)
        self.phase("master and 2 workers up")

    def s3(self):
        from pyarrow import fs as pafs

        return pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{self.s3_port}",
                                 scheme="http", region="us-east-1",
                                 allow_bucket_creation=True)

    def driver(self, cfg: dict) -> subprocess.Popen:
        """A driver (an application of its own) with ``cfg`` over the module's defaults;
        it has printed where its executors import the package from."""
        self.apps += 1
        app = self.workdir / f"app{self.apps}"
        app.mkdir()
        cfg = {"master": self.master_url, "python": str(self.python),
               "executor_env": S3_ENV, "spool": self.spool,
               "output": str(app / "out"), "checkpoint": str(app / "ckpt"),
               "stop_file": str(app / "stop"), "max_seconds": 150, **cfg}
        self.app_dirs_before = {i: set(glob.glob(str(self.workdir / f"work{i}" / "app-*")))
                                for i in range(2)}
        driver = subprocess.Popen([str(self.python), str(HERE / "cluster_driver.py"),
                                   json.dumps(cfg)],
                                  # pyspark takes the executors' Python from the driver's
                                  # PYSPARK_PYTHON (spark.pyspark.python is spark-submit's)
                                  env={**self.base_env, "PYSPARK_PYTHON": str(self.python)},
                                  cwd=str(app), stdout=subprocess.PIPE,
                                  stderr=open(app / "driver.log", "wb"), text=True)
        self.procs.procs.append(driver)
        self.log = app / "driver.log"
        self.cfg = cfg
        first = driver.stdout.readline()
        assert first.startswith("EXECUTOR_NSQ_SPARK "), (first, self.log.read_text()[-3000:])
        assert first.split()[1].startswith(str(self.workdir / "site")), first  # the wheel's
        self.phase("driver up, executors import " + first.split()[1])
        return driver

    def kill_an_executor_that_reused_a_reader(self, driver, mid_stream) -> int:
        """SIGKILL an executor of the current application whose log shows a fetch task
        that took a cached Reader, once ``mid_stream()`` says so."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if mid_stream():
                for i, w in enumerate(self.workers):
                    execs = [pid for pid, cmd in _children(w.pid)
                             if "CoarseGrainedExecutorBackend" in cmd]
                    if execs and _reused_a_reader(self.workdir / f"work{i}",
                                                  self.app_dirs_before[i]):
                        os.kill(execs[0], signal.SIGKILL)
                        self.phase(f"executor {execs[0]} SIGKILLed")
                        return execs[0]
            assert driver.poll() is None, self.log.read_text()[-3000:]
            time.sleep(0.2)
        raise AssertionError("no executor that reused a cached Reader was fetching while "
                             "messages were queued")

    def finish(self, driver, drained) -> str:
        """Once ``drained()`` (every message FINished) for 3 s: the driver processes what
        is left and stops; returns its output."""
        deadline = time.monotonic() + 120
        quiet_since = None
        while time.monotonic() < deadline:
            if drained():
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 3:
                    break
            else:
                quiet_since = None
            assert driver.poll() is None, self.log.read_text()[-3000:]
            time.sleep(0.3)
        self.phase("channel drained")
        Path(self.cfg["stop_file"]).touch()
        out, _ = driver.communicate(timeout=120)
        assert "DONE" in out, (out, self.log.read_text()[-3000:])
        self.phase("driver done")
        return out

    def output(self, columns: list[str]):
        """The rows of the files the sink committed (its log; a killed task may leave an
        empty one)."""
        import pyarrow.dataset as ds

        out = self.cfg["output"]
        committed = [json.loads(line)["path"].removeprefix("file://")
                     for f in glob.glob(str(Path(out) / "_spark_metadata" / "*"))
                     for line in open(f).read().splitlines()[1:] if line.strip()]
        return ds.dataset(sorted(set(committed)), format="parquet").to_table(
            columns=columns)


@pytest.fixture(scope="module")
def standalone():
    saved = {k: os.environ.get(k) for k in S3_ENV}
    os.environ.update(S3_ENV)  # this process reads the S3 spool too
    with tempfile.TemporaryDirectory(prefix="nsq-cluster-") as d:
        cluster = Standalone(Path(d))
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.procs.stop_all()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# msg_timeout 10 s (nsqd's default is 60 s): what the killed executor held comes back
# sooner, and the test waits 50 s less for it
@pytest.mark.nsq_cluster(nsqd=1, lookupd=1, msg_timeout="10s")
def test_standalone_cluster_executor_killed_mid_stream(nsq_cluster, standalone):
    cluster = standalone
    topic, channel = "cluster_tier", "spark"
    node = nsq_cluster.nsqds[0]
    published = [b"c-%06d" % i for i in range(N_MESSAGES)]
    sys.path.insert(0, str(HERE.parent / "spark"))
    from sparkutil import channel_counts, http_mpub

    http_mpub(node.http_address, topic, published)
    driver = cluster.driver({"topic": topic, "channel": channel,
                             "lookupd": ",".join(nsq_cluster.lookupd_http_addresses),
                             "max_per_trigger": 2000})

    def mid_stream() -> bool:
        # messages still queued (cached Readers stay subscribed after)
        c = channel_counts(node, topic, channel)
        return bool(c["clients"]) and 0 < c["depth"] < N_MESSAGES * 0.8

    killed = cluster.kill_an_executor_that_reused_a_reader(driver, mid_stream)

    def drained() -> bool:
        c = channel_counts(node, topic, channel)
        return c["depth"] == 0 and c["in_flight"] == 0 and c["deferred"] == 0

    out = cluster.finish(driver, drained)
    # -- every body exactly once, no dedup in the query ----------------------------
    table = cluster.output(["id", "body"])
    ids, bodies = table.column("id").to_pylist(), table.column("body").to_pylist()
    count = collections.Counter(bodies)
    assert set(count) == set(published), f"{len(set(published) - set(count))} missing"
    twice = sorted(b for b, n in count.items() if n > 1)
    assert not twice, f"{len(twice)} bodies twice or more, e.g. {twice[:5]}"
    assert len(set(ids)) == len(ids) == N_MESSAGES
    # what the fetch tasks dropped, per the redelivery index on S3 (the progress's
    # count lags a batch behind)
    from pyarrow import fs as pafs

    from nsq_spark.spark._seen import parse_index_name

    index = [parse_index_name(i.base_name) for i in cluster.s3().get_file_info(
        pafs.FileSelector("spool/nsq", recursive=True)) if "/_seen/" in i.path]
    dropped = sum(f.dropped for f in index if f is not None)
    reported = [line for line in out.splitlines() if line.startswith("DROPPED ")]
    print(f"cluster tier: {len(bodies)} rows, no duplicate, executor {killed} killed, "
          f"redeliveries dropped by the source: {dropped} ({len(index)} index files; "
          f"progress said {reported})")


@pytest.mark.nsq_cluster(nsqd=3, lookupd=1, msg_timeout="10s")
def test_a_replicated_topic_with_an_nsqd_destroyed_and_an_executor_killed(
        nsq_cluster, standalone):
    from nsq_spark._publish.producer import Producer

    cluster = standalone
    topic, channel = "cluster_copies", "spark"
    sys.path.insert(0, str(HERE.parent / "spark"))
    from sparkutil import channel_counts

    def publish(bodies: list[bytes]) -> None:
        with Producer(nsq_cluster.nsqd_tcp_addresses, replicas=2) as p:
            for at in range(0, len(bodies), 100):  # one MPUB: one placement on two nsqds
                p.mpublish(topic, bodies[at:at + 100])
            assert p.stats()["under_replicated"] == 0

    first = [b"r-%06d" % i for i in range(6_000)]  # 12,000 messages on nsqd
    publish(first)
    driver = cluster.driver({"topic": topic, "channel": channel,
                             "lookupd": ",".join(nsq_cluster.lookupd_http_addresses),
                             "max_per_trigger": 2000})

    def queued(nodes) -> int:
        return sum(channel_counts(nsq_cluster.nsqds[i], topic, channel)["depth"]
                   for i in nodes)

    # -- mid-stream: nsqd 2 is destroyed, its copies with it ----------------------------
    wait_until(lambda: 0 < queued(range(3)) < 2 * len(first) * 0.8, 120,
               "the query to be reading", interval=0.2)
    nsq_cluster.kill(2)
    shutil.rmtree(nsq_cluster.nsqds[2].data_path)
    cluster.phase("nsqd 2 SIGKILLed and its data directory removed")
    second = [b"s-%06d" % i for i in range(3_000)]
    publish(second)  # on the two that are left: both hold every one of these

    def mid_stream() -> bool:
        c = [channel_counts(nsq_cluster.nsqds[i], topic, channel) for i in (0, 1)]
        return any(x["clients"] for x in c) and queued((0, 1)) > 0

    killed = cluster.kill_an_executor_that_reused_a_reader(driver, mid_stream)

    def drained() -> bool:
        c = [channel_counts(nsq_cluster.nsqds[i], topic, channel) for i in (0, 1)]
        return all(x["depth"] == 0 and x["in_flight"] == 0 and x["deferred"] == 0
                   for x in c)

    cluster.finish(driver, drained)
    # -- every publish exactly once, counted by publish id ----------------------------
    table = cluster.output(["body", "publish_id"])
    bodies, pids = table.column("body").to_pylist(), table.column("publish_id").to_pylist()
    published = first + second
    assert None not in pids, "a row without its publish id"
    by_pid = collections.Counter(pids)
    twice = [p for p, n in by_pid.items() if n > 1]
    assert not twice, f"{len(twice)} publishes are two rows or more"
    missing = set(published) - set(bodies)
    assert not missing, f"{len(missing)} of {len(published)} lost, e.g. {sorted(missing)[:5]}"
    assert len(bodies) == len(by_pid) == len(set(bodies)) == len(published)
    print(f"cluster tier, replicated: {len(bodies)} rows of {len(published)} publishes, "
          f"none twice; nsqd 2 destroyed, executor {killed} killed")
