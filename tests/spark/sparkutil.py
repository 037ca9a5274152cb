"""Helpers shared by the Spark tests and their child driver processes."""

from __future__ import annotations

import os
import sys


def spark_env() -> dict[str, str]:
    """Environment for Spark in this process and in child drivers (crash test)."""
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def build_session(app: str = "nsq-spark-tests", extra: dict[str, str] | None = None):
    """A local[2] SparkSession tuned for tests: UI off, few shuffle partitions."""
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master("local[2]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.driver.memory", "1g")
               .config("spark.python.worker.reuse", "true")
               .config("spark.sql.session.timeZone", "UTC"))
    for k, v in (extra or {}).items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
