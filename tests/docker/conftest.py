"""The docker tier: NSQ in containers on a real Docker engine (``DOCKER_HOST``).

Every test here gets the ``docker`` marker, and (unless it is a ``unit`` test, which needs
no engine) is skipped, with the reason printed in the summary, when no engine answers (``scripts/with-docker`` starts a private one; without root
or dockerd it says why and the tier skips). At the end the tier fails if any container or
volume the harness labelled for this test process is left on the engine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from nsq_spark import testing

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))            # reader_helpers
sys.path.insert(0, str(HERE.parent / "spark"))  # sparkutil


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    mine = [item for item in items if Path(str(item.fspath)).resolve().is_relative_to(HERE)]
    if not mine:
        return
    problem = testing.docker_engine_problem()
    for item in mine:
        item.add_marker(pytest.mark.docker)
        if problem and item.get_closest_marker("unit") is None:  # unit: needs no engine
            item.add_marker(pytest.mark.skip(reason=f"docker tier: {problem}"))


@pytest.fixture(autouse=True)
def nothing_left_behind(request: Any) -> Iterator[None]:
    """After each docker test: no container or volume of this test process remains."""
    yield
    if request.node.get_closest_marker("unit") is not None:
        return  # starts nothing, and may run with no engine
    left = testing.docker_leftovers()
    assert not left, f"the harness left these on the Docker engine: {left}"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The suite's shared local[2] session (tests/spark builds the same one)."""
    from sparkutil import build_session

    import nsq_spark.spark

    session = build_session()
    nsq_spark.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def spool_dir(tmp_path: Path) -> str:
    path = tmp_path / "spool"
    path.mkdir()
    return os.fspath(path)
