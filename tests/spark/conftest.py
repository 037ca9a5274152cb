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


@pytest.fixture(autouse=True)
def _active_session(request):
    """The shared session is the JVM's active one for the test. Spark finds a Python data
    source only through the calling thread's active session (``DataSource.lookupDataSource``
    asks ``SparkSession.getActiveSession``), a JVM thread-local; when py4j gives this
    Python thread a new JVM thread (a connection re-made after an earlier test's
    interrupted call), it has none, and ``format("nsq")`` fails with
    DATA_SOURCE_NOT_FOUND although the session has the source (seen in full runs, never
    in a file run alone)."""
    if "spark" in request.fixturenames:
        session = request.getfixturevalue("spark")
        session._jvm.org.apache.spark.sql.SparkSession.setActiveSession(session._jsparkSession)
    yield


@pytest.fixture
def spool_dir():
    with tempfile.TemporaryDirectory(prefix="nsq-spark-spool-") as d:
        yield d
