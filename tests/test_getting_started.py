"""The getting-started page (docs/getting-started.md) runs as a new user runs it: its
blocks in their order, in one directory, from a venv that is NOT activated.

``venv/bin/...`` in the page is the suite's own venv (``sys.executable``'s directory),
called by its path as the page does; the environment is a user's who never activated it
(:func:`test_docs_blocks.unactivated_env`: no ``VIRTUAL_ENV``, ``PYSPARK_PYTHON`` unset,
and a ``python3`` first on the PATH with neither nsq-spark nor pyspark, so a Spark worker
that ran it would fail the query). The page's server block starts the nsqd and nsqlookupd
the later blocks use, on free ports put in place of the page's 4150/4151/4160/4161, and
they are stopped at the end (the whole process group).

What must come out: the Producer's messages read back by the Reader on channel ``first``
and, at the first try, shown by the Spark query on channel ``spark`` (the page creates
both channels before it publishes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from nsq_spark.testing import free_port
from test_docs_blocks import DOCS, _substitute, page_blocks, spark_paths, unactivated_env

pytestmark = [pytest.mark.nsqd, pytest.mark.spark, pytest.mark.timeout(420)]

PAGE = DOCS / "getting-started.md"
RUN_TIMEOUT = 60.0
RUN_TIMEOUT_SPARK = 240.0  # a JVM's start and a query, on 2 cores
SERVERS_UP = 90.0          # install-nsq (cached: a second; built once with Go: ~30 s)


def _ping(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/ping", timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _group_alive(pgid: int) -> list[str]:
    """The processes of process group ``pgid`` (servers outlive the shell that started
    them)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(text[text.index("(") + 1:text.rindex(")")])
    return alive


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _group_alive(proc.pid):
            break
    proc.wait(timeout=10)
    assert _group_alive(proc.pid) == [], "the page's servers did not stop"


def test_the_page_has_the_steps_a_new_user_takes():
    blocks = [b for b in page_blocks(PAGE.read_text(), "docs/getting-started.md")]
    runnable = [b for b in blocks if b.fragment is None]
    assert [(b.lang, b.servers, b.spark) for b in runnable] == [
        ("sh", True, False),        # start nsqlookupd and nsqd
        ("python", False, False),   # create the channels
        ("python", False, False),   # publish
        ("python", False, False),   # a first Reader
        ("python", False, True)]    # a first Spark query
    assert blocks[0].fragment and "pip install" in blocks[0].code  # the install step
    assert "venv/bin/nsq-spark install-nsq" in runnable[0].code
    channels, publish = runnable[1].code, runnable[2].code
    assert 'create_channel("events", "first")' in channels
    assert 'create_channel("events", "spark")' in channels
    assert "publish(" in publish


@pytest.mark.timeout(420)
def test_the_getting_started_page_runs_in_order_from_a_venv_not_activated(tmp_path):
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    blocks = [b for b in page_blocks(PAGE.read_text(), "docs/getting-started.md")
              if b.fragment is None]
    venv_bin = Path(sys.executable).parent
    mapping = {f"127.0.0.1:{page_port}": f"127.0.0.1:{free_port()}"
               for page_port in (4150, 4151, 4160, 4161)}
    env = unactivated_env(tmp_path)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    servers: subprocess.Popen[bytes] | None = None
    outputs: list[bytes] = []
    try:
        for n, block in enumerate(blocks):
            code = _substitute(block.code, mapping).replace("venv/bin/", f"{venv_bin}/")
            if block.spark:
                code = spark_paths(code, tmp_path)
            if block.servers:
                # the page leaves them running; `wait` keeps the shell as their parent
                servers = subprocess.Popen(
                    ["bash", "-euo", "pipefail", "-c", code + "\nwait\n"], cwd=workdir,
                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    start_new_session=True)
                http = [mapping["127.0.0.1:4151"], mapping["127.0.0.1:4161"]]
                deadline = time.monotonic() + SERVERS_UP
                while not all(map(_ping, http)):
                    assert servers.poll() is None, \
                        f"{block.where}: the servers block exited {servers.returncode}"
                    assert time.monotonic() < deadline, f"{block.where}: no /ping answer"
                    time.sleep(0.2)
                outputs.append(b"")
                continue
            script = workdir / f"block{n}.py"
            script.write_text(code)
            # as the page says to run it: the venv's python by its path
            run = subprocess.run([str(venv_bin / "python"), script.name], cwd=workdir,
                                 env=env, capture_output=True,
                                 timeout=RUN_TIMEOUT_SPARK if block.spark else RUN_TIMEOUT)
            report = (f"{block.where} ({block.section}) exited {run.returncode}\n"
                      f"--- code as run:\n{code}\n--- stdout:\n"
                      f"{run.stdout.decode(errors='replace')}\n--- stderr:\n"
                      f"{run.stderr.decode(errors='replace')[-6000:]}")
            assert run.returncode == 0, report
            assert b"Traceback" not in run.stderr, report
            outputs.append(run.stdout)
    finally:
        if servers is not None:
            _stop_group(servers)
    _, _, published, reader, spark = outputs
    assert b"published" in published
    # the Reader on channel "first": each message once (NSQ does not promise the order)
    assert sorted(reader.splitlines()) == [b"b'a'", b"b'b'", b"b'hello'"], reader
    # the Spark query on channel "spark", at the first try: one batch with the three rows
    assert b"Batch: 0" in spark, spark
    rows = [line for line in spark.splitlines() if line.startswith(b"|")][1:]  # no header
    assert sorted(r.split(b"|")[1].strip() for r in rows) == [b"a", b"b", b"hello"], spark
