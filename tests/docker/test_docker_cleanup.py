"""After a failed test the fixture still removes its containers, and prints their logs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

INNER = '''
import pytest
from nsq_spark import testing

seen = {}

@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_a_fails(docker_nsq_cluster):
    seen["id"] = docker_nsq_cluster.docker.id
    assert testing.docker_leftovers() != []
    assert False, "fails on purpose"

def test_b_nothing_left_by_the_failed_test():
    # same process, before any atexit clean-up: the fixture's finalizer did it
    assert seen["id"] and testing.docker_leftovers() == []
'''


def test_fixture_removes_containers_of_a_failed_test_and_prints_their_logs(tmp_path):
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_inner.py"],
        cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
    assert "fails on purpose" in out and "NSQ process logs" in out, out
    assert "--- container nsq-spark-" in out, out  # the containers' own output
