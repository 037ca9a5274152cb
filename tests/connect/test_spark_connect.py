"""The ``nsq`` source through Spark Connect: a real Spark Connect server and a client
that cannot import nsq-spark.

The server is the installed pyspark's own (``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``; the connect jar ships in
pyspark's ``jars/``), bound to 127.0.0.1 on a free port, ``local[2]``, its Python workers
this interpreter with the checkout under test first on PYTHONPATH, so the server finds
the format by discovery (``pyspark_nsq``). The client (``connect_client.py``) runs with
``python -I`` and a sys.path that holds no nsq-spark, and reads a batch and a stream
(``Trigger.AvailableNow`` into the memory sink) from a real nsqd. Everything started here
is stopped by pid.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nsq_spark.testing import free_port

pytestmark = [pytest.mark.connect, pytest.mark.spark, pytest.mark.nsqd,
              pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# pyspark's connect extra: what the client needs beyond pyspark, pandas and pyarrow
CLIENT_DEPS = ("grpc", "grpc_status", "google.rpc", "zstandard")


def _missing_client_deps() -> list[str]:
    missing = []
    for mod in CLIENT_DEPS:
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(mod)
    return missing


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the Connect server exited:\n{log.read_text()[-4000:]}"
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"the Connect server did not listen on {port} within {timeout}s:\n"
                       f"{log.read_text()[-4000:]}")


@pytest.fixture
def connect_server():
    """A Spark Connect server on 127.0.0.1:<free port>; yields its sc:// address."""
    missing = _missing_client_deps()
    if missing:
        problem = (f"the Spark Connect client needs {missing} in {sys.executable} (the test "
                   "extra has them: pip install -e '.[all,test]')")
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_"))}
    env.update(SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory(prefix="nsq-connect-server-") as work:
        log = Path(work) / "server.log"
        proc = subprocess.Popen(
            [os.path.join(spark_home, "bin", "spark-submit"), "--class", SERVER_CLASS,
             "--name", "nsq-spark-connect-test", "--master", "local[2]",
             "--driver-memory", "1g",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.ui.enabled=false",
             "--conf", "spark.sql.shuffle.partitions=2",
             "--conf", f"spark.local.dir={work}"],
            env=env, cwd=work, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        try:
            _wait_port(port, proc, log, 120)
            yield f"sc://127.0.0.1:{port}", log
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_a_client_without_nsq_spark_reads_a_batch_and_a_stream(connect_server, nsq_cluster,
                                                                 tmp_path):
    remote, log = connect_server
    sys.path.insert(0, str(REPO / "tests" / "spark"))
    from sparkutil import http_mpub

    node, n = nsq_cluster.nsqds[0], 300
    http_mpub(node.http_address, "connect_batch", [b"cb-%05d" % i for i in range(n)])
    http_mpub(node.http_address, "connect_stream", [b"cs-%05d" % i for i in range(n)])
    cfg = {"remote": remote, "nsqd_tcp": node.tcp_address, "nsqd_http": node.http_address,
           "batch_topic": "connect_batch", "stream_topic": "connect_stream", "n": n,
           "spool": str(tmp_path / "spool"), "checkpoint": str(tmp_path / "ckpt")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_"))}
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-I", str(HERE / "connect_client.py"),
                          json.dumps(cfg)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=180)
    print(f"Spark Connect client: {time.monotonic() - t0:.1f} s\n{run.stdout}")
    assert run.returncode == 0 and "DONE" in run.stdout, (
        run.stdout, run.stderr[-4000:], log.read_text()[-4000:])
    assert "CLIENT_WITHOUT nsq_spark pyspark_nsq" in run.stdout
    assert "CHECK connect_batch_read " in run.stdout
    assert "CHECK connect_stream_read " in run.stdout
