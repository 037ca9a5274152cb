"""The version tier: the ``nsq`` source on every supported pyspark, not only the main
venv's.

For each version in ``pyspark-versions.txt`` (the latest patch of each supported minor
version other than the main venv's), ``version_driver.py`` runs in one subprocess with
that version's cached venv python (``scripts/install-pyspark-versions``, called by ``make
setup``), the checkout under test first on PYTHONPATH: a batch read and write found by
discovery, a streaming read that fails a batch after it was spooled and restarts twice
(every body exactly once), ``Trigger.AvailableNow``, ``register()`` called after
discovery registered the source (idempotent), and the streaming write, or its
refusal naming the pyspark it needs. What each version supports:
:mod:`nsq_spark.spark._compat`.

A venv that cannot be built skips its test with the reason, unless ``CI`` is set: then
it fails, so a green CI run always ran the tier.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.versions, pytest.mark.spark, pytest.mark.nsqd,
              pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
INSTALL = REPO / "scripts" / "install-pyspark-versions"
VERSIONS = [v.strip() for v in (HERE / "pyspark-versions.txt").read_text().splitlines()
            if v.strip() and not v.startswith("#")]


def venv_python(version: str) -> str:
    """The version's venv python, built if missing (seconds when cached)."""
    run = subprocess.run([sys.executable, str(INSTALL)], capture_output=True, text=True,
                         timeout=1800)
    pythons = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    if run.returncode == 0 and version in pythons:
        return pythons[version]
    problem = (f"no venv for pyspark {version}: scripts/install-pyspark-versions exited "
               f"{run.returncode}: {run.stderr[-2000:]}")
    if os.environ.get("CI"):
        pytest.fail(problem)
    pytest.skip(problem)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_source_on_pyspark(version, nsq_cluster):
    python = venv_python(version)
    node = nsq_cluster.nsqds[0]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK", "SPARK_", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(REPO)  # this checkout, for the driver and Spark's workers
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"nsq-versions-{version}-") as work:
        cfg = {"nsqd_tcp": node.tcp_address, "nsqd_http": node.http_address,
               "workdir": work}
        run = subprocess.run([python, str(HERE / "version_driver.py"), json.dumps(cfg)],
                             cwd=work, env=env, capture_output=True, text=True, timeout=220)
    out = run.stdout
    print(f"pyspark {version}: {time.monotonic() - t0:.1f} s\n{out}")
    assert run.returncode == 0 and "DONE" in out, (out, run.stderr[-4000:])
    assert f"PYSPARK {version} " in out, out
    assert f"NSQ_SPARK {REPO / 'nsq_spark'}" in out, out  # the checkout, not a stale copy
    for name in ("batch_read", "batch_write", "register_idempotent", "stream_failed_batch",
                 "stream_restart_replays", "stream_available_now"):
        assert f"CHECK {name} " in out, out
    assert ("CHECK stream_write " in out) or ("CHECK stream_write_refused " in out), out
