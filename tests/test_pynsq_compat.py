"""A pynsq program runs unchanged on nsq_spark (``import nsq_spark as nsq``): the example
examples/pynsq_style_reader.py, run as a real process against real nsqd/nsqlookupd, and the
same source run on pynsq itself (proving it is a pynsq program). SIGTERM closes cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from nsq_spark.testing import publish, wait_until
import pytest


pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(90)]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pynsq_style_reader.py"


def _create_channels(http: str, topic: str) -> None:
    # a channel created after the publish would miss the backlog (the first one takes it)
    for path in (f"topic/create?topic={topic}", f"channel/create?topic={topic}&channel=print",
                 f"channel/create?topic={topic}&channel=async"):
        urllib.request.urlopen(urllib.request.Request(f"http://{http}/{path}", method="POST"),
                               timeout=5).read()


def _run_program(source: str, tmp_path: Path, cluster, topic: str, expect: set[str]):
    script = tmp_path / "prog.py"
    script.write_text(source)
    env = {**os.environ, "TOPIC": topic, "LOOKUPD": ",".join(cluster.lookupd_http_addresses),
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                              daemon=True)
    reader.start()
    try:
        wait_until(lambda: expect <= {ln.strip() for ln in lines}, 30, "all bodies printed",
                   interval=0.05)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    return code, [ln.strip() for ln in lines], proc.stderr.read()


def test_pynsq_program_runs_unchanged_and_stops_cleanly(nsq_cluster, tmp_path):
    topic = "compat"
    sent = [f"e{i}" for i in range(200)]
    _create_channels(nsq_cluster.nsqd_http_addresses[0], topic)
    publish(nsq_cluster.nsqd_http_addresses[0], topic, [s.encode() for s in sent])
    expect = {f"print:{s}" for s in sent} | {f"async:{s}" for s in sent}
    code, lines, err = _run_program(EXAMPLE.read_text(), tmp_path, nsq_cluster, topic, expect)
    assert code == 0, err
    assert "stopped cleanly" in err
    assert sorted(lines) == sorted(expect)  # each once: nothing requeued or redelivered
    for ch in ("print", "async"):
        c = nsq_cluster.nsqds[0].channel_stats(topic, ch)
        assert c["depth"] == 0 and c["in_flight_count"] == 0 and c["timeout_count"] == 0
        assert c["client_count"] == 0  # closed (CLS + socket close) before exiting


def test_the_example_is_a_real_pynsq_program(nsq_cluster, tmp_path):
    pytest.importorskip("nsq")
    source = EXAMPLE.read_text()
    assert "import nsq_spark as nsq  # with pynsq: import nsq" in source
    source = source.replace("import nsq_spark as nsq  # with pynsq: import nsq", "import nsq")
    topic = "compat_pynsq"
    sent = [f"p{i}" for i in range(50)]
    _create_channels(nsq_cluster.nsqd_http_addresses[0], topic)
    publish(nsq_cluster.nsqd_http_addresses[0], topic, [s.encode() for s in sent])
    expect = {f"print:{s}" for s in sent} | {f"async:{s}" for s in sent}
    code, lines, err = _run_program(source, tmp_path, nsq_cluster, topic, expect)
    assert expect <= set(lines), err
