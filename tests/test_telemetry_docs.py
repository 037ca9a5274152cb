"""docs/opentelemetry.md's code blocks run as written, the way README blocks run
(tests/test_readme.py's extractor, address substitution and command line), against a
fresh cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("markdown_it")
pytest.importorskip("opentelemetry.sdk")

from test_readme import _addresses, _command, _substitute, readme_blocks  # noqa: E402

PAGE = Path(__file__).resolve().parent.parent / "docs" / "opentelemetry.md"
BLOCKS = readme_blocks(PAGE.read_text())


@pytest.mark.unit
def test_the_page_has_runnable_blocks_and_says_why_the_others_are_fragments():
    assert len([b for b in BLOCKS if b.fragment is None]) >= 2
    assert all(len(b.fragment) > 10 for b in BLOCKS if b.fragment is not None)


@pytest.mark.nsqd
@pytest.mark.timeout(120)
@pytest.mark.nsq_cluster(nsqd=2, lookupd=1)
@pytest.mark.parametrize("block", [
    pytest.param(b, id=b.id, marks=[pytest.mark.skip(
        reason=f"line {b.line} is a fragment: {b.fragment}")] if b.fragment else [])
    for b in BLOCKS])
def test_page_block_runs(block, nsq_cluster, request, tmp_path):
    code = _substitute(block.code, _addresses(block, nsq_cluster, request))
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    repo = str(PAGE.parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [repo, *filter(None, [os.environ.get("PYTHONPATH")])]), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(_command(block, code, workdir), cwd=workdir, env=env,
                          capture_output=True, timeout=60)
    report = (f"docs/opentelemetry.md line {block.line} exited {proc.returncode}\n"
              f"--- stdout:\n{proc.stdout.decode(errors='replace')}\n"
              f"--- stderr:\n{proc.stderr.decode(errors='replace')}")
    assert proc.returncode == 0, report
    assert b"Traceback" not in proc.stderr, report
