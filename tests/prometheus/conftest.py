"""The Prometheus tier: one exporter (nsq_spark.metrics.serve over a private registry)
and one real Prometheus scraping it every second, shared by the module's tests. Skipped,
with the reason, where the prometheus binary is not installed (scripts/install-services
installs Debian's package)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from promserver import PrometheusServer, prometheus_binary  # noqa: E402

RULES = HERE.parents[1] / "examples" / "prometheus" / "nsq-alerts.yml"


class Exporter:
    """A registry with an NSQCollector, served on a free loopback port."""

    def __init__(self) -> None:
        prometheus_client = pytest.importorskip("prometheus_client")
        from nsq_spark.metrics import NSQCollector, serve

        self.registry = prometheus_client.CollectorRegistry()
        self.collector = NSQCollector().register(self.registry)
        self.server = serve(0, registry=self.registry)

    @property
    def target(self) -> str:
        return f"{self.server.host}:{self.server.port}"


@pytest.fixture(scope="module")
def exporter() -> Iterator[Exporter]:
    exp = Exporter()
    try:
        yield exp
    finally:
        exp.server.close()


@pytest.fixture(scope="module")
def prom(exporter: Exporter) -> Iterator[PrometheusServer]:
    binary = prometheus_binary()
    if binary is None:
        pytest.skip("no prometheus binary (PATH, /usr/bin, $PROMETHEUS_BIN): "
                    "scripts/install-services installs Debian's package")
    with PrometheusServer(binary, [exporter.target], [RULES]) as server:
        yield server


@pytest.fixture(scope="module")
def spark_session():
    """local[2] for this module (the tests/spark session when this worker has one)."""
    pytest.importorskip("pyspark")
    sys.path.insert(0, str(HERE.parent / "spark"))
    from pyspark.sql import SparkSession
    from sparkutil import build_session

    existing = SparkSession.getActiveSession()
    session = build_session()
    import nsq_spark.spark

    nsq_spark.spark.register(session)
    yield session
    if existing is None:
        session.stop()
