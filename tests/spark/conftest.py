"""One real local Spark (local[2]) for the whole test run, shared by every Spark test."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import build_session  # noqa: E402


@pytest.fixture(scope="session")
def spark():
    session = build_session()
    import nsq_spark.spark

    # explicit registration: the shared session must work whatever the install mode;
    # discovery without it is tested in a fresh process (test_spark_discovery)
    nsq_spark.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def spool_dir():
    with tempfile.TemporaryDirectory(prefix="nsq-spark-spool-") as d:
        yield d
