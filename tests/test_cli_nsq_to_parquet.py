"""examples/nsq_to_parquet.py (the Spark helper's archiver, issue 7's nsq_to_file-like
example) end to end: real nsqd and nsqlookupd, real local Spark in a child process as a
user runs it, Parquet read back with pyarrow."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.nsqd, pytest.mark.slow, pytest.mark.timeout(240)]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def http_post(addr: str, path: str, body: bytes = b"") -> None:
    req = urllib.request.Request(f"http://{addr}{path}", data=body, method="POST")
    urllib.request.urlopen(req, timeout=5).read()


@pytest.mark.nsq_cluster(lookupd=1)
def test_nsq_to_parquet_archives_the_backlog(nsq_cluster, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    http = nsq_cluster.nsqd_http_addresses[0]
    http_post(http, "/topic/create?topic=archive")
    http_post(http, "/channel/create?topic=archive&channel=nsq_to_parquet")
    bodies = [b"event-%04d" % i for i in range(300)]
    http_post(http, "/mpub?topic=archive", b"\n".join(bodies))
    out = tmp_path / "out"
    # the example relies on pyspark's discovery of pyspark_nsq (sys.path entries only):
    # the package must be installed (regular, or editable with editable_mode=compat);
    # nothing is added to PYTHONPATH here, as nothing is for a user
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    r = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "nsq_to_parquet.py"),
         "--lookupd", nsq_cluster.lookupd_http_addresses[0], "--topic", "archive",
         "--channel", "nsq_to_parquet", "--out", str(out),
         "--checkpoint", str(tmp_path / "ckpt"), "--spool", str(tmp_path / "spool"),
         "--available-now"],
        capture_output=True, timeout=200, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    out_lines = r.stdout.decode().splitlines()  # it says what it did
    assert out_lines[0].startswith("archiving topic 'archive' (channel 'nsq_to_parquet')"), \
        out_lines
    assert out_lines[-1] == f"archived 300 messages in {len(out_lines) - 2} batches into {out}", \
        out_lines
    assert all(line.startswith("batch ") for line in out_lines[1:-1]), out_lines
    table = pq.read_table(str(out))
    assert sorted(table.column("body").to_pylist()) == bodies
    assert set(table.column_names) >= {"id", "body", "timestamp", "topic"}
    assert set(table.column("topic").to_pylist()) == {"archive"}
    # the channel is drained: every archived message was FINished
    stats = nsq_cluster.nsqds[0].stats("archive")
    (chan,) = [c for t in stats["topics"] for c in t["channels"]
               if c["channel_name"] == "nsq_to_parquet"]
    assert chan["depth"] == 0 and chan["in_flight_count"] == 0
