"""docs/discovery.md's code blocks run as written, by tests/test_readme.py's machinery (a
fresh cluster of two nsqd and one nsqlookupd, the example addresses replaced). When the
docs suite runs every page this way, this file can go."""

from __future__ import annotations

from pathlib import Path

import pytest

import test_readme as readme
from nsq_spark.testing import NSQCluster
from test_readme import Block, readme_blocks

PAGE = Path(__file__).resolve().parent.parent / "docs" / "discovery.md"
BLOCKS = readme_blocks(PAGE.read_text())


@pytest.mark.unit
def test_the_page_has_runnable_blocks_in_every_section_with_code() -> None:
    assert PAGE.read_text().startswith("# ")
    runnable = [b for b in BLOCKS if b.fragment is None]
    assert len(runnable) >= 4 and {b.lang for b in runnable} == {"python"}


@pytest.mark.nsqd
@pytest.mark.timeout(120)
@pytest.mark.nsq_cluster(nsqd=2, lookupd=1)
@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS
                                   if b.fragment is None])
def test_discovery_page_block_runs(block: Block, nsq_cluster: NSQCluster,
                                   request: pytest.FixtureRequest, tmp_path: Path) -> None:
    readme.test_readme_block_runs(block, nsq_cluster, request, tmp_path)
